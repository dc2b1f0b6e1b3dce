// Linear layer through OpenBLAS sgemm. A multi-threaded OpenBLAS sgemm does NOT give
// the same bits for different thread counts (the per-thread split changes which
// micro-kernel computes each element), so sgemm_tiled cuts the output into tiles of a
// fixed size and runs one single-threaded sgemm per tile: the result depends only on
// the problem shape.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

constexpr int kTileM = 256;
constexpr int kTileN = 256;

}  // namespace

void sgemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const int tm = (M + kTileM - 1) / kTileM, tn = (N + kTileN - 1) / kTileN;
  const int tiles = tm * tn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int t = 0; t < tiles; ++t) {
    omp_set_num_threads(1);  // this tile's sgemm runs on this thread only
    const int i0 = (t / tn) * kTileM, j0 = (t % tn) * kTileN;
    const int m = std::min(kTileM, M - i0), n = std::min(kTileN, N - j0);
    const float* a = trans_a ? A + i0 : A + static_cast<long>(i0) * lda;
    const float* b = trans_b ? B + static_cast<long>(j0) * ldb : B + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b, ldb, beta,
                C + static_cast<long>(i0) * ldc + j0, ldc);
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
  sgemm_tiled(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static) if (static_cast<long>(N) * OC >= \
                                                  static_cast<long>(kParallelMinElems))
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<long>(n) * OC;
    for (int c = 0; c < OC; ++c) o[c] += bias[c];
  }
}

void column_sum_accumulate(float* dst, const float* src, int N, int C) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (static_cast<long>(N) * C >= \
                                                  static_cast<long>(kParallelMinElems) && \
                                              blocks > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* s = src + static_cast<long>(n) * C;
      for (int c = c0; c < c1; ++c) acc[c - c0] += s[c];
    }
    for (int c = c0; c < c1; ++c) dst[c] += acc[c - c0];
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC) {
  if (dinp != nullptr) {  // dinp[N, IC] += dout[N, OC] @ weight[OC, IC]
    sgemm_tiled(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
  }
  if (dweight != nullptr) {  // dweight[OC, IC] += dout^T @ inp
    sgemm_tiled(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  }
  if (dbias != nullptr) column_sum_accumulate(dbias, dout, N, OC);
}

}  // namespace trident::cpu
