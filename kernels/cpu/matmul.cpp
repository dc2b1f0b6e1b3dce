// Linear layer through OpenBLAS sgemm. A multi-threaded OpenBLAS sgemm does NOT give
// the same bits for different thread counts (the per-thread split changes which
// micro-kernel computes each element), and neither does a single-threaded sgemm for
// different tile shapes (measured on OpenBLAS 0.3.21, Zen kernels: whole matrix, 256x256,
// M/2 x N tiles all differ in some elements). So sgemm_tiled cuts the output into a grid
// that depends only on the problem shape (sgemm_grid) and runs one single-threaded sgemm
// per tile: the result depends only on (M, N, K), never on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

// Tiles of about this many multiply-adds (~7 ms on one Zen 3 core). Fewer, larger tiles
// repack the shared panel fewer times: on the 2-core machines this project runs on, two
// row bands per GEMM took 2-7% less time than the 4-6 tiles of 2^27 MACs (bench_gemm,
// docs/PERFORMANCE.md), and with one thread per MPI rank fewer tiles are faster still.
// GEMMs larger than the medium preset's still get enough tiles for more threads.
constexpr long kTileMacs = long{1} << 28;
// Below this (~25 us on one core) one tile: the fork costs more than it saves.
constexpr long kSplitMacs = long{1} << 20;
// Band heights / widths are multiples of this (a multiple of OpenBLAS's x86 sgemm
// register blocks), so only the grid's last band can have a ragged edge.
constexpr int kAlign = 16;
// Row bands thinner than this run measurably slower in OpenBLAS than splitting columns.
constexpr int kMinBandRows = 128;

int round_up(int x, int to) { return (x + to - 1) / to * to; }
int ceil_div(long a, long b) { return static_cast<int>((a + b - 1) / b); }

// rows x cols = tiles, rows as many as the row bands allow (see sgemm_grid); 0x0 when
// `tiles` does not factor that way.
SgemmGrid grid_of(int M, int N, int tiles) {
  int rows = std::clamp(M / kMinBandRows, 1, tiles);
  while (tiles % rows != 0) --rows;
  const int cols = tiles / rows;
  if (cols > 1 && N / cols < kAlign) return {0, 0};
  const int tile_m = rows == 1 ? M : round_up(ceil_div(M, rows), kAlign);
  const int tile_n = cols == 1 ? N : round_up(ceil_div(N, cols), kAlign);
  return {std::min(tile_m, M), std::min(tile_n, N)};
}

bool equal_tiles(int M, int N, SgemmGrid g) {
  return g.tile_m > 0 && M % g.tile_m == 0 && N % g.tile_n == 0;
}

}  // namespace

// Row bands first: a tile as wide as the output (OpenBLAS's inner, packed-per-block
// dimension) was faster than any split of N in every measured model shape; columns are
// split only when the rows cannot give enough tiles. The tile count is even, so that two
// threads (this project's machines) get equal shares, and among the even counts nearest
// to macs / kTileMacs the first whose tiles are all the same size is taken (a short last
// band would leave one thread idle at the end).
SgemmGrid sgemm_grid(int M, int N, int K) {
  const long macs = static_cast<long>(M) * N * K;
  if (macs < kSplitMacs) return {M, N};
  const int target = std::max(1, static_cast<int>((macs + kTileMacs / 2) / kTileMacs));
  const int base = std::max(2, target + (target & 1));
  SgemmGrid fallback = grid_of(M, N, base);
  if (fallback.tile_m == 0) fallback = grid_of(M, N, 2);
  if (fallback.tile_m == 0) return {M, N};
  for (int d = 0; d <= base; d += 2) {  // base, base - 2, base + 2, base - 4, ...
    for (const int tiles : {base - d, base + d}) {
      if (tiles < 2) continue;
      const SgemmGrid g = grid_of(M, N, tiles);
      if (equal_tiles(M, N, g)) return g;
    }
  }
  return fallback;
}

namespace {

// sgemm_on_grid, then (bias != null) C[i, j] += bias[j] on each tile right after its
// sgemm, while the tile is still (partly) in cache: the same two roundings per element as
// the separate parallel pass over C it replaces (no step time difference was measurable).
void sgemm_grid_bias(SgemmGrid grid, bool trans_a, bool trans_b, int M, int N, int K,
                     float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                     float* C, int ldc, const float* bias) {
  if (M <= 0 || N <= 0) return;
  const int tile_m = std::max(1, grid.tile_m), tile_n = std::max(1, grid.tile_n);
  const int tm = ceil_div(M, tile_m), tn = ceil_div(N, tile_n);
  const int tiles = tm * tn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int t = 0; t < tiles; ++t) {
    omp_set_num_threads(1);  // this tile's sgemm runs on this thread only
    const int i0 = (t / tn) * tile_m, j0 = (t % tn) * tile_n;
    const int m = std::min(tile_m, M - i0), n = std::min(tile_n, N - j0);
    const float* a = trans_a ? A + i0 : A + static_cast<long>(i0) * lda;
    const float* b = trans_b ? B + static_cast<long>(j0) * ldb : B + j0;
    float* c = C + static_cast<long>(i0) * ldc + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b, ldb, beta, c,
                ldc);
    if (bias == nullptr) continue;
    const float* bj = bias + j0;
    for (int i = 0; i < m; ++i) {
      float* row = c + static_cast<long>(i) * ldc;
      for (int j = 0; j < n; ++j) row[j] += bj[j];
    }
  }
}

}  // namespace

void sgemm_on_grid(SgemmGrid grid, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const float* A, int lda, const float* B, int ldb, float beta, float* C,
                   int ldc) {
  sgemm_grid_bias(grid, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr);
}

void sgemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  sgemm_on_grid(sgemm_grid(M, N, K), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

// out = inp @ weight^T (+ bias): the bias joins each output tile after its sgemm.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
  sgemm_grid_bias(sgemm_grid(N, OC, IC), false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f,
                  out, OC, bias);
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
                     const float* inp, const float* weight, int N, int IC, int OC,
                     bool set_dinp) {
  if (dinp != nullptr) {  // dinp[N, IC] (+)= dout[N, OC] @ weight[OC, IC]
    sgemm_tiled(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, set_dinp ? 0.0f : 1.0f, dinp,
                IC);
  }
  if (dweight != nullptr) {  // dweight[OC, IC] += dout^T @ inp
    sgemm_tiled(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  }
  if (dbias != nullptr) column_sum_accumulate(dbias, dout, N, OC);
}

}  // namespace trident::cpu
