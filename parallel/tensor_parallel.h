// Tensor parallelism (Megatron-LM's tensor_parallel/{layers,mappings,cross_entropy}.py):
// the layers that split a weight over the ranks of one tp group, and every exchange of
// activations between those ranks. The model composes these layers; it makes no tp
// collective itself.
//
// The splits (what a rank holds of a global weight; core/param_layout.h records them as
// split_dim and the model description's describe_params takes them from here):
//   ColumnParallelLinear    weight (out, in): rows split (dim 0); bias split (dim 0).
//                           Input replicated, output split (Megatron gather_output=False).
//   RowParallelLinear       weight (out, in): columns split (dim 1); bias replicated.
//                           Input split (input_is_parallel), output replicated.
//   VocabParallelEmbedding  table (Vp, C): rows split (dim 0), a contiguous vocabulary
//                           range per rank; positions (wpe) replicated.
//   VocabParallelCrossEntropy  on the [N, Vp/tp] logits of a column-parallel head: the
//                           full logits are never gathered.
//
// The mapping points: every tp exchange of activations happens in one of the functions
// below. Without sequence parallelism the activations outside the linears are
// replicated; with it (TensorParallel's sequence_parallel, Megatron-LM's
// sequence_parallel; Korthikanti et al. 2022) they are split along the token rows: rank r
// holds rows [r*N/tp, (r+1)*N/tp) of the micro-batch's N = B*T rows (for B = 1 exactly a
// split of the sequence), and the exchanges change to:
//                         forward            backward
//   column input          identity           all-reduce       (gather_rows, reduce_column_input_grad)
//     with sequence par.  all-gather         reduce-scatter
//   row output            all-reduce         identity         (RowParallelLinear)
//     with sequence par.  reduce-scatter     all-gather
//   embedding output      all-reduce         identity         (VocabParallelEmbedding)
//     with sequence par.  reduce-scatter     all-gather
//   cross-entropy         all-reduce max, then sum (fp32 statistics), no backward exchange
//   norm-weight grads     -                  with sequence par.: all-reduce (reduce_sequence_grads)
// An all-gather plus a reduce-scatter moves the bytes of one all-reduce. The gathered
// column input is not kept for backward (Megatron does the same): backward gathers it
// again for the weight gradient, one more all-gather per column-parallel block, so that
// every saved activation outside the linears is a shard.
// The backward all-reduce (or reduce-scatter) of a column input is deferred to the
// caller's reduce_column_input_grad so that several column-parallel layers reading one
// input (q, k and v; gate and up) share one collective, as Megatron's fused QKV does.
// The cross-entropy runs on all N rows of vocabulary-split logits, as Megatron's does
// under sequence parallelism: sharding it along the sequence would need an all-to-all of
// the logits.
//
// Precision. Activations are exchanged in their own dtype (bf16 all-reduces under
// training.precision bf16, fp32 statistics for the cross-entropy); every layer computes
// through the Ops with the dtype rules of kernels/ops.h.
//
// Group size 1: no communicator, no collective, and each layer is exactly the plain Ops
// call, so a one-rank model is bitwise the model without tensor parallelism. The
// cross-entropy keeps its three local steps there too (bitwise cross_entropy_forward /
// _backward), so that backward reuses the forward's row statistics: three passes over
// the logits and one write, where the fused pair makes five and one.
//
// Ordering: collectives are issued in call order on the tp communicator, so every tp rank
// must make the same calls in the same order (comm/communicator.h).
#pragma once

#include <cstddef>

#include "core/memory.h"
#include "kernels/ops.h"

namespace trident {

class Communicator;

// One tp group as the layers see it: the rank's place in it, the Ops the layers compute
// with and the communicator of the group (ignored when size() == 1). A group of size > 1
// without a communicator serves planning only (sizing a rank's buffers): its first
// collective CHECK-fails.
class TensorParallel {
 public:
  // sequence_parallel: split the activations outside the linears along the token rows
  // (ignored when size == 1).
  TensorParallel(Ops& ops, Communicator* comm, int rank, int size,
                 bool sequence_parallel = false);

  Ops& ops() const { return *ops_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool active() const { return size_ > 1; }
  // This rank's part of a dimension split over the group: global / size(), and where it
  // begins. CHECK-fails (naming `what`) unless size() divides `global`.
  int local(int global, const char* what) const;
  int begin(int global, const char* what) const { return local(global, what) * rank_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Token rows of this rank's activations outside the linears for a micro-batch of N
  // rows: N / size() with sequence parallelism (CHECK-fails unless size() divides N),
  // else N.
  int local_rows(int N) const;

  // Forward of the column input (and backward of the row and embedding outputs): the
  // full [N, width] rows from this rank's [local_rows(N), width] ones. With sequence
  // parallelism an all-gather into `full` (returned); else `local` itself, `full` unused.
  DevPtr gather_rows(DevPtr local, DevPtr full, int N, int width, const char* label) const;
  // Backward of the column input mapping: sums this rank's partial input gradient dfull
  // [N, width] over the group and returns where the sum of this rank's rows is: dfull
  // itself (all-reduce in place), or, with sequence parallelism, `dlocal`
  // [local_rows(N), width] (reduce-scatter). Call once after every column-parallel layer
  // reading the same input has run its backward.
  DevPtr reduce_column_input_grad(DevPtr dfull, DevPtr dlocal, int N, int width,
                                  const char* label) const;
  // Forward of the row output and embedding output mappings: sums the ranks' partial
  // outputs `partial` [N, width] into this rank's rows `out`: in place (all-reduce;
  // out == partial), or, with sequence parallelism, a reduce-scatter into `out`
  // [local_rows(N), width].
  void reduce_rows(DevPtr out, DevPtr partial, int N, int width, const char* label) const;
  // In-place sum of n elements over the group (the cross-entropy statistics).
  void reduce_partial_output(DevPtr out, size_t n, const char* label) const;
  // With sequence parallelism: sums over the group the gradients of replicated
  // parameters that each rank computed from its own rows only (the norm weights), n f32
  // elements in place. Without it every rank computed them from every row: nothing.
  void reduce_sequence_grads(DevPtr grads, size_t n, const char* label) const;
  // In-place max over the group (the cross-entropy's row maxima).
  void reduce_max(DevPtr data, size_t n, const char* label) const;

 private:
  Communicator& comm(const char* label) const;  // CHECK-fails on a planning-only group

  Ops* ops_;
  Communicator* comm_;
  int rank_;
  int size_;
  bool sequence_parallel_;
};

// A linear layer in_features -> out_features whose output features are split over the
// group; this rank computes out_local() of them from the full (replicated) input.
class ColumnParallelLinear {
 public:
  static constexpr int kWeightSplitDim = 0;
  static constexpr int kBiasSplitDim = 0;

  ColumnParallelLinear() = default;
  ColumnParallelLinear(const TensorParallel& tp, int in_features, int out_features,
                       const char* label);
  int in_features() const { return in_; }
  int out_local() const { return out_local_; }

  // out[N, out_local] = inp[N, in] @ weight[out_local, in]^T + bias[out_local] (bias may
  // be null). No communication (column input, forward: identity).
  void forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N) const;
  // dinp[N, in] += this rank's partial input gradient (complete only after
  // TensorParallel::reduce_column_input_grad; = with GradWrite::kSet); dweight, dbias +=
  // their local gradients.
  void backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                DevPtr weight, int N, GradWrite dinp_write = GradWrite::kAdd) const;

 private:
  const TensorParallel* tp_ = nullptr;
  int in_ = 0, out_local_ = 0;
};

// A linear layer in_features -> out_features whose input features are split over the
// group (the split output of a column-parallel layer, through an elementwise op or
// attention); the output is the sum over the ranks, replicated.
class RowParallelLinear {
 public:
  static constexpr int kWeightSplitDim = 1;
  static constexpr int kBiasSplitDim = -1;  // replicated

  RowParallelLinear() = default;
  RowParallelLinear(const TensorParallel& tp, int in_features, int out_features,
                    const char* label);
  int in_local() const { return in_local_; }
  int out_features() const { return out_; }

  // out[N, out] = sum over ranks of inp[N, in_local] @ weight[out, in_local]^T, + bias
  // (added once, by rank 0, before the sum), replicated on every rank. With sequence
  // parallelism `out` gets this rank's local_rows(N) rows of the sum and `partial` is an
  // [N, out] workspace for the partial product (unused without).
  void forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N,
               DevPtr partial = DevPtr()) const;
  // dout is this rank's rows of the output gradient: all of them (row output, backward:
  // identity), or with sequence parallelism local_rows(N) of them, gathered into the
  // [N, out] workspace `dout_full`. dinp[N, in_local] (+= or, GradWrite::kSet, =), dweight
  // += local gradients; dbias += sum over all N rows of dout on every rank (the bias is
  // replicated, so each rank holds its full gradient).
  void backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                DevPtr weight, int N, DevPtr dout_full = DevPtr(),
                GradWrite dinp_write = GradWrite::kAdd) const;

 private:
  const TensorParallel* tp_ = nullptr;
  int in_local_ = 0, out_ = 0;
  const char* label_ = "";
};

// The token embedding with the vocabulary split over the group (rank r holds rows
// [vocab_begin(), vocab_begin() + vocab_local())), plus optional replicated positions.
class VocabParallelEmbedding {
 public:
  static constexpr int kTableSplitDim = 0;

  VocabParallelEmbedding() = default;
  VocabParallelEmbedding(const TensorParallel& tp, int padded_vocab, int d_model);
  int vocab_local() const { return vocab_local_; }
  int vocab_begin() const { return vocab_begin_; }

  // out[B*T, C] = wte[tokens] (+ wpe[t]) summed over the ranks: a token outside a rank's
  // range contributes zero there; the positions (wpe may be null) are added once, by
  // rank 0, before the sum. With sequence parallelism `out` gets this rank's
  // local_rows(B*T) rows and `partial` is a [B*T, C] workspace (unused without).
  void forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T,
               DevPtr partial = DevPtr()) const;
  // dout: this rank's rows of the output gradient (all, or with sequence parallelism
  // local_rows(B*T), gathered into the [B*T, C] workspace `dout_full`). dwte += the
  // scatter of this rank's vocabulary range; dwpe (when not null) += the sum over the
  // batch, on every rank.
  void backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B, int T,
                DevPtr dout_full = DevPtr()) const;

 private:
  const TensorParallel* tp_ = nullptr;
  int C_ = 0, vocab_local_ = 0, vocab_begin_ = 0;
};

// Softmax cross-entropy of vocabulary-split logits [N, vocab_local] (the output of a
// column-parallel head over the padded vocabulary; global columns >= vocab_size are
// padding). The statistics live in caller-owned f32 buffers kept from forward to
// backward: row_max[N] and sums[2N] (sum of exponentials, then the target logit).
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy() = default;
  VocabParallelCrossEntropy(const TensorParallel& tp, int vocab_size, int padded_vocab);

  // losses[N] (f32) = log(sum_v exp(logit_v)) - logit_target over the real columns of
  // all ranks, finished on the device; replicated on every rank.
  void forward(DevPtr losses, DevPtr row_max, DevPtr sums, DevPtr logits, DevPtr targets,
               int N) const;
  // dlogits = dloss * (softmax - onehot(target)) on this rank's columns, 0 on padding.
  // Overwrites dlogits, which may alias logits. No communication.
  void backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sums, DevPtr targets,
                float dloss, int N) const;

 private:
  const TensorParallel* tp_ = nullptr;
  int V_ = 0, Vp_ = 0, vocab_local_ = 0, vocab_begin_ = 0;
};

}  // namespace trident
