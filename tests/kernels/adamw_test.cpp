// AdamW against the double-precision formula over several steps; sum of squares.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

TEST(CpuAdamW, MatchesFloat64FormulaOverSteps) {
  auto ops = make_cpu_ops(2);
  const size_t n = 37;
  VecF param = random_vec(n, 91), m(n, 0.0f), v(n, 0.0f);
  VecD pd = to_d(param), md(n, 0.0), vd(n, 0.0);
  AdamWParams p;
  p.lr = 1e-2f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  for (int step = 1; step <= 4; ++step) {
    VecF grad = random_vec(n, 100 + step);
    p.step = step;
    ops->adamw_update(dev(*ops, param), dev(*ops, grad), dev(*ops, m), dev(*ops, v), DevPtr(), n,
                      p);
    const double b1 = p.beta1, b2 = p.beta2;
    for (size_t i = 0; i < n; ++i) {
      md[i] = b1 * md[i] + (1 - b1) * grad[i];
      vd[i] = b2 * vd[i] + (1 - b2) * grad[i] * grad[i];
      const double mhat = md[i] / (1 - std::pow(b1, step));
      const double vhat = vd[i] / (1 - std::pow(b2, step));
      pd[i] -= p.lr * (mhat / (std::sqrt(vhat) + p.eps) + p.weight_decay * pd[i]);
    }
    expect_close(m, md, kTolF32, "m");
    expect_close(v, vd, kTolF32, "v");
    expect_close(param, pd, kTolF32, "param");
  }
}

TEST(CpuSumSquares, MatchesFloat64) {
  auto ops = make_cpu_ops(2);
  for (size_t n : {size_t{0}, size_t{37}, size_t{100003}}) {
    VecF x = random_vec(n, 92, -3, 3);
    double want = 0;
    for (float f : x) want += static_cast<double>(f) * f;
    EXPECT_NEAR(ops->sum_squares(dev(*ops, x), n), want, 1e-12 * (want + 1)) << n;
  }
}

}  // namespace
}  // namespace trident::testing
