// CPU kernels behind CpuOps (kernels/cpu/cpu_ops.cpp): free functions, one group per
// file, with exactly the semantics documented in kernels/ops.h (backward accumulates,
// null gradients skipped, cross_entropy_backward overwrites and may alias).
//
// Threads: each function parallelises with OpenMP using the calling thread's
// nthreads-var (CpuOps sets it before every call). Results are bitwise independent of
// the thread count: every reduction over rows either runs serially per output column
// block or over a fixed chunking, never over "one chunk per thread".
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace trident::cpu {

// embedding.cpp
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int vocab_begin, int vocab_local);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int vocab_begin, int vocab_local);

// norm.cpp
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                     int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// matmul.cpp
// Row-major C[M, N] = alpha * op(A) op(B) + beta * C, op = transpose when asked. Cut into
// the tiles of sgemm_grid(M, N, K), one single-threaded OpenBLAS call per tile, tiles
// spread over the OpenMP threads: bitwise the same for any thread count (the bits do
// depend on the tile shape, which depends on the problem shape only).
void sgemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The output tile shape sgemm_tiled uses for C[M, N] with inner dimension K: a function
// of (M, N, K) only, never of the thread count (that is the determinism contract).
struct SgemmGrid {
  int tile_m;  // rows of C per tile (the last row band may be shorter)
  int tile_n;  // columns of C per tile (the last column band may be narrower)
};
SgemmGrid sgemm_grid(int M, int N, int K);
// sgemm_tiled on an explicit grid (benchmarks and tests compare grids with it).
void sgemm_on_grid(SgemmGrid grid, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const float* A, int lda, const float* B, int ldb, float beta, float* C,
                   int ldc);
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC);
// dinp += dout @ weight (dinp = ... when set_dinp: beta 0, dinp not read); dweight and dbias
// accumulate.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC,
                     bool set_dinp = false);
// dst[C] += sum over the N rows of src[N, C]; rows summed in order (deterministic).
void column_sum_accumulate(float* dst, const float* src, int N, int C);

// rope.cpp
void rope_forward(float* x, int B, int T, int H, int HD, float theta, int pos_offset);
void rope_backward(float* dx, int B, int T, int H, int HD, float theta, int pos_offset);
// Ops::qkv_split / qkv_merge: the fused projection's rows [B, T, (NH + 2 NKV) HD] to and
// from the separate q, k, v, q and k rotated (as rope_forward / rope_backward) when `rotate`.
void qkv_split(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int NKV,
               int HD, bool rotate, float theta, int pos_offset);
void qkv_merge(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T,
               int NH, int NKV, int HD, bool rotate, float theta, int pos_offset);

// attention.cpp
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int NH,
                        int NKV, int HD);
// The caches are [B, capacity, NKV, HD] (only positions < pos + Tq are read).
void attention_cached_forward(float* out, const float* q, const float* k_cache,
                              const float* v_cache, int B, int Tq, int pos, int capacity, int NH,
                              int NKV, int HD);
// Block attention (kernels/ops.h "Block attention"), with the row strides resolved.
struct BlockShape {
  int B, Tq, Tk, q_rows, kv_rows, q_pos, k_pos, NH, NKV, HD;
};
void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const BlockShape& s);
void attention_block_merge(float* out, float* lse, const float* block_out,
                           const float* block_lse, int B, int Tq, int q_rows, int NH, int HD);
void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const BlockShape& s);

// activation.cpp
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n);
void swiglu_forward(float* out, const float* gate, const float* up, size_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t n);
// moe.cpp
void moe_route_forward(float* weights, int32_t* experts, float* probs, float* lse, float* stats,
                       const float* logits, int N, int E, int K);
void moe_route_backward(float* dlogits, const float* dweights, const float* weights,
                        const float* probs, const float* lse, const int32_t* experts,
                        const float* prob_grad, float z_scale, int N, int E, int K);
void moe_dispatch(int32_t* order, int32_t* position, const int32_t* experts, int N, int K,
                  int E);
void moe_gather_forward(float* out, const float* inp, const int32_t* order, int N, int K, int C);
void moe_gather_backward(float* dinp, const float* dout, const int32_t* position, int N, int K,
                         int C);
void moe_combine_forward(float* out, const float* inp, const float* weights,
                         const int32_t* position, int N, int K, int C);
void moe_combine_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                          const float* weights, const int32_t* position, int N, int K, int C);

void add(float* out, const float* a, const float* b, size_t n);
void accumulate(float* dst, const float* src, size_t n);
void scale(float* x, float s, size_t n);

// cross_entropy.cpp
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                           int V, int Vp);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            float dloss, int N, int V, int Vp);
// Vocab-parallel steps (see kernels/ops.h): logits[N, Vp_local] hold global columns
// [vocab_begin, vocab_begin + Vp_local), real while < V.
void xent_local_max(float* row_max, const float* logits, int N, int Vp_local, int vocab_begin,
                    int V);
void xent_local_sums(float* sum_exp, float* target_logit, const float* logits,
                     const float* row_max, const int32_t* targets, int N, int Vp_local,
                     int vocab_begin, int V);
void xent_local_backward(float* dlogits, const float* logits, const float* row_max,
                         const float* sum_exp, const int32_t* targets, float dloss, int N,
                         int Vp_local, int vocab_begin, int V);
// losses[n] = log(sum_exp[n]) + row_max[n] - target_logit[n].
void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                 const float* target_logit, int N);
// *acc += float(sum_n losses[n] / N), summed in double in row order.
void loss_accumulate(double* acc, const float* losses, int N);

// adamw.cpp
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWParams& p);
double sum_squares(const float* x, size_t n);

}  // namespace trident::cpu
