// The plain attention path's layout arithmetic on the host: its GEMM descs (batch,
// strides, leading dimensions, transposes), applied with GemmDesc's row-major semantics
// (gemm.h) to the layouts of attention_kernels.h, compute causal GQA attention and its
// gradients; and the kernels' launch shapes cover odd sizes. No device needed.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_plain.h"

namespace trident::cuda {
namespace {

using Vec = std::vector<double>;

// D_b = alpha op(A_b) op(B_b) (+ D_b) for every batch entry, exactly as gemm.h defines it.
void host_gemm(const GemmDesc& g, const Vec& a, const Vec& b, Vec& d) {
  const int64_t lda = g.lda ? g.lda : (g.trans_a ? g.M : g.K);
  const int64_t ldb = g.ldb ? g.ldb : (g.trans_b ? g.K : g.N);
  const int64_t ldd = g.ldd ? g.ldd : g.N;
  for (int i = 0; i < g.batch; ++i) {
    for (int m = 0; m < g.M; ++m) {
      for (int n = 0; n < g.N; ++n) {
        double acc = 0.0;
        for (int k = 0; k < g.K; ++k) {
          const double x = a.at(i * g.stride_a + (g.trans_a ? k * lda + m : m * lda + k));
          const double y = b.at(i * g.stride_b + (g.trans_b ? n * ldb + k : k * ldb + n));
          acc += x * y;
        }
        double& out = d.at(i * g.stride_d + m * ldd + n);
        out = g.alpha * acc + (g.accumulate ? out : 0.0);
      }
    }
  }
}

// [B, T, H, D] -> [B, H, T, D] and back (attention_kernels.h).
Vec to_bhtd(const Vec& x, int B, int T, int H, int D) {
  Vec y(x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) y[((b * H + h) * T + t) * D + d] = x[((b * T + t) * H + h) * D + d];
  return y;
}
Vec to_bthd(const Vec& x, int B, int T, int H, int D) {
  Vec y(x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) y[((b * T + t) * H + h) * D + d] = x[((b * H + h) * T + t) * D + d];
  return y;
}

TEST(PlainAttentionLayout, DescsComputeCausalGqaAttentionAndGradients) {
  for (auto [B, T, NH, NKV, HD] : {std::tuple{2, 7, 4, 2, 16}, std::tuple{1, 9, 6, 2, 8}, std::tuple{2, 5, 3, 3, 8},
                                   std::tuple{1, 4, 4, 1, 8}}) {
    const AttentionShape s{B, T, NH, NKV, HD, DType::kF32};
    const PlainAttentionGemms g = plain_attention_gemms(s);
    const int64_t ld = plain_attention_ld(T);
    const int G = NH / NKV;
    const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    auto rnd = [&](size_t n) {
      Vec x(n);
      for (double& e : x) e = u(rng);
      return x;
    };
    const size_t nq = static_cast<size_t>(B) * T * NH * HD, nkv = static_cast<size_t>(B) * T * NKV * HD;
    const Vec q = rnd(nq), k = rnd(nkv), v = rnd(nkv), dout = rnd(nq);
    const size_t rows = static_cast<size_t>(B) * NH * T;
    // The path, on the host.
    const Vec qp = to_bhtd(q, B, T, NH, HD), kp = to_bhtd(k, B, T, NKV, HD), vp = to_bhtd(v, B, T, NKV, HD);
    const Vec dop = to_bhtd(dout, B, T, NH, HD);
    Vec S(rows * ld, 0.0), P(rows * ld, 0.0), O(nq), dP(rows * ld, 0.0), dS(rows * ld, 0.0);
    Vec dQ(nq), dK(nkv), dV(nkv);
    host_gemm(g.scores, qp, kp, S);
    for (size_t r = 0; r < rows; ++r) {  // causal_softmax_forward
      const int t = static_cast<int>(r % T);
      double mx = -1e300, sum = 0.0;
      for (int j = 0; j <= t; ++j) mx = std::max(mx, scale * S[r * ld + j]);
      for (int j = 0; j <= t; ++j) sum += std::exp(scale * S[r * ld + j] - mx);
      for (int j = 0; j <= t; ++j) P[r * ld + j] = std::exp(scale * S[r * ld + j] - mx) / sum;
    }
    host_gemm(g.pv, P, vp, O);
    host_gemm(g.grad_kv, P, dop, dV);
    host_gemm(g.scores, dop, vp, dP);
    for (size_t r = 0; r < rows; ++r) {  // causal_softmax_backward
      const int t = static_cast<int>(r % T);
      double dot = 0.0;
      for (int j = 0; j <= t; ++j) dot += P[r * ld + j] * dP[r * ld + j];
      for (int j = 0; j <= t; ++j) dS[r * ld + j] = scale * P[r * ld + j] * (dP[r * ld + j] - dot);
    }
    host_gemm(g.grad_q, dS, kp, dQ);
    host_gemm(g.grad_kv, dS, qp, dK);
    const Vec out = to_bthd(O, B, T, NH, HD), dq = to_bthd(dQ, B, T, NH, HD);
    const Vec dk = to_bthd(dK, B, T, NKV, HD), dv = to_bthd(dV, B, T, NKV, HD);
    // Direct reference in Ops' layout.
    auto qi = [&](int b, int t, int h, int d) { return ((static_cast<size_t>(b) * T + t) * NH + h) * HD + d; };
    auto ki = [&](int b, int t, int h, int d) { return ((static_cast<size_t>(b) * T + t) * NKV + h) * HD + d; };
    Vec rout(nq, 0.0), rdq(nq, 0.0), rdk(nkv, 0.0), rdv(nkv, 0.0), p(T), dp(T);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < T; ++t) {
          const int kv = h / G;
          double mx = -1e300, sum = 0.0, pdp = 0.0;
          for (int j = 0; j <= t; ++j) {
            double dot = 0.0;
            for (int d = 0; d < HD; ++d) dot += q[qi(b, t, h, d)] * k[ki(b, j, kv, d)];
            p[j] = dot * scale;
            mx = std::max(mx, p[j]);
          }
          for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int j = 0; j <= t; ++j) {
            p[j] /= sum;
            double dot = 0.0;
            for (int d = 0; d < HD; ++d) {
              rout[qi(b, t, h, d)] += p[j] * v[ki(b, j, kv, d)];
              rdv[ki(b, j, kv, d)] += p[j] * dout[qi(b, t, h, d)];
              dot += dout[qi(b, t, h, d)] * v[ki(b, j, kv, d)];
            }
            dp[j] = dot;
          }
          for (int j = 0; j <= t; ++j) pdp += p[j] * dp[j];
          for (int j = 0; j <= t; ++j) {
            const double ds = p[j] * (dp[j] - pdp) * scale;
            for (int d = 0; d < HD; ++d) {
              rdq[qi(b, t, h, d)] += ds * k[ki(b, j, kv, d)];
              rdk[ki(b, j, kv, d)] += ds * q[qi(b, t, h, d)];
            }
          }
        }
    auto max_diff = [](const Vec& a, const Vec& b) {
      double m = 0.0;
      for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
      return m;
    };
    const std::string what = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                             " NKV=" + std::to_string(NKV);
    EXPECT_LT(max_diff(out, rout), 1e-12) << what;
    EXPECT_LT(max_diff(dq, rdq), 1e-12) << what;
    EXPECT_LT(max_diff(dk, rdk), 1e-12) << what;
    EXPECT_LT(max_diff(dv, rdv), 1e-12) << what;
  }
}

TEST(PlainAttentionLayout, ScoreRowsArePaddedToSixteenBytes) {
  EXPECT_EQ(plain_attention_ld(1), 8);
  EXPECT_EQ(plain_attention_ld(7), 8);
  EXPECT_EQ(plain_attention_ld(8), 8);
  EXPECT_EQ(plain_attention_ld(33), 40);
  EXPECT_EQ(plain_attention_ld(1024), 1024);
}

TEST(AttentionKernelLaunch, CoversOddSizesWithOneTail) {
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{2} * 7 * 4 * 16,
                    int64_t{4} * 1024 * 12 * 64}) {
    const LaunchDims l = elementwise_launch(n);
    EXPECT_EQ(l.block, 256);
    EXPECT_GE(l.grid * l.block, n) << n;
    EXPECT_LT((l.grid - 1) * l.block, n) << n;  // no block entirely past the end
  }
  EXPECT_EQ(elementwise_launch(0).grid, 0);
  for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{2} * 4 * 33, int64_t{4} * 12 * 1024}) {
    const LaunchDims l = softmax_launch(rows);
    EXPECT_EQ(l.block, 32 * kSoftmaxRowsPerBlock);  // one warp per row
    EXPECT_GE(l.grid * kSoftmaxRowsPerBlock, rows) << rows;
    EXPECT_LT((l.grid - 1) * kSoftmaxRowsPerBlock, rows) << rows;
  }
  EXPECT_EQ(softmax_launch(0).grid, 0);
}

}  // namespace
}  // namespace trident::cuda
