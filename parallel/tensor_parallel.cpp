#include "parallel/tensor_parallel.h"

#include <string>

#include "comm/communicator.h"
#include "core/check.h"

namespace trident {

TensorParallel::TensorParallel(Ops& ops, Communicator* comm, int rank, int size,
                               bool sequence_parallel)
    : ops_(&ops),
      comm_(size > 1 ? comm : nullptr),
      rank_(rank),
      size_(size),
      sequence_parallel_(sequence_parallel && size > 1) {
  TRIDENT_CHECK_MSG(size >= 1 && rank >= 0 && rank < size,
                    "tp rank " + std::to_string(rank) + " of " + std::to_string(size));
  TRIDENT_CHECK_MSG(comm_ == nullptr || comm_->size() == size,
                    "tensor parallelism over " + std::to_string(size) +
                        " ranks with a tp communicator of " + std::to_string(comm_->size()));
}

Communicator& TensorParallel::comm(const char* label) const {
  TRIDENT_CHECK_MSG(comm_ != nullptr, std::string("tp collective '") + label + "' over " +
                                          std::to_string(size_) +
                                          " ranks without a communicator (a planning-only group)");
  return *comm_;
}

int TensorParallel::local(int global, const char* what) const {
  TRIDENT_CHECK_MSG(global % size_ == 0, std::string(what) + ": " + std::to_string(global) +
                                             " does not split over tp " +
                                             std::to_string(size_));
  return global / size_;
}

int TensorParallel::local_rows(int N) const {
  if (!sequence_parallel_) return N;
  TRIDENT_CHECK_MSG(N % size_ == 0, "sequence parallelism: " + std::to_string(N) +
                                        " token rows do not split over tp " +
                                        std::to_string(size_));
  return N / size_;
}

DevPtr TensorParallel::gather_rows(DevPtr local, DevPtr full, int N, int width,
                                   const char* label) const {
  if (!sequence_parallel_) return local;
  TRIDENT_CHECK_MSG(full, std::string(label) + ": sequence parallelism needs a gather buffer");
  const size_t chunk = static_cast<size_t>(local_rows(N)) * static_cast<size_t>(width);
  CollectiveOptions opts;
  opts.label = label;
  comm(label).all_gather(CommBuf::device(local, chunk), CommBuf::device(full, chunk * size_),
                         opts);
  return full;
}

DevPtr TensorParallel::reduce_column_input_grad(DevPtr dfull, DevPtr dlocal, int N, int width,
                                                const char* label) const {
  DevPtr out = sequence_parallel_ ? dlocal : dfull;
  reduce_rows(out, dfull, N, width, label);
  return out;
}

void TensorParallel::reduce_rows(DevPtr out, DevPtr partial, int N, int width,
                                 const char* label) const {
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(width);
  if (!sequence_parallel_) {
    TRIDENT_CHECK_MSG(out == partial, std::string(label) + ": reduced in place without "
                                                           "sequence parallelism");
    reduce_partial_output(out, n, label);
    return;
  }
  TRIDENT_CHECK_MSG(out && partial && !(out == partial),
                    std::string(label) + ": sequence parallelism reduce-scatters "
                                         "from a workspace into the rank's rows");
  CollectiveOptions opts;
  opts.label = label;
  comm(label).reduce_scatter(CommBuf::device(partial, n),
                             CommBuf::device(out, n / static_cast<size_t>(size_)), opts);
}

void TensorParallel::reduce_partial_output(DevPtr out, size_t n, const char* label) const {
  if (!active()) return;
  CollectiveOptions opts;
  opts.label = label;
  comm(label).all_reduce(CommBuf::device(out, n), ReduceOp::kSum, opts);
}

void TensorParallel::reduce_sequence_grads(DevPtr grads, size_t n, const char* label) const {
  if (sequence_parallel_) reduce_partial_output(grads, n, label);
}

void TensorParallel::reduce_max(DevPtr data, size_t n, const char* label) const {
  if (!active()) return;
  CollectiveOptions opts;
  opts.label = label;
  comm(label).all_reduce(CommBuf::device(data, n), ReduceOp::kMax, opts);
}

// ---- column-parallel linear ---------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const TensorParallel& tp, int in_features,
                                           int out_features, const char* label)
    : tp_(&tp), in_(in_features), out_local_(tp.local(out_features, label)) {}

void ColumnParallelLinear::forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias,
                                   int N) const {
  tp_->ops().matmul_forward(out, inp, weight, bias, N, in_, out_local_);
}

void ColumnParallelLinear::backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout,
                                    DevPtr inp, DevPtr weight, int N,
                                    GradWrite dinp_write) const {
  tp_->ops().matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, in_, out_local_,
                             dinp_write);
}

// ---- row-parallel linear ------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const TensorParallel& tp, int in_features, int out_features,
                                     const char* label)
    : tp_(&tp), in_local_(tp.local(in_features, label)), out_(out_features), label_(label) {}

void RowParallelLinear::forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N,
                                DevPtr partial) const {
  // The bias joins the partial sum of rank 0 only, so the sum carries it once.
  DevPtr bias_here = tp_->rank() == 0 ? bias : DevPtr();
  DevPtr product = tp_->sequence_parallel() ? partial : out;
  TRIDENT_CHECK_MSG(product, std::string(label_) + ": sequence parallelism needs a workspace");
  tp_->ops().matmul_forward(product, inp, weight, bias_here, N, in_local_, out_);
  tp_->reduce_rows(out, product, N, out_, label_);
}

void RowParallelLinear::backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout,
                                 DevPtr inp, DevPtr weight, int N, DevPtr dout_full,
                                 GradWrite dinp_write) const {
  DevPtr full = tp_->gather_rows(dout, dout_full, N, out_, label_);
  tp_->ops().matmul_backward(dinp, dweight, dbias, full, inp, weight, N, in_local_, out_,
                             dinp_write);
}

// ---- vocab-parallel embedding -------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(const TensorParallel& tp, int padded_vocab,
                                               int d_model)
    : tp_(&tp),
      C_(d_model),
      vocab_local_(tp.local(padded_vocab, "padded vocabulary")),
      vocab_begin_(tp.begin(padded_vocab, "padded vocabulary")) {}

void VocabParallelEmbedding::forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B,
                                     int T, DevPtr partial) const {
  // Positions are replicated: rank 0 adds them, before the vocab-parallel sum.
  DevPtr wpe_here = tp_->rank() == 0 ? wpe : DevPtr();
  DevPtr sum = tp_->sequence_parallel() ? partial : out;
  TRIDENT_CHECK_MSG(sum, "embedding: sequence parallelism needs a workspace");
  tp_->ops().embedding_forward(sum, tokens, wte, wpe_here, B, T, C_, vocab_begin_,
                               vocab_local_);
  tp_->reduce_rows(out, sum, B * T, C_, "embedding");
}

void VocabParallelEmbedding::backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens,
                                      int B, int T, DevPtr dout_full) const {
  DevPtr full = tp_->gather_rows(dout, dout_full, B * T, C_, "embedding dout");
  tp_->ops().embedding_backward(dwte, dwpe, full, tokens, B, T, C_, vocab_begin_, vocab_local_);
}

// ---- vocab-parallel cross-entropy ---------------------------------------------------------

VocabParallelCrossEntropy::VocabParallelCrossEntropy(const TensorParallel& tp, int vocab_size,
                                                     int padded_vocab)
    : tp_(&tp),
      V_(vocab_size),
      Vp_(padded_vocab),
      vocab_local_(tp.local(padded_vocab, "padded vocabulary")),
      vocab_begin_(tp.begin(padded_vocab, "padded vocabulary")) {}

void VocabParallelCrossEntropy::forward(DevPtr losses, DevPtr row_max, DevPtr sums,
                                        DevPtr logits, DevPtr targets, int N) const {
  Ops& ops = tp_->ops();
  // Global row max, then the global sum of exponentials and the target logit (the rank
  // holding the target contributes it, the others 0), then the loss on the device. One
  // rank takes the same path (the reductions are no-ops): its statistics, kept in
  // row_max and sums, spare backward the two passes over the logits that the fused
  // cross_entropy_backward would make to recompute them, with results bitwise equal.
  const size_t n = static_cast<size_t>(N);
  ops.xent_local_max(row_max, logits, N, vocab_local_, vocab_begin_, V_);
  tp_->reduce_max(row_max, n, "xent max");
  ops.xent_local_sums(sums, sums + N, logits, row_max, targets, N, vocab_local_, vocab_begin_,
                      V_);
  tp_->reduce_partial_output(sums, 2 * n, "xent sums");
  ops.xent_finish(losses, row_max, sums, sums + N, N);
}

void VocabParallelCrossEntropy::backward(DevPtr dlogits, DevPtr logits, DevPtr row_max,
                                         DevPtr sums, DevPtr targets, float dloss,
                                         int N) const {
  tp_->ops().xent_local_backward(dlogits, logits, row_max, sums, targets, dloss, N, vocab_local_,
                                 vocab_begin_, V_);
}

}  // namespace trident
