// The plain attention path's own kernels (attention_kernels.cu, one nvcc translation
// unit); attention_plain.cpp calls them, and cuda_ops.cpp the cached attention's. Every launcher takes raw device pointers
// of the dtype it names (f32 or bf16), enqueues on `stream` and CHECK-fails on a launch
// error. Index arithmetic is 64-bit, so B*H*T*T beyond 2^31 is fine.
//
// Layouts: "bthd" is Ops' [B, T, H, D]; "bhtd" is [B, H, T, D]. In bhtd the query heads
// of one kv group (h = kv * G + g, G = NH / NKV) are adjacent, so a group is one batch
// entry of G*T rows for the batched GEMMs.
// Scores and probabilities are [rows, ld] with rows = B*NH*T (row r is query position
// t = r % T) and ld >= T; columns j > t are masked (probability 0), and columns T..ld-1 are
// padding, written as 0.
#pragma once

#include <cstdint>

#include "core/tensor.h"

struct CUstream_st;

namespace trident::cuda {

// Launch shapes, host arithmetic exposed for tests.
struct LaunchDims {
  int64_t grid = 0;
  int block = 0;
};
// One thread per element.
LaunchDims elementwise_launch(int64_t n);
// One warp per row, kRowsPerBlock rows per block.
inline constexpr int kSoftmaxRowsPerBlock = 8;
LaunchDims softmax_launch(int64_t rows);

// dst[B, H, T, D] = src[B, T, H, D] (same dtype).
void permute_bthd_to_bhtd(void* dst, const void* src, DType dtype, int B, int T, int H, int D,
                          CUstream_st* stream);
// dst[B, T, H, D] = src[B, H, T, D] (same dtype).
void permute_bhtd_to_bthd(void* dst, const void* src, DType dtype, int B, int T, int H, int D,
                          CUstream_st* stream);

// p[r, j] = softmax_j(scale * s[r, j'] for j' <= t) for j <= t, else 0; s f32, p in
// p_dtype, rounded once. fp32 math.
void causal_softmax_forward(void* p, DType p_dtype, const float* s, int64_t rows, int T,
                            int64_t ld, float scale, CUstream_st* stream);
// ds[r, j] = scale * p[r, j] * (dp[r, j] - sum_{j' <= t} p[r, j'] dp[r, j']) for j <= t,
// else 0. p and ds in `dtype`, dp f32. fp32 math; ds rounded once.
void causal_softmax_backward(void* ds, const void* p, DType dtype, const float* dp, int64_t rows,
                             int T, int64_t ld, float scale, CUstream_st* stream);

// Ops::attention_cached_forward (kernels/ops.h): q and out [B, Tq, NH, HD], the caches
// [B, capacity, NKV, HD], all of `dtype`; query row i (position pos + i) attends to cache
// positions 0 .. pos + i. One block of kCachedAttentionBlock threads per (head, query row,
// sequence): the scores of the row in `scores` (f32 scratch, B * Tq * NH * (pos + Tq)
// floats), a block max, exponentials and a block sum, then each output element as the
// sum of probability * value over the positions. fp32 math, the output rounded once.
// Simple and obviously correct rather than fast (a decode step is one query row).
inline constexpr int kCachedAttentionBlock = 128;
void cached_attention_forward(void* out, const void* q, const void* k_cache, const void* v_cache,
                              DType dtype, float* scores, int B, int Tq, int pos, int capacity,
                              int NH, int NKV, int HD, CUstream_st* stream);

}  // namespace trident::cuda
