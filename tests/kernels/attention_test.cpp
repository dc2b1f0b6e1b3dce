// Causal GQA attention and RoPE against float64 loops and finite differences. The
// attention tests go through the Ops interface only: the saved state is an opaque
// buffer of attention_state_bytes (pre-filled with garbage, so forward must write what
// backward needs); one test pins the CPU backend's choice of state (the probabilities).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr int B = 3, T = 7, NH = 6, NKV = 2, HD = 6;

size_t qi(int b, int t, int h, int d) { return ((static_cast<size_t>(b) * T + t) * NH + h) * HD + d; }
size_t ki(int b, int t, int h, int d) { return ((static_cast<size_t>(b) * T + t) * NKV + h) * HD + d; }

// An opaque attention state of the size the backend declares, filled with garbage.
std::vector<unsigned char> attention_state(const Ops& ops, int b, int t, int nh, int nkv, int hd) {
  std::vector<unsigned char> s(ops.attention_state_bytes(b, t, nh, nkv, hd, DType::kF32));
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<unsigned char>(i * 37 + 11);
  return s;
}

// Returns out; fills probs[B, NH, T, T] when given.
VecD ref_attention(const VecD& q, const VecD& k, const VecD& v, VecD* probs = nullptr) {
  VecD out(B * T * NH * HD, 0.0);
  if (probs != nullptr) probs->assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kv = h / (NH / NKV);
      for (int i = 0; i < T; ++i) {
        VecD s(i + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < HD; ++e) d += q[qi(b, i, h, e)] * k[ki(b, j, kv, e)];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; ++j) {
          const double p = s[j] / sum;
          if (probs != nullptr) (*probs)[((static_cast<size_t>(b) * NH + h) * T + i) * T + j] = p;
          for (int e = 0; e < HD; ++e) out[qi(b, i, h, e)] += p * v[ki(b, j, kv, e)];
        }
      }
    }
  return out;
}

void ref_attention_backward(const VecD& g, const VecD& q, const VecD& k, const VecD& v, VecD& dq,
                            VecD& dk, VecD& dv) {
  VecD P;
  ref_attention(q, k, v, &P);
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kv = h / (NH / NKV);
      for (int i = 0; i < T; ++i) {
        const double* p = &P[((static_cast<size_t>(b) * NH + h) * T + i) * T];
        VecD dp(i + 1);
        double rowdot = 0;
        for (int j = 0; j <= i; ++j) {
          for (int e = 0; e < HD; ++e) {
            dp[j] += g[qi(b, i, h, e)] * v[ki(b, j, kv, e)];
            dv[ki(b, j, kv, e)] += p[j] * g[qi(b, i, h, e)];
          }
          rowdot += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - rowdot) * scale;
          for (int e = 0; e < HD; ++e) {
            dq[qi(b, i, h, e)] += ds * k[ki(b, j, kv, e)];
            dk[ki(b, j, kv, e)] += ds * q[qi(b, i, h, e)];
          }
        }
      }
    }
}

TEST(CpuAttention, ForwardMatchesFloat64) {
  auto ops = make_cpu_ops(2);
  VecF q = random_vec(B * T * NH * HD, 41, -2, 2), k = random_vec(B * T * NKV * HD, 42, -2, 2);
  VecF v = random_vec(B * T * NKV * HD, 43);
  VecF out(q.size(), 7.0f);
  auto state = attention_state(*ops, B, T, NH, NKV, HD);
  ops->attention_forward(dev(*ops, out), dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v),
                         B, T, NH, NKV, HD);
  expect_close(out, ref_attention(to_d(q), to_d(k), to_d(v)), kTolF32, "out");
}

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
  auto state = attention_state(*ops, B, T, NH, NKV, HD);
  ops->attention_forward(dev(*ops, out), dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v),
                         B, T, NH, NKV, HD);
  VecF att(state.size() / sizeof(float));
  std::memcpy(att.data(), state.data(), state.size());
  VecD probs;
  ref_attention(to_d(q), to_d(k), to_d(v), &probs);
  expect_close(att, probs, kTolF32, "att");
  for (int r = 0; r < B * NH; ++r)  // the masked upper triangle is exactly zero
    for (int i = 0; i < T; ++i)
      for (int j = i + 1; j < T; ++j) EXPECT_EQ(att[(static_cast<size_t>(r) * T + i) * T + j], 0.0f);
}

TEST(CpuAttention, BackwardMatchesFiniteDifferencesAndFloat64) {
  VecF q = random_vec(B * T * NH * HD, 44, -2, 2), k = random_vec(B * T * NKV * HD, 45, -2, 2);
  VecF v = random_vec(B * T * NKV * HD, 46), g = random_vec(B * T * NH * HD, 47);
  const VecD qd = to_d(q), kd = to_d(k), vd = to_d(v), gd = to_d(g);
  VecD dq, dk, dv;
  ref_attention_backward(gd, qd, kd, vd, dq, dk, dv);
  expect_close_d(dq, numeric_grad([&](const VecD& x) {
                   return weighted_sum(ref_attention(x, kd, vd), gd);
                 }, qd), kTolFd, "fd dq");
  expect_close_d(dk, numeric_grad([&](const VecD& x) {
                   return weighted_sum(ref_attention(qd, x, vd), gd);
                 }, kd), kTolFd, "fd dk");
  expect_close_d(dv, numeric_grad([&](const VecD& x) {
                   return weighted_sum(ref_attention(qd, kd, x), gd);
                 }, vd), kTolFd, "fd dv");

  auto ops = make_cpu_ops(2);
  VecF out(q.size());
  auto state = attention_state(*ops, B, T, NH, NKV, HD);
  ops->attention_forward(dev(*ops, out), dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v),
                         B, T, NH, NKV, HD);
  VecF gq(q.size()), gk(k.size()), gv(v.size());
  ops->attention_backward(dev(*ops, gq), dev(*ops, gk), dev(*ops, gv), dev(*ops, g), dev(*ops, out),
                          dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v), B, T, NH, NKV,
                          HD);
  expect_close(gq, dq, kTolF32, "dq");
  expect_close(gk, dk, kTolF32, "dk");
  expect_close(gv, dv, kTolF32, "dv");

  VecF pq = random_vec(q.size(), 48), pk = random_vec(k.size(), 49), pv = random_vec(v.size(), 50);
  VecF aq = pq, ak = pk, av = pv;
  ops->attention_backward(dev(*ops, aq), dev(*ops, ak), dev(*ops, av), dev(*ops, g), dev(*ops, out),
                          dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v), B, T, NH, NKV,
                          HD);
  expect_accumulated(aq, pq, gq, "dq");
  expect_accumulated(ak, pk, gk, "dk");
  expect_accumulated(av, pv, gv, "dv");
  VecF only_v(v.size());
  ops->attention_backward(DevPtr(), DevPtr(), dev(*ops, only_v), dev(*ops, g), dev(*ops, out),
                          dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v), B, T, NH, NKV,
                          HD);
  EXPECT_EQ(only_v, gv);
}

// Longer sequence than the kernel's 64-row block, plain multi-head: exercises the
// causal block decomposition.
TEST(CpuAttention, MultiBlockSequenceMatchesFloat64) {
  constexpr int b = 1, t = 150, nh = 2, hd = 8;
  auto ops = make_cpu_ops(2);
  VecF q = random_vec(b * t * nh * hd, 51), k = random_vec(b * t * nh * hd, 52);
  VecF v = random_vec(b * t * nh * hd, 53), g = random_vec(b * t * nh * hd, 54);
  VecF out(q.size());
  auto state = attention_state(*ops, b, t, nh, nh, hd);
  ops->attention_forward(dev(*ops, out), dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v),
                         b, t, nh, nh, hd);
  VecF gq(q.size()), gk(k.size()), gv(v.size());
  ops->attention_backward(dev(*ops, gq), dev(*ops, gk), dev(*ops, gv), dev(*ops, g), dev(*ops, out),
                          dev(*ops, state), dev(*ops, q), dev(*ops, k), dev(*ops, v), b, t, nh, nh,
                          hd);
  // Naive float64 reference for this shape (row i attends to j <= i).
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  VecD want(out.size(), 0.0), dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  auto at = [&](int tt, int h, int e) { return (static_cast<size_t>(tt) * nh + h) * hd + e; };
  for (int h = 0; h < nh; ++h)
    for (int i = 0; i < t; ++i) {
      VecD p(i + 1), dp(i + 1, 0.0);
      double mx = -1e300, sum = 0, rowdot = 0;
      for (int j = 0; j <= i; ++j) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += static_cast<double>(q[at(i, h, e)]) * k[at(j, h, e)];
        mx = std::max(mx, p[j] = d * scale);
      }
      for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int j = 0; j <= i; ++j) {
        p[j] /= sum;
        for (int e = 0; e < hd; ++e) {
          want[at(i, h, e)] += p[j] * v[at(j, h, e)];
          dp[j] += static_cast<double>(g[at(i, h, e)]) * v[at(j, h, e)];
          dv[at(j, h, e)] += p[j] * g[at(i, h, e)];
        }
        rowdot += p[j] * dp[j];
      }
      for (int j = 0; j <= i; ++j)
        for (int e = 0; e < hd; ++e) {
          const double ds = p[j] * (dp[j] - rowdot) * scale;
          dq[at(i, h, e)] += ds * k[at(j, h, e)];
          dk[at(j, h, e)] += ds * q[at(i, h, e)];
        }
    }
  expect_close(out, want, kTolF32, "out");
  expect_close(gq, dq, 1e-4, "dq");  // sums over up to 150 terms
  expect_close(gk, dk, 1e-4, "dk");
  expect_close(gv, dv, kTolF32, "dv");
}

// ---- RoPE -------------------------------------------------------------------------

constexpr int kRopeH = 5;
constexpr double kTheta = 10000.0;
constexpr int kPosOffset = 3;

VecD ref_rope(const VecD& x) {
  VecD out = x;
  const int half = HD / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < kRopeH; ++h)
        for (int i = 0; i < half; ++i) {
          const double ang = (t + kPosOffset) * std::pow(kTheta, -2.0 * i / HD);
          const size_t base = ((static_cast<size_t>(b) * T + t) * kRopeH + h) * HD;
          const double x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
          out[base + i + half] = x2 * std::cos(ang) + x1 * std::sin(ang);
        }
  return out;
}

TEST(CpuRope, ForwardMatchesFloat64AndBackwardIsTheTranspose) {
  auto ops = make_cpu_ops(2);
  const size_t n = static_cast<size_t>(B) * T * kRopeH * HD;
  VecF x = random_vec(n, 55), g = random_vec(n, 56);
  VecF y = x;
  ops->rope_forward(dev(*ops, y), B, T, kRopeH, HD, static_cast<float>(kTheta), kPosOffset);
  expect_close(y, ref_rope(to_d(x)), kTolF32, "out");
  // The rotation is linear, so the gradient of sum(rope(x) * g) is the backward of g.
  const VecD gd = to_d(g);
  VecD want = numeric_grad([&](const VecD& v) { return weighted_sum(ref_rope(v), gd); }, to_d(x));
  VecF dx = g;
  ops->rope_backward(dev(*ops, dx), B, T, kRopeH, HD, static_cast<float>(kTheta), kPosOffset);
  expect_close(dx, want, kTolF32, "dx");
  // backward(forward(x)) == x: the rotation is orthogonal.
  ops->rope_backward(dev(*ops, y), B, T, kRopeH, HD, static_cast<float>(kTheta), kPosOffset);
  expect_close(y, to_d(x), kTolF32, "roundtrip");
}

}  // namespace
}  // namespace trident::testing
