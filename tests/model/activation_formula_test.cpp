// Activation memory per layer against the published formulas (Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models", Table 2), measured as
// what the model really allocates for its saved activations (Transformer::activation_bytes,
// the CPU backend's arenas) on one rank of each layout.
//
// Table 2, bytes per layer with 16-bit activations, s = sequence, b = micro-batch, h =
// hidden, a = heads, t = tensor-parallel size:
//   no parallelism                  sbh (34 + 5as/h)
//   tensor parallel                 sbh (10 + 24/t + 5as/(ht))
//   tensor + sequence parallel      sbh/t (34 + 5as/h)
//   selective recompute             the 5as/h term gone (also with tp, sp)
//   full recompute                  2sbh (the layer input)
// Adapted to Trident, which has no dropout and keeps every other tensor the paper counts:
// - the paper's 34 holds two 1-byte dropout masks (sbh each: attention output, MLP
//   output) and its 10 the same two: 32 and 8 here. Of 5as/h, the softmax dropout mask
//   (as/h) and the dropout output (2as/h) are absent: the softmax output (2as/h) remains.
// - element sizes: the paper's 2-byte elements become the compute dtype's (4 fp32, 2 bf16),
//   and the CPU backend keeps the softmax probabilities in f32 (Ops::attention_state_bytes).
// - not in the paper: the norms' mean and rstd (f32, 4 per token), under 1% here.
// So, with e = bytes per element, per layer: sbh (16e [4e + 12e/t without sp]) + 4 a s^2 b
// / t; selective drops the last term; full is sbh e (/t with sp).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "kernels/ops.h"
#include "model/transformer.h"

namespace trident {
namespace {

TransformerConfig gpt2_model(int n_layers) {
  TransformerConfig c;
  c.arch = Arch::kGpt2;  // MHA, d_ff = 4h: the paper's block
  c.vocab_size = 256;
  c.seq_len = 128;
  c.n_layers = n_layers;
  c.n_heads = 8;
  c.d_model = 256;
  c.finalize();
  return c;
}

constexpr int kMicroBatch = 2;

// Saved activation bytes per layer of one rank: the difference of two depths (the
// globals, logits and the head's input cancel).
double measured_per_layer(Ops& ops, int tp, bool sp, Recompute r, DType dtype) {
  double bytes[2];
  const int depths[2] = {2, 4};
  for (int i = 0; i < 2; ++i) {
    ModelPartition part;
    part.tp_size = tp;
    part.sequence_parallel = sp;
    // tp > 1 without a communicator: a planning-only group (sizes only, no collective).
    Transformer model(gpt2_model(depths[i]), ops, part, nullptr, nullptr, kMicroBatch, 1,
                      dtype, r);
    bytes[i] = static_cast<double>(model.activation_bytes());
  }
  return (bytes[1] - bytes[0]) / (depths[1] - depths[0]);
}

double formula_per_layer(int tp, bool sp, Recompute r, DType dtype) {
  const TransformerConfig c = gpt2_model(1);
  const double s = c.seq_len, b = kMicroBatch, h = c.d_model, a = c.n_heads, t = tp;
  const double e = dtype_size(dtype), sbh = s * b * h;
  if (r == Recompute::kFull) return sbh * e / (sp ? t : 1);
  const double attention = r == Recompute::kSelective ? 0 : 4 * a * s * s * b / t;
  const double rest = sp ? sbh * 16 * e / t : sbh * (4 * e + 12 * e / t);
  return rest + attention;
}

TEST(ActivationFormula, PerLayerBytesFollowKorthikantiTable2) {
  auto ops = make_cpu_ops(1);
  int checked = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int tp : {1, 2, 4}) {
      for (bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          const std::string name = std::string(dtype_name(dtype)) + " tp " +
                                   std::to_string(tp) + (sp ? " sp " : " ") + recompute_name(r);
          const double got = measured_per_layer(*ops, tp, sp, r, dtype);
          const double want = formula_per_layer(tp, sp, r, dtype);
          std::printf("%-28s measured %10.0f  formula %10.0f  (%+.2f%%)\n", name.c_str(), got,
                      want, 100 * (got - want) / want);
          EXPECT_NEAR(got, want, 0.10 * want) << name;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 5 * 3);
}

// Sequence parallelism divides every saved tensor by tp (the paper's point): the
// per-layer bytes at tp 4 with it are those without tensor parallelism, over 4.
TEST(ActivationFormula, SequenceParallelDividesEveryLayerTensorByTp) {
  auto ops = make_cpu_ops(1);
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const double one = measured_per_layer(*ops, 1, false, r, DType::kF32);
    const double sp4 = measured_per_layer(*ops, 4, true, r, DType::kF32);
    EXPECT_NEAR(sp4, one / 4, one * 0.005) << recompute_name(r);
  }
}

}  // namespace
}  // namespace trident
