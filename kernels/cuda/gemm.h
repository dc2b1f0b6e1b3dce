// GEMMs through cuBLASLt: every matmul of the CUDA backend (the linear layers, and the
// plain attention path's batched QK^T and PV) is one GemmDesc run on one GemmEngine.
//
// Semantics, row-major (the col-major swap is the engine's business): for b < batch,
//   D_b[M, N] = alpha * op(A_b)[M, K] @ op(B_b)[K, N] (+ beta * D_b) (+ bias[N] on every row)
// op(X) = X, or X^T when trans_x. A and B: f32 or bf16, the same dtype. D: f32 or bf16
// (bf16 inputs with an f32 D is the weight gradient). Arithmetic: fp32 accumulation
// (CUBLAS_COMPUTE_32F; for f32 inputs no TF32, so the fp32 path is a tight reference).
// accumulate: beta = 1, D is read and the product added in fp32, rounded once on store
// (as Ops' accumulating outputs, kernels/ops.h). bias: only with !accumulate, dtype of
// D, through the BIAS epilogue.
//
// Leading dimensions are row-major row strides in elements (0 = packed: the number of
// columns of the stored matrix); batch strides in elements. Any leading dimension >= the
// row works (odd shapes included): the algorithm is asked for the alignment the desc
// guarantees (the largest power of two up to 16 bytes dividing every leading dimension
// and batch stride in bytes), and run() CHECK-fails on a pointer aligned to less.
// Model shapes (multiples of 8 elements) get the 16-byte tensor-core kernels.
//
// One engine per compute stream, one workspace (32 MiB: Hopper's need), the heuristic
// algorithm chosen on a desc's first run and cached by desc and the bias pointer's
// alignment (the heuristic is asked with the real bias pointer set: cuBLASLt reads its
// alignment from it): the same desc always runs the same algorithm, so results are
// deterministic run to run. When cuBLASLt offers no algorithm the engine asks again
// without the alignment preferences (that algorithm then runs only on 256-byte aligned
// pointers, cuBLASLt's default assumption), and else runs simple_gemm (cuda_kernels.h), a
// slow fp32 kernel, with a warning naming the desc: never an abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/memory.h"
#include "core/status.h"

struct CUstream_st;

namespace trident::cuda {

struct GemmDesc {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  DType ab_dtype = DType::kF32;  // A and B
  DType d_dtype = DType::kF32;   // D (and bias)
  bool bias = false;
  bool accumulate = false;       // beta = 1
  float alpha = 1.0f;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  bool operator==(const GemmDesc&) const = default;
  std::string str() const;  // "M=.. N=.. K=.. ta tb bf16->f32 bias acc batch=.." for messages
};

// The alignment of p in bytes: the largest power of two up to 256 dividing its address
// (256 for null).
uint32_t pointer_alignment(const void* p);

// How a desc runs: a cuBLASLt algorithm found with the alignment preferences, one found
// without them (only for 256-byte aligned pointers), or simple_gemm.
enum class GemmRoute { kAligned, kUnaligned, kSimple };
// The route from the heuristic's answers: found(true) / found(false) = how many
// algorithms cuBLASLt offers with / without the alignment preferences (asked in that
// order, the second only when the first offers none).
GemmRoute choose_gemm_route(const std::function<int(bool alignment_prefs)>& found);

class GemmEngine {
 public:
  // Creates the cuBLASLt handle and the workspace (cudaMallocAsync on `stream`).
  // Without a usable device: an error saying so (no crash). `simple_only` (tests): every
  // desc takes the last-resort route, simple_gemm, without asking cuBLASLt.
  static Result<std::unique_ptr<GemmEngine>> create(CUstream_st* stream,
                                                    size_t workspace_bytes = size_t{32} << 20,
                                                    bool simple_only = false);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // Runs desc on the engine's stream. a, b, d (and bias when desc.bias) must carry the
  // desc's dtypes. A cuBLASLt failure CHECK-fails with desc.str() and the cuBLAS status
  // name; no algorithm for the desc falls back (above).
  void run(const GemmDesc& desc, DevPtr a, DevPtr b, DevPtr d, DevPtr bias = DevPtr());

  // Host only, no device needed: validates desc (shapes, dtypes, leading dimensions,
  // alignment rules), then creates and destroys the cuBLASLt matmul descriptor with every
  // attribute run() would set (transposes, epilogue, bias dtype, scale type) and the A,
  // B, C/D layouts (with batch count and strides). The first failure names the attribute
  // or rule and the desc.
  static Status describe(const GemmDesc& desc);

 private:
  GemmEngine() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident::cuda
