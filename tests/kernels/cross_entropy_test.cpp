// Cross-entropy over padded logits: forward, backward, and in-place (aliased) backward.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr int N = 37, V = 11, Vp = 16;

std::vector<int32_t> targets() {
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; ++n) t[n] = (n * 5 + 2) % V;
  return t;
}

VecD ref_losses(const VecD& logits, const std::vector<int32_t>& tgt) {
  VecD loss(N);
  for (int n = 0; n < N; ++n) {
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * Vp + v]);
    loss[n] = std::log(sum) - logits[n * Vp + tgt[n]];
  }
  return loss;
}

// Logits with padded columns holding large garbage that must be ignored.
VecF make_logits() {
  VecF l = random_vec(N * Vp, 81, -3, 3);
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) l[n * Vp + v] = 50.0f;
  return l;
}

TEST(CpuCrossEntropy, ForwardIgnoresPaddedColumns) {
  auto ops = make_cpu_ops(2);
  auto tgt = targets();
  VecF logits = make_logits(), losses(N);
  ops->cross_entropy_forward(dev(*ops, losses), dev(*ops, logits), dev(*ops, tgt), N, V, Vp);
  expect_close(losses, ref_losses(to_d(logits), tgt), kTolF32, "losses");
}

TEST(CpuCrossEntropy, BackwardMatchesFiniteDifferencesAndMayAlias) {
  auto ops = make_cpu_ops(2);
  auto tgt = targets();
  VecF logits = make_logits();
  const float dloss = 0.37f;
  // Gradient of dloss * sum(losses); padded columns get exactly zero.
  VecD want = numeric_grad([&](const VecD& l) {
    VecD loss = ref_losses(l, tgt);
    double s = 0;
    for (double x : loss) s += x;
    return dloss * s;
  }, to_d(logits));
  VecF d(N * Vp, 9.0f);  // overwritten, not accumulated
  ops->cross_entropy_backward(dev(*ops, d), dev(*ops, logits), dev(*ops, tgt), dloss, N, V, Vp);
  expect_close(d, want, kTolF32, "dlogits");
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) ASSERT_EQ(d[n * Vp + v], 0.0f);
  VecF inplace = logits;
  {
    DevVec<float> d_inplace(*ops, inplace);  // one buffer passed twice; written back below
    ops->cross_entropy_backward(d_inplace, d_inplace, dev(*ops, tgt), dloss, N, V, Vp);
  }
  EXPECT_EQ(inplace, d);
}

}  // namespace
}  // namespace trident::testing
