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
// - Attention: cuDNN or plain (attention.h) per shape, from the dtype, what cuDNN can plan
//   and TRIDENT_ATTENTION (attention_choice_from_env); the state is tagged with the path;
//   see cuda_ops.cpp.
// - Memory: device_memory() is cudaMemGetInfo's free and total bytes and the pinned
//   staging (kStagingBytes), for the memory plan.
// - Scratch (casts, the sum of squares' partials, overlapping copies) is allocated through
//   this Ops (so counted) when a larger size first appears and kept: a training step
//   after the first allocates nothing.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "core/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/ops.h"

namespace trident::cuda {

// Pinned staging for host transfers; larger transfers move in chunks of this size.
inline constexpr size_t kStagingBytes = size_t{64} << 20;

// kAuto: cuDNN for bf16 shapes it can plan, else plain; kPlain, kCudnn: forced by
// TRIDENT_ATTENTION (forced cudnn still runs plain for f32 and for shapes cuDNN rejects,
// with the warning line of attention_fallback_message).
enum class AttentionChoice { kAuto, kPlain, kCudnn };
const char* attention_choice_name(AttentionChoice choice);  // "auto", "plain", "cudnn"

// TRIDENT_ATTENTION's value: null or "" -> auto, "plain", "cudnn"; anything else is an
// invalid_config error naming TRIDENT_ATTENTION and the value.
Result<AttentionChoice> attention_choice_from_env(const char* value);

// Whether a call of `dtype` tries the cuDNN path first (bf16, unless plain is forced).
bool attention_tries_cudnn(AttentionChoice choice, DType dtype);

// The path a state belongs to, and its tag (the state's first byte): 'C' cuDNN (the
// log-sum-exp follows), 'P' plain (the probabilities follow), 'R' plain recomputing
// (nothing follows: a shape first seen at a call, in a buffer sized for a larger one).
enum class AttentionStatePath { kCudnn, kPlain, kPlainRecompute };
char attention_state_tag(AttentionStatePath path);
inline constexpr size_t kAttentionStateTagBytes = 64;  // keeps the payload 64-byte aligned
// The bytes of a state: the tag, then the path's own state for `shape` (attention.h),
// saturating at SIZE_MAX. What attention_state_bytes reports.
size_t attention_state_total_bytes(AttentionStatePath path, AttentionShape shape);
// The warning logged once per shape that falls back from cuDNN to plain.
std::string attention_fallback_message(AttentionChoice choice, const AttentionShape& shape,
                                       const Status& why);

// The CUDA Ops' choice of path per shape, apart from the device so host tests can drive it
// with a fake cuDNN. A shape (B, T, NH, NKV, HD, dtype) is decided the first time it is
// seen and kept, so a backward always runs its forward's path: bf16 (unless plain is
// forced) asks prepare_cudnn and takes cuDNN when it succeeds; otherwise plain, logging
// attention_fallback_message once. `asked`: the shape is first seen by
// attention_state_bytes (its buffer is sized for it: plain keeps the probabilities), else
// by a call (a buffer sized for a larger shape: plain recomputes). Not thread-safe (one
// per Ops).
class AttentionPlanner {
 public:
  using PrepareCudnn = std::function<Status(const AttentionShape&)>;
  explicit AttentionPlanner(AttentionChoice choice) : choice_(choice) {}
  AttentionChoice choice() const { return choice_; }
  AttentionStatePath decide(const AttentionShape& shape, bool asked,
                            const PrepareCudnn& prepare_cudnn);
  size_t fallbacks() const { return fallbacks_; }  // shapes that fell back (one line each)

 private:
  AttentionChoice choice_;
  std::map<std::tuple<int, int, int, int, int, DType>, AttentionStatePath> decisions_;
  size_t fallbacks_ = 0;
};

// The three GEMMs of a linear layer (kernels/ops.h matmul_*), as GemmDescs with the shape
// fields set (dtypes, bias: by the caller from the buffers):
// - kForward: out[N, OC] = inp[N, IC] @ weight[OC, IC]^T  -> M=N, N=OC, K=IC, trans_b;
// - kDinp:    dinp[N, IC] += dout[N, OC] @ weight[OC, IC] -> M=N, N=IC, K=OC, accumulate;
// - kDinpSet: dinp[N, IC] = dout[N, OC] @ weight[OC, IC]  -> the same, beta = 0
//             (GradWrite::kSet);
// - kDweight: dweight[OC, IC] += dout^T @ inp[N, IC]      -> M=OC, N=IC, K=N, trans_a,
//             accumulate.
enum class LinearGemm { kForward, kDinp, kDinpSet, kDweight };
GemmDesc linear_gemm_desc(LinearGemm which, int N, int IC, int OC);

// The CUDA Ops on `device` (an index < the visible device count). Errors (invalid_config,
// naming runtime.device): cudaSetDevice failing, cuBLASLt not usable, a bad
// TRIDENT_ATTENTION.
Result<std::unique_ptr<Ops>> make_cuda_ops(int device);

}  // namespace trident::cuda
