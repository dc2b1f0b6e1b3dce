// Token + position embedding, including the vocab-parallel range and repeated tokens.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr int B = 3, T = 7, C = 13, kVocab = 11;

std::vector<int32_t> tokens() {
  std::vector<int32_t> t(B * T);
  for (int i = 0; i < B * T; ++i) t[i] = (i * 7 + 3) % kVocab;  // repeats tokens
  return t;
}

VecD ref_forward(const std::vector<int32_t>& tok, const VecD& wte, const VecD* wpe, int vb,
                 int vl) {
  VecD out(B * T * C, 0.0);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c) {
      const int local = tok[n] - vb;
      double v = (local >= 0 && local < vl) ? wte[local * C + c] : 0.0;
      if (wpe != nullptr) v += (*wpe)[(n % T) * C + c];
      out[n * C + c] = v;
    }
  return out;
}

TEST(CpuEmbedding, ForwardFullAndVocabParallel) {
  auto ops = make_cpu_ops(2);
  auto tok = tokens();
  VecF wte = random_vec(kVocab * C, 31), wpe = random_vec(T * C, 32);
  const VecD wted = to_d(wte), wped = to_d(wpe);
  VecF out(B * T * C, 5.0f);
  ops->embedding_forward(dev(*ops, out), dev(*ops, tok), dev(*ops, wte), dev(*ops, wpe), B, T, C, 0,
                         kVocab);
  expect_close(out, ref_forward(tok, wted, &wped, 0, kVocab), 1e-7, "out");  // one rounding
  // Rows [4, 9) of the table only, no position embedding.
  ops->embedding_forward(dev(*ops, out), dev(*ops, tok), dev(*ops, wte).ptr() + 4 * C, DevPtr(), B,
                         T, C, 4, 5);
  VecD local(wted.begin() + 4 * C, wted.begin() + 9 * C);
  expect_close(out, ref_forward(tok, local, nullptr, 4, 5), 0, "out(shard)");
}

TEST(CpuEmbedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto ops = make_cpu_ops(2);
  auto tok = tokens();
  VecF wte = random_vec(5 * C, 33), wpe = random_vec(T * C, 34), g = random_vec(B * T * C, 35);
  const VecD wted = to_d(wte), wped = to_d(wpe), gd = to_d(g);
  // Vocab shard [4, 9): gradient of sum(out * g) by finite differences.
  VecD want_wte = numeric_grad([&](const VecD& v) {
    return weighted_sum(ref_forward(tok, v, &wped, 4, 5), gd);
  }, wted);
  VecD want_wpe = numeric_grad([&](const VecD& v) {
    return weighted_sum(ref_forward(tok, wted, &v, 4, 5), gd);
  }, wped);
  VecF dwte(5 * C), dwpe(T * C);
  ops->embedding_backward(dev(*ops, dwte), dev(*ops, dwpe), dev(*ops, g), dev(*ops, tok), B, T, C,
                          4, 5);
  expect_close(dwte, want_wte, kTolF32, "dwte");
  expect_close(dwpe, want_wpe, kTolF32, "dwpe");

  VecF pte = random_vec(5 * C, 36), ppe = random_vec(T * C, 37);
  VecF ate = pte, ape = ppe;
  ops->embedding_backward(dev(*ops, ate), dev(*ops, ape), dev(*ops, g), dev(*ops, tok), B, T, C, 4,
                          5);
  expect_accumulated(ate, pte, dwte, "dwte");
  expect_accumulated(ape, ppe, dwpe, "dwpe");
  VecF only_te(5 * C);
  ops->embedding_backward(dev(*ops, only_te), DevPtr(), dev(*ops, g), dev(*ops, tok), B, T, C, 4,
                          5);
  EXPECT_EQ(only_te, dwte);
}

}  // namespace
}  // namespace trident::testing
