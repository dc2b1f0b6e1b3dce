// The q/k/v projection of a RoPE family runs as one GEMM against the three weights
// stacked in the store, its rows split into q, k and v as RoPE rotates them
// (Ops::qkv_split), and backward merges dq, dk and dv for one input-gradient GEMM and one
// weight-gradient GEMM (Ops::qkv_merge). The fused path gives the losses and gradients
// of the three-GEMM path (TRIDENT_FUSED_QKV=0) to the rounding of the input gradient,
// which is one sum over q | k | v instead of three accumulated GEMMs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/forwarding_ops.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "tests/model/tiny_config.h"
#include "tests/model/tiny_step.h"

namespace trident {
namespace {

// Counts the projection's calls: the splits and merges, and the GEMMs by output width.
class CountingOps : public testing::ForwardingOps {
 public:
  explicit CountingOps(Ops& inner) : ForwardingOps(inner) {}
  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    ++forward_gemms;
    if (OC == fused_width) ++fused_gemms;
    inner_.matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  using Ops::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    ++backward_gemms;
    if (OC == fused_width) ++fused_gemms;
    inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, dinp_write);
  }
  void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset) override {
    ++splits;
    inner_.qkv_split(q, k, v, qkv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset) override {
    ++merges;
    inner_.qkv_merge(dqkv, dq, dk, dv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  int fused_width = -1;
  int forward_gemms = 0, backward_gemms = 0, fused_gemms = 0, splits = 0, merges = 0;
};

struct StepRun {
  std::vector<float> losses;
  std::vector<float> grads;  // the gradients after each step's backward, concatenated
};

// Forward and backward twice at batch 2, the second on half-length sequences.
StepRun run_steps(const TransformerConfig& config, Ops& ops, DType compute) {
  constexpr int kB = 2;
  Transformer model(config, ops, kB, compute);
  model.init_weights(99);
  StepRun run;
  for (int step = 1; step <= 2; ++step) {
    run.losses.push_back(testing::tiny_forward_backward(model, config, kB, step));
    const std::vector<float> g = model.grads_to_host();
    run.grads.insert(run.grads.end(), g.begin(), g.end());
  }
  return run;
}

double rel_norm_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    r += double(want[i]) * want[i];
  }
  return std::sqrt(d / r);
}

// TRIDENT_FUSED_QKV set (or unset: nullptr) for one scope.
class FusedQkvEnv {
 public:
  explicit FusedQkvEnv(const char* value) {
    if (value != nullptr) {
      setenv("TRIDENT_FUSED_QKV", value, 1);
    } else {
      unsetenv("TRIDENT_FUSED_QKV");
    }
  }
  ~FusedQkvEnv() { unsetenv("TRIDENT_FUSED_QKV"); }
};

int fused_width(const TransformerConfig& c) { return (c.n_heads + 2 * c.n_kv_heads) * c.head_dim; }

TEST(FusedQkv, LlamaRunsOneGemmEachWayAndMatchesThreeGemms) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(compute));
    // GQA (4 query heads, 2 kv heads) and MHA; d_ff 96 so that no other GEMM has the
    // fused width.
    for (int kv_heads : {2, 4}) {
      SCOPED_TRACE("n_kv_heads " + std::to_string(kv_heads));
      const TransformerConfig c = testing::tiny_model(
          Arch::kLlama, testing::TinySize{.n_kv_heads = kv_heads, .d_ff = 96});
      auto cpu = make_cpu_ops(1);
      CountingOps fused(*cpu), separate(*cpu);
      fused.fused_width = separate.fused_width = fused_width(c);
      StepRun a, b;
      {
        FusedQkvEnv env(nullptr);  // the default
        a = run_steps(c, fused, compute);
      }
      {
        FusedQkvEnv env("0");
        b = run_steps(c, separate, compute);
      }
      const int calls = 2 * c.n_layers;  // two steps
      EXPECT_EQ(fused.splits, calls);
      EXPECT_EQ(fused.merges, calls);
      EXPECT_EQ(fused.fused_gemms, 2 * calls);  // a forward and a backward per layer and step
      EXPECT_EQ(separate.splits + separate.merges + separate.fused_gemms, 0);
      // Two GEMMs fewer each way per layer and step.
      EXPECT_EQ(separate.forward_gemms - fused.forward_gemms, 2 * calls);
      EXPECT_EQ(separate.backward_gemms - fused.backward_gemms, 2 * calls);

      // The forward is the same arithmetic (each output element one dot product over C,
      // RoPE the same rotation); the input gradient sums q | k | v in one GEMM where the
      // three-GEMM path rounds after each (in bf16, to bf16), so the gradients agree to
      // that rounding.
      const bool bf16 = compute == DType::kBF16;
      ASSERT_EQ(a.losses.size(), b.losses.size());
      for (size_t i = 0; i < a.losses.size(); ++i) {
        EXPECT_NEAR(a.losses[i], b.losses[i], (bf16 ? 1e-3 : 1e-6) * std::fabs(b.losses[i]))
            << "step " << i + 1;
      }
      ASSERT_EQ(a.grads.size(), b.grads.size());
      const double diff = rel_norm_diff(a.grads, b.grads);
      std::printf("fused vs three GEMMs, %s, n_kv_heads %d: loss %.9g / %.9g, gradient "
                  "difference %.3g relative\n",
                  dtype_name(compute), kv_heads, a.losses[0], b.losses[0], diff);
      EXPECT_LE(diff, bf16 ? 5e-3 : 2e-6);
    }
  }
}

TEST(FusedQkv, Gpt2KeepsThreeGemms) {
  // No RoPE pass to split the fused rows in (and its biases sit between the weights).
  const TransformerConfig c = testing::tiny_model(Arch::kGpt2);
  auto cpu = make_cpu_ops(1);
  CountingOps ops(*cpu);
  ops.fused_width = fused_width(c);
  FusedQkvEnv env(nullptr);
  run_steps(c, ops, DType::kF32);
  EXPECT_EQ(ops.splits + ops.merges + ops.fused_gemms, 0);
}

TEST(FusedQkvDeathTest, ABadValueNamesTheVariable) {
  const TransformerConfig c = testing::tiny_model(Arch::kLlama);
  auto cpu = make_cpu_ops(1);
  FusedQkvEnv env("yes");
  EXPECT_DEATH(Transformer(c, *cpu, 2), "TRIDENT_FUSED_QKV='yes': must be 1");
}

}  // namespace
}  // namespace trident
