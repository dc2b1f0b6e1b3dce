// The CUDA backend: kernels/ops.h on one device and one compute stream (non-blocking).
//
// - Memory: stream-ordered cudaMallocAsync (zero-filled with cudaMemsetAsync; 256-byte
//   aligned by the CUDA allocator) and cudaFreeAsync, from the device's default pool with
//   the release threshold raised so freed memory stays in the pool. Uploads and downloads
//   go through one pinned staging buffer of at most kStagingBytes (cudaMallocHost, grown on
//   demand, reused), chunk by chunk, each chunk synchronised before the staging is reused:
//   simple and correct first; both are host synchronisation points.
// - Ordering: every call is enqueued on the one stream, so calls are ordered among
//   themselves as Ops requires; download() synchronises.
// - Checks: every CUDA call is TRIDENT_CUDA_CHECKed (abort naming file:line, the call and
//   cudaGetErrorString); every argument's dtype is checked as on the CPU (CHECK-fail naming
//   the op and the argument). With TRIDENT_CUDA_SYNC=1 in the environment each op ends
//   with cudaStreamSynchronize and an error check, so an asynchronous fault is reported by
//   the op that caused it; the results are the same bits (same kernels, same order).
// - Matmuls: GemmEngine (gemm.h) when the layout suits cuBLASLt (launch.h
//   gemm_layout_ok), else a simple fp32 kernel (odd test shapes). For GemmEngine A and B
//   of one GEMM must share a dtype: an f32/bf16 mix
//   widens the bf16 operand into f32 scratch (exact, so the result is the fp32 GEMM the CPU
//   computes); an f32 GEMM with a bf16 output computes into f32 scratch and rounds once.
//   The bias gradient is a column-sum kernel (cuBLASLt's BGRADB stores, cannot accumulate).
// - Attention: one AttentionPath (attention.h) chosen at construction from
//   TRIDENT_ATTENTION (attention_choice_from_env); see cuda_ops.cpp.
// - Scratch (casts, the sum of squares' partials, overlapping copies) is allocated through
//   this Ops (so counted) when a larger size first appears and kept: a training step
//   after the first allocates nothing.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "kernels/cuda/gemm.h"
#include "kernels/ops.h"

namespace trident::cuda {

// Pinned staging for host transfers; larger transfers move in chunks of this size.
inline constexpr size_t kStagingBytes = size_t{64} << 20;

enum class AttentionChoice { kPlain, kCudnn };
const char* attention_choice_name(AttentionChoice choice);  // "plain", "cudnn"

// TRIDENT_ATTENTION's value: null or "" -> plain (the default until a GPU run has
// validated the cuDNN path), "plain", "cudnn"; anything else is an invalid_config error
// naming TRIDENT_ATTENTION and the value.
Result<AttentionChoice> attention_choice_from_env(const char* value);

// The three GEMMs of a linear layer (kernels/ops.h matmul_*), as GemmDescs with the shape
// fields set (dtypes, bias: by the caller from the buffers):
// - kForward: out[N, OC] = inp[N, IC] @ weight[OC, IC]^T  -> M=N, N=OC, K=IC, trans_b;
// - kDinp:    dinp[N, IC] += dout[N, OC] @ weight[OC, IC] -> M=N, N=IC, K=OC, accumulate;
// - kDweight: dweight[OC, IC] += dout^T @ inp[N, IC]      -> M=OC, N=IC, K=N, trans_a,
//             accumulate.
enum class LinearGemm { kForward, kDinp, kDweight };
GemmDesc linear_gemm_desc(LinearGemm which, int N, int IC, int OC);

// The CUDA Ops on `device` (an index < the visible device count). Errors (invalid_config,
// naming runtime.device): cudaSetDevice failing, cuBLASLt not usable, a bad
// TRIDENT_ATTENTION.
Result<std::unique_ptr<Ops>> make_cuda_ops(int device);

}  // namespace trident::cuda
