// LayerNorm and RMSNorm against float64 loops and finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr int N = 21, C = 13;
constexpr double kEps = 1e-5;

VecD ref_layernorm(const VecD& x, const VecD& w, const VecD& b, bool use_bias) {
  VecD out(N * C);
  for (int n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int c = 0; c < C; ++c) mean += x[n * C + c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    var /= C;  // biased
    const double rstd = 1.0 / std::sqrt(var + kEps);
    for (int c = 0; c < C; ++c)
      out[n * C + c] = (x[n * C + c] - mean) * rstd * w[c] + (use_bias ? b[c] : 0.0);
  }
  return out;
}

// Analytic layernorm backward, written from d(norm)/dx = rstd (I - 1/C - norm norm^T / C).
void ref_layernorm_backward(const VecD& g, const VecD& x, const VecD& w, VecD& dx, VecD& dw,
                            VecD& db) {
  dx.assign(N * C, 0);
  dw.assign(C, 0);
  db.assign(C, 0);
  for (int n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int c = 0; c < C; ++c) mean += x[n * C + c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + kEps);
    VecD norm(C), gn(C);
    double sum_gn = 0, sum_gn_norm = 0;
    for (int c = 0; c < C; ++c) {
      norm[c] = (x[n * C + c] - mean) * rstd;
      gn[c] = g[n * C + c] * w[c];
      sum_gn += gn[c];
      sum_gn_norm += gn[c] * norm[c];
      dw[c] += g[n * C + c] * norm[c];
      db[c] += g[n * C + c];
    }
    for (int c = 0; c < C; ++c)
      dx[n * C + c] = rstd * (gn[c] - sum_gn / C - norm[c] * sum_gn_norm / C);
  }
}

VecD ref_rmsnorm(const VecD& x, const VecD& w) {
  VecD out(N * C);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double rstd = 1.0 / std::sqrt(ms / C + kEps);
    for (int c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * rstd * w[c];
  }
  return out;
}

void ref_rmsnorm_backward(const VecD& g, const VecD& x, const VecD& w, VecD& dx, VecD& dw) {
  dx.assign(N * C, 0);
  dw.assign(C, 0);
  for (int n = 0; n < N; ++n) {
    double ms = 0, dot = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ms / C + kEps);
    for (int c = 0; c < C; ++c) dot += g[n * C + c] * w[c] * x[n * C + c];
    for (int c = 0; c < C; ++c) {
      dx[n * C + c] = r * w[c] * g[n * C + c] - r * r * r / C * x[n * C + c] * dot;
      dw[c] += g[n * C + c] * x[n * C + c] * r;
    }
  }
}

TEST(CpuLayerNorm, ForwardMatchesFloat64) {
  auto ops = make_cpu_ops(2);
  VecF x = random_vec(N * C, 11, -2, 3), w = random_vec(C, 12), b = random_vec(C, 13);
  VecF out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(dev(*ops, out), dev(*ops, mean), dev(*ops, rstd), dev(*ops, x),
                         dev(*ops, w), dev(*ops, b), N, C, static_cast<float>(kEps));
  expect_close(out, ref_layernorm(to_d(x), to_d(w), to_d(b), true), kTolF32, "out");
  ops->layernorm_forward(dev(*ops, out), dev(*ops, mean), dev(*ops, rstd), dev(*ops, x),
                         dev(*ops, w), DevPtr(), N, C, static_cast<float>(kEps));
  expect_close(out, ref_layernorm(to_d(x), to_d(w), to_d(b), false), kTolF32, "out(no bias)");
  VecD want_mean(N), want_rstd(N);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    want_mean[n] = m;
    want_rstd[n] = 1.0 / std::sqrt(v / C + kEps);
  }
  expect_close(mean, want_mean, kTolF32, "mean");
  expect_close(rstd, want_rstd, kTolF32, "rstd");
}

TEST(CpuLayerNorm, BackwardMatchesFiniteDifferencesAndFloat64) {
  VecF x = random_vec(N * C, 14, -2, 3), w = random_vec(C, 15), b = random_vec(C, 16);
  VecF g = random_vec(N * C, 17);
  const VecD xd = to_d(x), wd = to_d(w), bd = to_d(b), gd = to_d(g);
  VecD dx, dw, db;
  ref_layernorm_backward(gd, xd, wd, dx, dw, db);
  expect_close_d(dx, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_layernorm(v, wd, bd, true), gd);
                 }, xd), kTolFd, "fd dinp");
  expect_close_d(dw, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_layernorm(xd, v, bd, true), gd);
                 }, wd), kTolFd, "fd dweight");
  expect_close_d(db, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_layernorm(xd, wd, v, true), gd);
                 }, bd), kTolFd, "fd dbias");

  auto ops = make_cpu_ops(2);
  VecF out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(dev(*ops, out), dev(*ops, mean), dev(*ops, rstd), dev(*ops, x),
                         dev(*ops, w), dev(*ops, b), N, C, static_cast<float>(kEps));
  VecF gx(N * C), gw(C), gb(C);
  ops->layernorm_backward(dev(*ops, gx), dev(*ops, gw), dev(*ops, gb), dev(*ops, g), dev(*ops, x),
                          dev(*ops, w), dev(*ops, mean), dev(*ops, rstd), N, C);
  expect_close(gx, dx, kTolF32, "dinp");
  expect_close(gw, dw, kTolF32, "dweight");
  expect_close(gb, db, kTolF32, "dbias");

  VecF px = random_vec(N * C, 18), pw = random_vec(C, 19), pb = random_vec(C, 20);
  VecF ax = px, aw = pw, ab = pb;
  ops->layernorm_backward(dev(*ops, ax), dev(*ops, aw), dev(*ops, ab), dev(*ops, g), dev(*ops, x),
                          dev(*ops, w), dev(*ops, mean), dev(*ops, rstd), N, C);
  expect_accumulated(ax, px, gx, "dinp");
  expect_accumulated(aw, pw, gw, "dweight");
  expect_accumulated(ab, pb, gb, "dbias");

  VecF only_x(N * C);
  ops->layernorm_backward(dev(*ops, only_x), DevPtr(), DevPtr(), dev(*ops, g), dev(*ops, x),
                          dev(*ops, w), dev(*ops, mean), dev(*ops, rstd), N, C);
  EXPECT_EQ(only_x, gx);
}

TEST(CpuRmsNorm, ForwardMatchesFloat64) {
  auto ops = make_cpu_ops(2);
  VecF x = random_vec(N * C, 21, -2, 3), w = random_vec(C, 22);
  VecF out(N * C), rstd(N);
  ops->rmsnorm_forward(dev(*ops, out), dev(*ops, rstd), dev(*ops, x), dev(*ops, w), N, C,
                       static_cast<float>(kEps));
  expect_close(out, ref_rmsnorm(to_d(x), to_d(w)), kTolF32, "out");
  VecD want_rstd(N);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += static_cast<double>(x[n * C + c]) * x[n * C + c];
    want_rstd[n] = 1.0 / std::sqrt(ms / C + kEps);
  }
  expect_close(rstd, want_rstd, kTolF32, "rstd");
}

TEST(CpuRmsNorm, BackwardMatchesFiniteDifferencesAndFloat64) {
  VecF x = random_vec(N * C, 23, -2, 3), w = random_vec(C, 24), g = random_vec(N * C, 25);
  const VecD xd = to_d(x), wd = to_d(w), gd = to_d(g);
  VecD dx, dw;
  ref_rmsnorm_backward(gd, xd, wd, dx, dw);
  expect_close_d(dx, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_rmsnorm(v, wd), gd);
                 }, xd), kTolFd, "fd dinp");
  expect_close_d(dw, numeric_grad([&](const VecD& v) {
                   return weighted_sum(ref_rmsnorm(xd, v), gd);
                 }, wd), kTolFd, "fd dweight");

  auto ops = make_cpu_ops(2);
  VecF out(N * C), rstd(N);
  ops->rmsnorm_forward(dev(*ops, out), dev(*ops, rstd), dev(*ops, x), dev(*ops, w), N, C,
                       static_cast<float>(kEps));
  VecF gx(N * C), gw(C);
  ops->rmsnorm_backward(dev(*ops, gx), dev(*ops, gw), dev(*ops, g), dev(*ops, x), dev(*ops, w),
                        dev(*ops, rstd), N, C);
  expect_close(gx, dx, kTolF32, "dinp");
  expect_close(gw, dw, kTolF32, "dweight");

  VecF px = random_vec(N * C, 26), pw = random_vec(C, 27);
  VecF ax = px, aw = pw;
  ops->rmsnorm_backward(dev(*ops, ax), dev(*ops, aw), dev(*ops, g), dev(*ops, x), dev(*ops, w),
                        dev(*ops, rstd), N, C);
  expect_accumulated(ax, px, gx, "dinp");
  expect_accumulated(aw, pw, gw, "dweight");
  VecF only_w(C);
  ops->rmsnorm_backward(DevPtr(), dev(*ops, only_w), dev(*ops, g), dev(*ops, x), dev(*ops, w),
                        dev(*ops, rstd), N, C);
  EXPECT_EQ(only_w, gw);
}

}  // namespace
}  // namespace trident::testing
