// Launch configurations of the CUDA kernels (kernels/cuda/*.cu): pure host arithmetic,
// no CUDA headers, so every grid and block size is unit-tested without a device
// (tests/kernels/cuda/cuda_ops_host_test.cpp).
//
// Four shapes of launch cover every kernel:
// - elementwise: a 1-D grid-stride loop over n elements, kBlock threads a block, the grid
//   capped at kMaxElementwiseBlocks (each thread then handles several elements; the loop
//   covers the tail). n = 0 launches nothing (grid 0).
// - rows: one warp per row (norms) or one block per row (cross-entropy); rows above the
//   grid limit are covered by a row-stride loop inside the kernel.
// - columns: one thread per column, walking rows in order, optionally times a y dimension
//   (dwpe: one y per position). The reductions over many rows (norm dweight / dbias, the
//   matmul bias gradient) run in two passes: a thread per (column, chunk of
//   kColumnRowChunk rows) sums its chunk in row order into a partial, then a thread per
//   column adds the partials in chunk order. The tree depends only on N: deterministic,
//   no atomics, and with N <= kColumnRowChunk bitwise the CPU's row-order sum.
// - the fixed-chunk sum of squares: one block per kSumChunk elements (the tree depends on
//   n only), then one block over the partials.
// A zero-size launch is skipped by the caller (grid.x == 0), never launched: CUDA rejects
// a zero grid with cudaErrorInvalidConfiguration.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace trident::cuda {

// Threads per block of every kernel: 8 warps, a multiple of 32 the hardware schedules well.
inline constexpr unsigned kBlock = 256;
inline constexpr unsigned kWarp = 32;
inline constexpr unsigned kWarpsPerBlock = kBlock / kWarp;
// CUDA's grid limits: x up to 2^31 - 1, y and z up to 65535.
inline constexpr uint64_t kMaxGridX = 2147483647u;
inline constexpr unsigned kMaxGridY = 65535u;
// Elementwise grids stop here: 2^16 blocks of 256 threads = 16M threads, enough to fill an
// H200 (132 SMs x 2048 threads) many times; larger n loops (grid-stride).
inline constexpr uint64_t kMaxElementwiseBlocks = 65536;
// Row grids stop here; a kernel loops over rows row += gridDim.x * rows_per_block.
inline constexpr uint64_t kMaxRowBlocks = 1u << 20;
// Elements per block of the sum of squares' first pass (the CPU uses the same chunk).
inline constexpr uint64_t kSumChunk = 16384;
// Rows per partial of the two-pass column reductions: 32 rows keep a GPT-2 step's
// N = 16k rows x 768 columns at 1.5k blocks (one pass over N rows by 768 threads alone would
// use 3 of the H200's 132 SMs).
inline constexpr uint64_t kColumnRowChunk = 32;
// Vocabulary rows of the embedding backward are split over this many y-blocks: a thread
// (column c, split y) adds the tokens whose local row % splits == y, in token order.
inline constexpr unsigned kEmbeddingSplits = 64;

struct Launch {
  unsigned grid_x = 0, grid_y = 1;  // grid_x == 0: nothing to launch
  unsigned block = kBlock;
  bool empty() const { return grid_x == 0; }
};

inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// 1-D grid-stride over n elements.
inline Launch elementwise_launch(uint64_t n) {
  Launch l;
  l.grid_x = static_cast<unsigned>(std::min(ceil_div(n, kBlock), kMaxElementwiseBlocks));
  return l;
}

// Elements each thread of an elementwise launch handles at most (the grid-stride loop's
// trip count): 0 for n = 0.
inline uint64_t elements_per_thread(uint64_t n) {
  const Launch l = elementwise_launch(n);
  if (l.empty()) return 0;
  return ceil_div(n, static_cast<uint64_t>(l.grid_x) * l.block);
}

// One warp per row, kWarpsPerBlock rows per block.
inline Launch warp_per_row_launch(uint64_t rows) {
  Launch l;
  l.grid_x = static_cast<unsigned>(std::min(ceil_div(rows, kWarpsPerBlock), kMaxRowBlocks));
  return l;
}

// One block per row.
inline Launch block_per_row_launch(uint64_t rows) {
  Launch l;
  l.grid_x = static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
  return l;
}

// One thread per column (a reduction over rows in row order), times `ys` independent
// y-slices (dwpe: one per position). Columns are ints in Ops, so the grid stays far below
// kMaxGridX; y is capped at kMaxGridY and the kernel loops y += gridDim.y.
inline Launch column_launch(uint64_t columns, uint64_t ys = 1) {
  Launch l;
  if (columns == 0 || ys == 0) return l;
  l.grid_x = static_cast<unsigned>(ceil_div(columns, kBlock));
  l.grid_y = static_cast<unsigned>(std::min<uint64_t>(ys, kMaxGridY));
  return l;
}

// The two-pass column reduction over N rows: the number of partials per column, and the
// first pass's launch (x: columns, y: chunks, capped; the kernel loops chunk += gridDim.y).
// The partial buffer holds column_chunks(N) * C floats.
inline uint64_t column_chunks(uint64_t rows) { return ceil_div(rows, kColumnRowChunk); }
inline Launch column_chunk_launch(uint64_t columns, uint64_t rows) {
  return column_launch(columns, column_chunks(rows));
}

// Embedding backward over dwte: columns x min(vocab_local, kEmbeddingSplits) splits.
inline Launch embedding_backward_launch(uint64_t columns, uint64_t vocab_local) {
  return column_launch(columns, std::min<uint64_t>(vocab_local, kEmbeddingSplits));
}

// The sum of squares' first pass: one block, hence one double partial, per kSumChunk.
inline uint64_t sum_squares_partials(uint64_t n) { return ceil_div(n, kSumChunk); }

// Whether a GEMM's layout suits cuBLASLt (GemmEngine::run): every stored matrix's row
// length (A: trans_a ? M : K columns, B: trans_b ? K : N, D: N) a multiple of 8 elements
// (16 bytes in bf16, 32 in f32) and every pointer 16-byte aligned. Stricter than
// GemmEngine's own rule on purpose: what passes here passes there in either dtype. Other
// GEMMs (odd test shapes) run simple_gemm (cuda_kernels.h).
inline bool gemm_layout_ok(bool trans_a, bool trans_b, uint64_t M, uint64_t N, uint64_t K,
                           std::initializer_list<uintptr_t> addresses) {
  const uint64_t cols_a = trans_a ? M : K, cols_b = trans_b ? K : N;
  if (cols_a % 8 != 0 || cols_b % 8 != 0 || N % 8 != 0) return false;
  for (uintptr_t p : addresses)
    if (p % 16 != 0) return false;
  return true;
}

}  // namespace trident::cuda
