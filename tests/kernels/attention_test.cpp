// The CPU backend's choice of attention state (the probabilities), against the op table's
// float64 reference. Attention itself, every shape and dtype, forward and backward, is in
// the op table (op_table_test.cpp); the state is opaque there.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/op_table.h"

namespace trident::testing {
namespace {

constexpr int B = 3, T = 7, NH = 6, NKV = 2, HD = 6;

// The CPU backend's state: the softmax probabilities [B, NH, T, T] as floats (upper
// triangle exactly 0), B * NH * T * T * 4 bytes; a size that would wrap saturates.
TEST(CpuAttention, StateIsTheProbabilities) {
  auto ops = make_cpu_ops(2);
  for (DType dt : {DType::kF32, DType::kBF16}) {  // f32 probabilities whatever the io dtype
    EXPECT_EQ(ops->attention_state_bytes(B, T, NH, NKV, HD, dt),
              static_cast<size_t>(B) * NH * T * T * sizeof(float));
  }
  EXPECT_EQ(ops->attention_state_bytes(1 << 30, 1 << 30, 1 << 30, 1, 64, DType::kF32), SIZE_MAX);
  VecF q = random_vec(B * T * NH * HD, 41, -2, 2), k = random_vec(B * T * NKV * HD, 42, -2, 2);
  VecF v = random_vec(B * T * NKV * HD, 43);
  VecF out(q.size());
  // Garbage the forward must overwrite.
  std::vector<unsigned char> state(ops->attention_state_bytes(B, T, NH, NKV, HD, DType::kF32));
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<unsigned char>(i * 37 + 11);
  ops->attention_forward(dev(*ops, out), dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v),
                         B, T, NH, NKV, HD);
  VecF att(state.size() / sizeof(float));
  std::memcpy(att.data(), state.data(), state.size());
  VecD want_out(q.size()), probs;
  op_table::ref_attention({B, T, NH, NKV, HD}, to_d(q), to_d(k), to_d(v), want_out, probs);
  expect_close(att, probs, kTolF32, "att");
  for (int r = 0; r < B * NH; ++r)  // the masked upper triangle is exactly zero
    for (int i = 0; i < T; ++i)
      for (int j = i + 1; j < T; ++j) EXPECT_EQ(att[(static_cast<size_t>(r) * T + i) * T + j], 0.0f);
}

}  // namespace
}  // namespace trident::testing
