// sgemm_tiled's shape-only tile grid (kernels/cpu/matmul.cpp): the grid splits into an
// even number of equal tiles where the shape allows, and the result is bitwise the same
// for 1, 2 and 3 threads and run to run, and close to a float64 product.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/sgemm_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

using cpu::SgemmGrid;

int tile_count(int M, int N, SgemmGrid g) {
  return ((M + g.tile_m - 1) / g.tile_m) * ((N + g.tile_n - 1) / g.tile_n);
}

TEST(SgemmGrid, EvenEqualTilesForModelShapesAndOneTileWhenSmall) {
  // The medium preset's linear layers (tokens 1024, d_model 384): forward, dinp, dweight.
  const int shapes[][3] = {{1024, 1152, 384}, {1024, 384, 1152}, {1152, 384, 1024},
                           {1024, 384, 384},  {384, 384, 1024},  {1024, 1536, 384},
                           {1024, 384, 1536}, {1536, 384, 1024}, {384, 1536, 1024},
                           {256, 384, 128},   {128, 128, 256},   {256, 128, 512}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    const SgemmGrid g = cpu::sgemm_grid(M, N, K);
    const std::string what = std::to_string(M) + "x" + std::to_string(N) + "x" +
                             std::to_string(K) + " grid " + std::to_string(g.tile_m) + "x" +
                             std::to_string(g.tile_n);
    EXPECT_EQ(M % g.tile_m, 0) << what;
    EXPECT_EQ(N % g.tile_n, 0) << what;
    EXPECT_EQ(tile_count(M, N, g) % 2, 0) << what;
    EXPECT_TRUE(g.tile_m == M || g.tile_m % 16 == 0) << what;
    EXPECT_TRUE(g.tile_n == N || g.tile_n % 16 == 0) << what;
    // The same shape always gets the same grid (nothing else goes in).
    const SgemmGrid again = cpu::sgemm_grid(M, N, K);
    EXPECT_EQ(again.tile_m, g.tile_m) << what;
    EXPECT_EQ(again.tile_n, g.tile_n) << what;
  }
  const SgemmGrid tiny = cpu::sgemm_grid(37, 11, 13);
  EXPECT_EQ(tiny.tile_m, 37);
  EXPECT_EQ(tiny.tile_n, 11);
  // A ragged shape still covers the output with tiles no larger than it.
  const SgemmGrid ragged = cpu::sgemm_grid(333, 777, 500);
  EXPECT_GE(tile_count(333, 777, ragged), 2);
  EXPECT_LE(ragged.tile_m, 333);
  EXPECT_LE(ragged.tile_n, 777);
}

struct Case {
  bool trans_a, trans_b;
  int M, N, K;
  float beta;
};

TEST(SgemmGrid, BitwiseSameForOneTwoThreeThreadsAndCloseToFloat64) {
  const Case cases[] = {
      {false, true, 512, 768, 256, 0.0f},  // forward-shaped, splits into row bands
      {false, false, 512, 256, 768, 1.0f},  // dinp-shaped, accumulates
      {true, false, 768, 256, 512, 1.0f},   // dweight-shaped
      {true, false, 192, 1024, 512, 1.0f},  // few rows: splits columns too
      {false, true, 333, 777, 200, 0.0f},   // ragged edges
      {true, true, 130, 1030, 64, 1.0f},
      {false, false, 37, 11, 13, 1.0f},  // one tile
  };
  uint32_t seed = 77;
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                             std::to_string(c.K) + " ta" + std::to_string(c.trans_a) + " tb" +
                             std::to_string(c.trans_b);
    const int lda = c.trans_a ? c.M : c.K, ldb = c.trans_b ? c.K : c.N;
    const VecF A = random_vec(static_cast<size_t>(c.M) * c.K, seed++);
    const VecF B = random_vec(static_cast<size_t>(c.K) * c.N, seed++);
    const VecF C0 = random_vec(static_cast<size_t>(c.M) * c.N, seed++);
    auto run = [&](int threads) {
      VecF C = C0;
      omp_set_num_threads(threads);
      cpu::sgemm_tiled(c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb,
                       c.beta, C.data(), c.N);
      return C;
    };
    const VecF one = run(1);
    for (int threads : {2, 3, 2}) {
      const VecF other = run(threads);
      EXPECT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0)
          << what << ": " << threads << " threads differ from 1";
    }
    double worst = 0;
    for (int i = 0; i < c.M; i += 3) {  // every third row: enough, and fast
      for (int j = 0; j < c.N; ++j) {
        const SgemmReference r = sgemm_reference(c.trans_a, c.trans_b, c.K, A.data(), lda,
                                                 B.data(), ldb, c.beta,
                                                 C0[static_cast<size_t>(i) * c.N + j], i, j);
        worst = std::max(worst,
                         std::fabs(one[static_cast<size_t>(i) * c.N + j] - r.value) / r.magnitude);
      }
    }
    EXPECT_LT(worst, 1e-6) << what << ": error relative to sum |a b|";
  }
  omp_set_num_threads(2);
}

}  // namespace
}  // namespace trident::testing
