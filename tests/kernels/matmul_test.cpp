// Linear layer: forward and backward against float64 loops and finite differences.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr int N = 37, IC = 13, OC = 11;

VecD ref_forward(const VecD& x, const VecD& w, const VecD& b, bool use_bias) {
  VecD out(N * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = use_bias ? b[o] : 0.0;
      for (int i = 0; i < IC; ++i) s += x[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = s;
    }
  return out;
}

void ref_backward(const VecD& dout, const VecD& x, const VecD& w, VecD& dx, VecD& dw, VecD& db) {
  dx.assign(N * IC, 0.0);
  dw.assign(OC * IC, 0.0);
  db.assign(OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double g = dout[n * OC + o];
      db[o] += g;
      for (int i = 0; i < IC; ++i) {
        dx[n * IC + i] += g * w[o * IC + i];
        dw[o * IC + i] += g * x[n * IC + i];
      }
    }
}

TEST(CpuMatmul, ForwardMatchesFloat64) {
  auto ops = make_cpu_ops(2);
  VecF x = random_vec(N * IC, 1), w = random_vec(OC * IC, 2), b = random_vec(OC, 3);
  VecF out(N * OC, 123.0f);  // overwritten, not accumulated
  ops->matmul_forward(dev(*ops, out), dev(*ops, x), dev(*ops, w), dev(*ops, b), N, IC, OC);
  expect_close(out, ref_forward(to_d(x), to_d(w), to_d(b), true), kTolF32, "out(bias)");
  ops->matmul_forward(dev(*ops, out), dev(*ops, x), dev(*ops, w), DevPtr(), N, IC, OC);
  expect_close(out, ref_forward(to_d(x), to_d(w), to_d(b), false), kTolF32, "out(no bias)");
}

TEST(CpuMatmul, BackwardMatchesFiniteDifferencesAndFloat64) {
  VecF x = random_vec(N * IC, 4), w = random_vec(OC * IC, 5), b = random_vec(OC, 6);
  VecF dout = random_vec(N * OC, 7);
  const VecD xd = to_d(x), wd = to_d(w), bd = to_d(b), gd = to_d(dout);
  VecD dx, dw, db;
  ref_backward(gd, xd, wd, dx, dw, db);
  // The reference backward is the gradient of sum(out * dout).
  expect_close_d(dx, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_forward(v, wd, bd, true), gd);
                 }, xd), kTolFd, "fd dinp");
  expect_close_d(dw, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_forward(xd, v, bd, true), gd);
                 }, wd), kTolFd, "fd dweight");
  expect_close_d(db, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_forward(xd, wd, v, true), gd);
                 }, bd), kTolFd, "fd dbias");

  auto ops = make_cpu_ops(2);
  VecF gx(N * IC), gw(OC * IC), gb(OC);
  ops->matmul_backward(dev(*ops, gx), dev(*ops, gw), dev(*ops, gb), dev(*ops, dout), dev(*ops, x),
                       dev(*ops, w), N, IC, OC);
  expect_close(gx, dx, kTolF32, "dinp");
  expect_close(gw, dw, kTolF32, "dweight");
  expect_close(gb, db, kTolF32, "dbias");

  VecF px = random_vec(N * IC, 8), pw = random_vec(OC * IC, 9), pb = random_vec(OC, 10);
  VecF ax = px, aw = pw, ab = pb;
  ops->matmul_backward(dev(*ops, ax), dev(*ops, aw), dev(*ops, ab), dev(*ops, dout), dev(*ops, x),
                       dev(*ops, w), N, IC, OC);
  expect_accumulated(ax, px, gx, "dinp");
  expect_accumulated(aw, pw, gw, "dweight");
  expect_accumulated(ab, pb, gb, "dbias");

  // Null gradients are skipped; the others are unchanged by that.
  VecF only_w(OC * IC);
  ops->matmul_backward(DevPtr(), dev(*ops, only_w), DevPtr(), dev(*ops, dout), dev(*ops, x),
                       dev(*ops, w), N, IC, OC);
  EXPECT_EQ(only_w, gw);
}

}  // namespace
}  // namespace trident::testing
