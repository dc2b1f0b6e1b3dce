// The linear-layer GEMMs of bench_model's presets, one by one, on three ways of running
// them, interleaved rep by rep so machine noise hits all three alike (min of the reps):
//   fixed256  fixed 256x256 output tiles, one single-threaded sgemm each (the grid before
//             sgemm_grid; thread-count independent)
//   grid      sgemm_tiled's shape-only grid (what the model runs; thread-count independent)
//   halves    two row bands of M/2 x N: the fewest tiles that keep two threads busy (the
//             grid is the same on most GEMMs of these presets; it takes more tiles above
//             ~2^29 multiply-adds and splits columns when there are few rows)
//   threaded  one multi-threaded OpenBLAS sgemm (NOT thread-count independent: what that
//             guarantee costs is threaded vs grid)
// Also the process CPU time of each variant (min of the reps): with OMP_WAIT_POLICY=passive
// (idle threads sleep instead of spinning) it is the work itself, which time slicing by
// other processes on a shared machine does not inflate the way it inflates wall time.
// Correctness column `same`: the grid's result with --threads threads is bitwise the one
// with 1 thread, and is within 1e-4 (relative to the row's magnitude) of a float64 loop.
//
//   build/bench/bench_gemm [--preset small|medium|all] [--threads N] [--reps N]
#include <cblas.h>
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/presets.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/sgemm_reference.h"

namespace trident {
namespace {

using cpu::SgemmGrid;
using cpu::sgemm_grid;
using cpu::sgemm_on_grid;
using cpu::sgemm_tiled;

using bench::kPresets;
using bench::Preset;

// One GEMM of a step: C[M, N] (+)= op(A) op(B), `calls` times per step.
struct Gemm {
  std::string name;
  bool trans_a, trans_b;
  int M, N, K;
  float beta;
  int calls;
};

// GPT-2 linear layers (qkv, attention projection, fc, fc projection per layer, and the
// tied lm head): forward out = inp W^T, backward dinp += dout W, dweight += dout^T inp.
std::vector<Gemm> preset_gemms(const Preset& p) {
  const int n = p.micro_batch * p.seq_len, C = p.d_model, L = p.n_layers;
  struct Linear {
    const char* name;
    int IC, OC, calls;
  };
  const Linear linears[] = {{"qkv", C, 3 * C, L},    {"attproj", C, C, L},
                            {"fc", C, 4 * C, L},     {"fcproj", 4 * C, C, L},
                            {"lmhead", C, p.vocab, 1}};
  std::vector<Gemm> out;
  for (const Linear& l : linears) {
    out.push_back({std::string("fwd ") + l.name, false, true, n, l.OC, l.IC, 0.0f, l.calls});
    out.push_back({std::string("dinp ") + l.name, false, false, n, l.IC, l.OC, 1.0f, l.calls});
    out.push_back({std::string("dw ") + l.name, true, false, l.OC, l.IC, n, 1.0f, l.calls});
  }
  return out;
}

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

enum Variant { kFixed256, kGrid, kHalves, kThreaded, kVariants };
const char* const kVariantNames[kVariants] = {"fixed256", "grid", "halves", "threaded"};

void run_variant(Variant v, const Gemm& g, const float* A, int lda, const float* B, int ldb,
                 float* C, int threads) {
  omp_set_num_threads(threads);
  switch (v) {
    case kFixed256:
      sgemm_on_grid({256, 256}, g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, A, lda, B, ldb,
                    g.beta, C, g.N);
      break;
    case kGrid:
      sgemm_tiled(g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, A, lda, B, ldb, g.beta, C, g.N);
      break;
    case kHalves:
      sgemm_on_grid({(g.M / 2 + 15) / 16 * 16, g.N}, g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f,
                    A, lda, B, ldb, g.beta, C, g.N);
      break;
    default:
      cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                  g.trans_b ? CblasTrans : CblasNoTrans, g.M, g.N, g.K, 1.0f, A, lda, B, ldb,
                  g.beta, C, g.N);
  }
}

// Grid result with `threads` threads == with 1 thread, bitwise, and close to float64.
bool check(const Gemm& g, const std::vector<float>& A, int lda, const std::vector<float>& B,
           int ldb, const std::vector<float>& C0, int threads) {
  std::vector<float> c1 = C0, cn = C0;
  run_variant(kGrid, g, A.data(), lda, B.data(), ldb, c1.data(), 1);
  run_variant(kGrid, g, A.data(), lda, B.data(), ldb, cn.data(), threads);
  if (std::memcmp(c1.data(), cn.data(), c1.size() * sizeof(float)) != 0) return false;
  for (int i = 0; i < g.M; i += 97) {  // a sample of rows against float64
    for (int j = 0; j < g.N; ++j) {
      const testing::SgemmReference r =
          testing::sgemm_reference(g.trans_a, g.trans_b, g.K, A.data(), lda, B.data(), ldb,
                                   g.beta, C0[static_cast<size_t>(i) * g.N + j], i, j);
      const double err = std::fabs(r.value - c1[static_cast<size_t>(i) * g.N + j]);
      if (err > 1e-4 * (r.magnitude + 1e-30)) return false;
    }
  }
  return true;
}

int run(int argc, char** argv) {
  std::string preset = "all";
  int threads = omp_get_num_procs(), reps = 20;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--preset small|medium|all] [--threads N] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "%s: --threads and --reps must be >= 1\n", argv[0]);
    return 2;
  }
  std::printf("# trident linear-layer GEMMs, %d threads, min of %d interleaved reps; GFLOP/s\n",
              threads, reps);
  for (const Preset& p : kPresets) {
    if (preset != "all" && preset != p.name) continue;
    std::printf("# preset %s\n", p.name);
    std::printf("# %-12s %5s %5s %5s %11s %6s %9s %9s %9s %9s %5s\n", "gemm", "M", "N", "K",
                "grid", "tiles", kVariantNames[0], kVariantNames[1], kVariantNames[2],
                kVariantNames[3], "same");
    double step_ms[kVariants] = {}, step_cpu_ms[kVariants] = {};
    bool all_same = true;
    uint64_t stream = 0;
    for (const Gemm& g : preset_gemms(p)) {
      const int a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
      const int b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
      std::vector<float> A(static_cast<size_t>(a_rows) * a_cols),
          B(static_cast<size_t>(b_rows) * b_cols), C0(static_cast<size_t>(g.M) * g.N);
      for (std::vector<float>* v : {&A, &B, &C0}) {
        const uint64_t key = rng_key(1234, stream++);
        for (size_t i = 0; i < v->size(); ++i)
          (*v)[i] = static_cast<float>(2.0 * uniform_at(key, i) - 1.0);
      }
      const bool same = check(g, A, a_cols, B, b_cols, C0, threads);
      all_same = all_same && same;
      std::vector<float> C = C0;
      double best[kVariants], best_cpu[kVariants];
      std::fill(best, best + kVariants, 1e30);
      std::fill(best_cpu, best_cpu + kVariants, 1e30);
      for (int r = 0; r < reps; ++r) {
        for (int v = 0; v < kVariants; ++v) {
          const double c0 = cpu_ms();
          Timer t;
          run_variant(static_cast<Variant>(v), g, A.data(), a_cols, B.data(), b_cols, C.data(),
                      threads);
          best[v] = std::min(best[v], t.elapsed_ms());
          best_cpu[v] = std::min(best_cpu[v], cpu_ms() - c0);
        }
      }
      const SgemmGrid grid = sgemm_grid(g.M, g.N, g.K);
      const int tiles = ((g.M + grid.tile_m - 1) / grid.tile_m) *
                        ((g.N + grid.tile_n - 1) / grid.tile_n);
      char grid_s[32];
      std::snprintf(grid_s, sizeof grid_s, "%dx%d", grid.tile_m, grid.tile_n);
      const double gflop = 2.0 * g.M * g.N * g.K * 1e-9;
      std::printf("  %-12s %5d %5d %5d %11s %6d %9.1f %9.1f %9.1f %9.1f %5s\n", g.name.c_str(),
                  g.M, g.N, g.K, grid_s, tiles, gflop / best[0] * 1e3, gflop / best[1] * 1e3,
                  gflop / best[2] * 1e3, gflop / best[3] * 1e3, same ? "yes" : "NO");
      for (int v = 0; v < kVariants; ++v) {
        step_ms[v] += g.calls * best[v];
        step_cpu_ms[v] += g.calls * best_cpu[v];
      }
    }
    std::printf("# %s: linear GEMMs per step, ms: %s %.2f  %s %.2f  %s %.2f  %s %.2f\n", p.name,
                kVariantNames[0], step_ms[0], kVariantNames[1], step_ms[1], kVariantNames[2],
                step_ms[2], kVariantNames[3], step_ms[3]);
    std::printf("# %s: grid/fixed256 %.3f  halves/grid %.3f  threaded/grid %.3f\n", p.name,
                step_ms[1] / step_ms[0], step_ms[2] / step_ms[1], step_ms[3] / step_ms[1]);
    std::printf("# %s: CPU ms per step: %s %.2f  %s %.2f  %s %.2f  %s %.2f\n", p.name,
                kVariantNames[0], step_cpu_ms[0], kVariantNames[1], step_cpu_ms[1],
                kVariantNames[2], step_cpu_ms[2], kVariantNames[3], step_cpu_ms[3]);
    if (!all_same) std::printf("# %s: WRONG: a grid result differs across thread counts\n", p.name);
  }
  return 0;
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) { return trident::run(argc, argv); }
