// The model treats the attention state as opaque (kernels/ops.h): a backend that
// declares a bigger state, keeps the CPU's state at an offset, XOR-scrambles it and
// fills the rest with garbage trains the model to bitwise the same losses and weights
// as the plain CPU backend. The model only allocates the declared bytes and passes them
// from forward to backward; it neither reads, writes nor sizes them itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device_access.h"
#include "kernels/forwarding_ops.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "tests/model/tiny_config.h"
#include "tests/model/tiny_step.h"

namespace trident {
namespace {

// Wraps the CPU Ops; its attention state is [kHead garbage | CPU state ^ key | kTail
// garbage]. `unscramble` false is the control: backward hands the scrambled bytes to the
// CPU, which must change the results (so the comparison below can see a difference).
class ScramblingOps : public testing::ForwardingOps {
 public:
  static constexpr size_t kHead = 192;  // keeps the inner state 64-byte aligned
  static constexpr size_t kTail = 77;

  ScramblingOps(Ops& inner, bool unscramble) : ForwardingOps(inner), unscramble_(unscramble) {}

  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD,
                               DType dtype) const override {
    return kHead + inner_.attention_state_bytes(B, T, NH, NKV, HD, dtype) + kTail;
  }
  // This wrapper is a backend: it reads and writes the state's bytes inside a
  // DeviceAccessScope, as device code does.
  void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T,
                         int NH, int NKV, int HD) override {
    ++forwards;
    if (reinterpret_cast<uintptr_t>(state.raw()) % 64 != 0) ++misaligned;
    const size_t n = inner_.attention_state_bytes(B, T, NH, NKV, HD, q.dtype());
    inner_.attention_forward(out, state.byte_offset(kHead), q, k, v, B, T, NH, NKV, HD);
    DeviceAccessScope device;
    auto* bytes = static_cast<unsigned char*>(state.raw());
    for (size_t i = 0; i < n; ++i) bytes[kHead + i] ^= key(i);
    for (size_t i = 0; i < kHead; ++i) bytes[i] = garbage(i);
    for (size_t i = 0; i < kTail; ++i) bytes[kHead + n + i] = garbage(i + 1);
  }
  void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                          DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH, int NKV,
                          int HD) override {
    ++backwards;
    const size_t n = inner_.attention_state_bytes(B, T, NH, NKV, HD, q.dtype());
    if (plain_.bytes() < n) plain_ = DeviceBuffer(inner_, n);
    {
      DeviceAccessScope device;
      const auto* bytes = static_cast<const unsigned char*>(state.raw());
      for (size_t i = 0; i < kHead; ++i) tampered += bytes[i] != garbage(i);
      for (size_t i = 0; i < kTail; ++i) tampered += bytes[kHead + n + i] != garbage(i + 1);
      auto* p = static_cast<unsigned char*>(plain_.get().raw());
      for (size_t i = 0; i < n; ++i) p[i] = bytes[kHead + i] ^ (unscramble_ ? key(i) : 0);
    }
    inner_.attention_backward(dq, dk, dv, dout, out, plain_.get(), q, k, v, B, T, NH, NKV, HD);
  }

  int forwards = 0, backwards = 0, misaligned = 0;
  size_t tampered = 0;  // garbage bytes the model changed between forward and backward

 private:
  static unsigned char key(size_t i) { return static_cast<unsigned char>(0xA5 ^ (i * 131)); }
  static unsigned char garbage(size_t i) { return static_cast<unsigned char>(i * 37 + 11); }
  bool unscramble_;
  DeviceBuffer plain_;  // the unscrambled state, in the inner Ops' memory
};

struct TrainRun {
  std::vector<float> losses;
  std::vector<float> params;
};

// Three AdamW steps of a tiny model; the second uses shorter sequences than seq_len
// (the state planned for the largest call serves a smaller one).
TrainRun train(const TransformerConfig& config, Ops& ops) {
  constexpr int kB = 2;
  Transformer model(config, ops, kB);
  model.init_weights(1234);
  const size_t n = model.num_param_floats();
  DeviceBuffer m(ops, n * sizeof(float)), v(ops, n * sizeof(float));
  TrainRun run;
  for (int step = 1; step <= 3; ++step) {
    run.losses.push_back(testing::tiny_forward_backward(model, config, kB, step));
    AdamWParams p;
    p.lr = 1e-2f;
    p.step = step;
    ops.adamw_update(model.param_data(), model.grad_data(), m.as(DType::kF32), v.as(DType::kF32),
                     DevPtr(), n, p);
  }
  run.params = model.params_to_host();
  return run;
}

TransformerConfig tiny(Arch arch) { return testing::tiny_model(arch); }

TEST(OpaqueAttentionState, ScrambledPaddedStateTrainsBitwiseIdentically) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    SCOPED_TRACE(arch_name(arch));
    const TransformerConfig c = tiny(arch);
    auto cpu = make_cpu_ops(1);
    const TrainRun want = train(c, *cpu);

    ScramblingOps scrambled(*cpu, /*unscramble=*/true);
    const TrainRun got = train(c, scrambled);
    EXPECT_EQ(scrambled.forwards, 3 * c.n_layers);
    EXPECT_EQ(scrambled.backwards, 3 * c.n_layers);
    EXPECT_EQ(scrambled.misaligned, 0);
    EXPECT_EQ(scrambled.tampered, 0u);
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(float)), 0)
          << "step " << i + 1 << ": " << got.losses[i] << " vs " << want.losses[i];
    }
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(),
                          want.params.size() * sizeof(float)),
              0);

    // Control: the same wrapper without unscrambling does change training, so the
    // comparison above would see a model that bypassed the backend's state.
    ScramblingOps broken(*cpu, /*unscramble=*/false);
    const TrainRun bad = train(c, broken);
    EXPECT_EQ(bad.losses[0], want.losses[0]);  // forward alone does not read the state
    EXPECT_NE(bad.losses[1], want.losses[1]);
  }
}

// The model sizes its activations with the backend's figure: the wrapper's extra bytes
// appear in activation_bytes, once per layer, each slice rounded to 64 bytes.
TEST(OpaqueAttentionState, ActivationBytesFollowTheBackendsStateSize) {
  const TransformerConfig c = tiny(Arch::kLlama);
  auto cpu = make_cpu_ops(1);
  ScramblingOps padded(*cpu, true);
  const Transformer plain(c, *cpu, 2), bigger(c, padded, 2);
  const size_t inner = cpu->attention_state_bytes(2, c.seq_len, c.n_heads, c.n_kv_heads,
                                                  c.head_dim, DType::kF32);
  EXPECT_EQ(inner, size_t{2} * 4 * 32 * 32 * sizeof(float));  // the CPU keeps probabilities
  const size_t extra = ScramblingOps::kHead + ScramblingOps::kTail;
  const size_t per_layer = (inner + extra + 63) / 64 * 64 - inner;
  EXPECT_EQ(bigger.activation_bytes(), plain.activation_bytes() + c.n_layers * per_layer);
}

}  // namespace
}  // namespace trident
