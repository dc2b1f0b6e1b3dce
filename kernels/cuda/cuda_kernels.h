// The CUDA kernels behind CudaOps (kernels/cuda/cuda_ops.cpp), as host launch functions
// with exactly the semantics of kernels/ops.h (backward accumulates, null gradients are
// skipped, the cross-entropy backwards overwrite and may alias). No CUDA header here:
// cuda_ops.cpp is plain C++ and the kernels live in four nvcc translation units
// (elementwise.cu, norm.cu, embedding_xent.cu, adamw_reduce.cu).
//
// Every launcher enqueues on `stream`, checks the launch (cudaGetLastError, aborting with
// file:line) and skips a zero-size launch. Arithmetic is fp32; an FArg is widened exactly
// on load and rounded to nearest even (__float2bfloat16_rn, = float_to_bf16) on store, per
// argument: the dtype is a field, tested in the kernel (uniform across a launch, so the
// branch costs nothing measurable next to the memory traffic). Reductions run in a fixed
// order that depends only on the sizes: results are deterministic, no float atomics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/memory.h"

struct CUstream_st;

namespace trident::cuda {

// An F (f32 or bf16) device argument; p == nullptr is "absent".
struct FArg {
  void* p = nullptr;
  bool bf16 = false;
};
// The FArg of a DevPtr (the caller has checked that its dtype is f32 or bf16).
inline FArg farg(DevPtr d) { return FArg{d.raw(), d.dtype() == DType::kBF16}; }

using Stream = CUstream_st*;

// elementwise.cu
void cast(FArg dst, FArg src, size_t n, Stream s);
void gelu_forward(FArg out, FArg inp, size_t n, Stream s);
void gelu_backward(FArg dinp, FArg dout, FArg inp, size_t n, Stream s);
void swiglu_forward(FArg out, FArg gate, FArg up, size_t n, Stream s);
void swiglu_backward(FArg dgate, FArg dup, FArg dout, FArg gate, FArg up, size_t n, Stream s);
void add(FArg out, FArg a, FArg b, size_t n, Stream s);
void accumulate(FArg dst, FArg src, size_t n, Stream s);
void scale(FArg x, float factor, size_t n, Stream s);
// `table`: rope_table_bytes(T, HD) of device scratch, rewritten by each call.
size_t rope_table_bytes(int T, int HD);
void rope(FArg x, void* table, int B, int T, int H, int HD, float theta, int pos_offset,
          float sign, Stream s);
// Ops::qkv_split (to_parts, sign +1) and qkv_merge (sign -1); `table` as rope's (unused
// unless `rotate`).
void qkv_permute(FArg q, FArg k, FArg v, FArg qkv, void* table, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset, float sign, bool to_parts,
                 Stream s);
// The GEMM for layouts cuBLASLt (GemmEngine) does not take (launch.h gemm_layout_ok):
// row-major D[M, N] = op(A)[M, K] @ op(B)[K, N] (+ D when accumulate) (+ bias[N]), op(X) =
// X^T when trans_x; one thread per output element, fp32 products summed in k order, any
// mix of dtypes, the result rounded once. Simple and slow: for odd shapes (tests, tiny
// models), not for the aligned shapes of real models.
void simple_gemm(bool trans_a, bool trans_b, int M, int N, int K, FArg a, FArg b, FArg d,
                 FArg bias, bool accumulate, Stream s);
// The same with row strides (elements), `batch` matrices at batch strides (elements) and
// D = alpha * op(A) op(B) (+ D) (+ bias): GemmEngine's last resort when cuBLASLt offers
// no algorithm for a desc (gemm.h).
struct SimpleGemmLayout {
  int64_t lda = 0, ldb = 0, ldd = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  float alpha = 1.0f;
};
void simple_gemm(bool trans_a, bool trans_b, int M, int N, int K, FArg a, FArg b, FArg d,
                 FArg bias, bool accumulate, const SimpleGemmLayout& layout, Stream s);

// norm.cu
// The dweight / dbias / column-sum reductions take `partials`: scratch of
// column_chunks(N) * C floats (launch.h), twice that for layernorm_backward with both
// dweight and dbias.
void layernorm_forward(FArg out, float* mean, float* rstd, FArg inp, FArg weight, FArg bias,
                       int N, int C, float eps, Stream s);
void layernorm_backward(FArg dinp, float* dweight, float* dbias, FArg dout, FArg inp,
                        FArg weight, const float* mean, const float* rstd, int N, int C,
                        float* partials, Stream s);
void rmsnorm_forward(FArg out, float* rstd, FArg inp, FArg weight, int N, int C, float eps,
                     Stream s);
void rmsnorm_backward(FArg dinp, float* dweight, FArg dout, FArg inp, FArg weight,
                      const float* rstd, int N, int C, float* partials, Stream s);
// dst[C] += sum over the N rows of src[N, C] (the matmul bias gradient), two-pass.
void column_sum_accumulate(float* dst, FArg src, int N, int C, float* partials, Stream s);

// embedding_xent.cu
void embedding_forward(FArg out, const int32_t* tokens, FArg wte, FArg wpe, int B, int T, int C,
                       int vocab_begin, int vocab_local, Stream s);
void embedding_backward(float* dwte, float* dwpe, FArg dout, const int32_t* tokens, int B, int T,
                        int C, int vocab_begin, int vocab_local, Stream s);
// The fused cross-entropy is the vocab-parallel one with one rank (vocab_begin 0), exactly
// as on the CPU: losses / dlogits for out-of-range targets are NaN (a programming error
// the CPU CHECK-fails on; a kernel cannot, so it poisons the row).
void cross_entropy_forward(float* losses, FArg logits, const int32_t* targets, int N, int V,
                           int Vp, Stream s);
void cross_entropy_backward(FArg dlogits, FArg logits, const int32_t* targets, float dloss, int N,
                            int V, int Vp, Stream s);
void xent_local_max(float* row_max, FArg logits, int N, int Vp_local, int vocab_begin, int V,
                    Stream s);
void xent_local_sums(float* sum_exp, float* target_logit, FArg logits, const float* row_max,
                     const int32_t* targets, int N, int Vp_local, int vocab_begin, int V,
                     Stream s);
void xent_local_backward(FArg dlogits, FArg logits, const float* row_max, const float* sum_exp,
                         const int32_t* targets, float dloss, int N, int Vp_local, int vocab_begin,
                         int V, Stream s);
void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                 const float* target_logit, int N, Stream s);

// adamw_reduce.cu
// bc1, bc2: the bias corrections 1 - beta^step, computed on the host in double and rounded
// once (as the CPU does). compute_copy may be null.
void adamw_update(float* param, const float* grad, float* m, float* v, uint16_t* compute_copy,
                  size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float bc1, float bc2, Stream s);
// *acc += float(sum_n losses[n] / N), the sum in double in row order (one thread).
void loss_accumulate(double* acc, const float* losses, int N, Stream s);
// *acc += sum of x[i]^2 in double: pass 1 writes one partial per kSumChunk elements into
// `partials` (sum_squares_partials(n) doubles), pass 2 adds them in a fixed tree.
void sum_squares_accumulate(double* acc, FArg x, size_t n, double* partials, Stream s);

}  // namespace trident::cuda
