// Attention implementations of the CUDA backend behind one interface, with the contract
// of Ops::attention_* (kernels/ops.h): q[B, T, NH, HD], k and v [B, T, NKV, HD], causal,
// scale 1/sqrt(HD), query head h reads kv head h / (NH / NKV); out overwritten; the state
// opaque and sized by the path; backward receives the forward's out and ACCUMULATES into
// dq, dk, dv (any may be null); every buffer of one call has the same F dtype.
//
// Two paths:
// - "cudnn": cuDNN's fused flash attention through the backend graph API, the composite
//   causal SDPA graph cudnn-frontend builds; bf16 only; state = the
//   row log-sum-exp, f32 [B, NH, T].
// - "plain": cuBLASLt batched Q K^T (GemmEngine), a causal softmax kernel, P V, and their
//   backward; f32 and bf16; state = the probabilities [B, NH, T, ld(T)] in the io dtype,
//   or nothing when the shape says `recompute` (backward then recomputes them from q and
//   k). The fallback when cuDNN offers no plan, and the GPU-side reference in tests.
// The CUDA Ops chooses the path per shape (cuda_ops.cpp) and tags the state with it.
//
// Scratch (permuted copies, score gradients, cuDNN workspaces, the f32 partials that are
// then accumulated) is allocated through the Ops on the first call of a shape larger than
// any seen before and kept: steps after the first allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/memory.h"
#include "core/status.h"

struct CUstream_st;

namespace trident {
class Ops;
}

namespace trident::cuda {

class GemmEngine;

struct AttentionShape {
  int B = 0, T = 0, NH = 0, NKV = 0, HD = 0;
  DType dtype = DType::kBF16;
  // Plain path only: keep nothing in the state and recompute the probabilities in
  // backward (a state sized for a larger cuDNN call has no room for them).
  bool recompute = false;
};

// The state each path keeps, saturating at SIZE_MAX. Host only.
// plain: the probabilities [B, NH, T, ld(T)] in the io dtype (0 with recompute);
// cudnn: the row log-sum-exp, f32 [B, NH, T].
size_t plain_attention_state_bytes(const AttentionShape& shape);
size_t cudnn_attention_state_bytes(const AttentionShape& shape);

class AttentionPath {
 public:
  virtual ~AttentionPath() = default;
  virtual const char* name() const = 0;  // "cudnn" or "plain"
  // Builds what calls of this shape need (cuDNN: both execution plans), or says why the
  // path cannot serve it. Allocates no device memory.
  virtual Status prepare(const AttentionShape& shape) = 0;
  // The device scratch and workspaces (not the state) calls of this shape make the path
  // hold; after prepare(shape). Host only.
  virtual size_t workspace_bytes(const AttentionShape& shape) const = 0;
  virtual void forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v,
                       const AttentionShape& shape) = 0;
  virtual void backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                        DevPtr q, DevPtr k, DevPtr v, const AttentionShape& shape) = 0;
};

// `ops` is the CUDA Ops that owns `stream` (scratch comes from ops.allocate; elementwise
// needs such as accumulating a partial into bf16 dq may use ops.accumulate / ops.cast).
std::unique_ptr<AttentionPath> make_plain_attention(Ops& ops, GemmEngine& gemm,
                                                    CUstream_st* stream);

// Builds the forward and backward graphs for `shape` (bf16), finds execution plans and
// returns the path (which prepares further shapes on demand, any heads), or an error
// saying why not (dtype, head dim, the runtime cuDNN's rules, no engine for the graph
// with cudnnGetLastErrorString), which the caller logs before falling back to "plain".
Result<std::unique_ptr<AttentionPath>> make_cudnn_attention(Ops& ops, CUstream_st* stream,
                                                            const AttentionShape& shape);

// What the loaded cuDNN (version as cudnnGetVersion returns it, 91900 = 9.19.0) can run of
// the graphs for `shape`: an error naming the rule it breaks. Host only.
Status cudnn_runtime_support(const AttentionShape& shape, size_t version);

// Host only, no device needed: builds every tensor and operation descriptor of the
// forward (backward = false) or backward composite SDPA graph for `shape` and finalizes
// the operation graph. On success `summary` (when not null) lists the operations in
// order (e.g. "matmul(Q,Kt)->S; pointwise mul(S,scale)->S1; ..."); the first failure
// names the descriptor, the attribute and the cuDNN status.
Status build_cudnn_sdpa_graph(const AttentionShape& shape, bool backward, std::string* summary);

}  // namespace trident::cuda
