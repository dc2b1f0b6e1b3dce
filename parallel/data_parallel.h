// Data parallelism with ZeRO stages 0-3 over one dp communicator: where parameters,
// gradients and AdamW moments live, how gradients are reduced, and the optimizer step.
//
// Sharding is per tensor along dim 0 (parallel/sharded_param_store.h): dp rank r owns
// rows [r * ceil(R/dp), ...) of every (TP-local) tensor. The loss is the mean over dp
// ranks, so gradients are summed over dp and scaled by 1/dp.
//   stage 0: resident params and grads; all-reduce grads; full AdamW state everywhere.
//   stage 1: resident params and full gradients (backward accumulates into them), but
//            the gradients are reduce-scattered into this rank's gradient shard (the
//            owned rows: half an all-reduce's traffic), AdamW moments only for the owned
//            rows; each rank updates its rows and the parameters are then all-gathered.
//   stage 2: as 1, but gradients live only as a shard (GradShardedParamStore):
//            backward accumulates into one group's full gradient buffer at a time, which
//            is reduce-scattered into the shard on release(kBackward) and freed, so
//            gradient memory is the shard plus the group(s) in flight, and
//            reduce_gradients does nothing. Parameters stay resident and replicated.
//   stage 3: FSDP: params and grads only as shards (ShardedParamStore); gradients are
//            reduced per group on release(kBackward), so reduce_gradients does nothing.
// Stage 0 all-reduces in buckets of about bucket_bytes of full gradients (one
// collective per bucket; a bucket never spans groups). The buckets partition the whole
// flat gradient buffer, alignment gaps (zero) included, so a step all-reduces exactly
// layout.total_floats() floats. Stage 1 reduce-scatters the same buckets' tensors
// (packed [dp, chunk] by rows, as stage 2 does per group): dp * (sum of padded shards)
// floats per step. Stages 1-2 all-gather the parameters in the same buckets after the
// update: dp * (sum of padded shards) floats per step. Stages 2-3
// reduce-scatter dp * (padded shards of the group) floats per group per backward
// acquire/release pair: dp * (sum of padded shards) per micro-batch.
//
// Overlap (OverlapOptions::grad_reduce, parallel.overlap_grad_reduce): the same
// collectives on the same data, issued asynchronously during backward instead of after
// it, so communication runs while the rank computes; results are bitwise those of the
// synchronous path (each element gets the same sums and additions in the same order).
//   stages 0-1: a group's gradients are final at its last backward release of the step
//            (micro_batches releases; twice that for group 0 when a tied one-stage head
//            also writes wte: head_reads_embeddings), so that release issues the group's
//            buckets (stage 0 iall_reduce in place, stage 1 ireduce_scatter through a
//            ReduceScatterQueue): buckets go out in reverse layer order as backward
//            produces them, one collective per bucket. A backward release after its
//            group's buckets were issued CHECK-fails (the count would be wrong).
//   stages 2-3: each release(kBackward) issues its group's reduce-scatter on a
//            ReduceScatterQueue instead of running it.
// reduce_gradients() waits for everything issued (stage 0 then scales by 1/dp), and
// CHECKs that every group saw exactly its expected releases. Memory: stages 1-3 add the
// queue's scratch (ReduceScatterQueue::scratch_bytes, 2 slots) to comm_scratch.
// OverlapOptions::param_gather (stage 3): the store prefetches each group's all-gather
// one gather ahead, in the zero_grad() .. reduce_gradients() window (its begin_step /
// end_step); comm_scratch adds its prefetch buffer. Stages 1-2 all-gather the updated
// parameters after step() synchronously either way.
//
// Mixed precision (`compute` = bf16, training.precision bf16): the store holds bf16
// compute weights, gradients stay fp32, and the fp32 masters sit beside the moments and
// are sharded like them (stage 0 every element; stages 1-3 the owned rows; stage 3's
// store keeps them as its param_shard()). step() updates the masters and, stages 0-2,
// writes the bf16 copy (Ops::adamw_update's compute_copy); stages 1-2 all-gather the bf16
// copy; stage 3 keeps none (its store casts the masters before each gather). The
// checkpoint state (owned_state().param, gather_param) is the fp32 masters.
//
// A step, on every dp rank in the same order (every call below that communicates is a
// collective of the dp group):
//   zero_grad(); for each micro-batch: model forward/backward through store();
//   reduce_gradients(); norm = all_reduce(owned_grad_square_sum(...)) over dp (and tp,
//   pp as the caller needs); scale_gradients(clip); step(lr).
// Not thread-safe. The layout, ops and communicator must outlive this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "kernels/ops.h"
#include "parallel/param_store.h"
#include "parallel/sharded_param_store.h"

namespace trident {

class ReduceScatterQueue;

// Ignored (both off) when the dp group has one rank.
struct OverlapOptions {
  bool grad_reduce = false;  // parallel.overlap_grad_reduce
  // parallel.overlap_param_gather: ZeRO-3 prefetches the next group's all-gather
  // (ShardedParamStore::enable_prefetch), learned in the first step.
  bool param_gather = false;
  int micro_batches = 1;     // micro-batches per step (backward passes between zero_grad calls)
};

class DataParallel {
 public:
  // zero_stage in 0..3 (CHECK); bucket_bytes > 0. `adamw`: beta1, beta2, eps and
  // weight_decay (applied to parameters with ParamInfo::decay); its lr and step are
  // ignored (step() takes the learning rate and counts the steps). `compute`: the
  // stores' parameter dtype (f32, or bf16 for training.precision bf16).
  DataParallel(const ParamLayout& layout, Ops& ops, Communicator& dp, int zero_stage,
               size_t bucket_bytes, const AdamWParams& adamw, DType compute = DType::kF32,
               const OverlapOptions& overlap = {});
  ~DataParallel();

  // What the model reads parameters and accumulates gradients through: a
  // ResidentParamStore (stages 0-1), the GradShardedParamStore (stage 2) or the
  // ShardedParamStore (stage 3).
  ParamStore& store();
  int zero_stage() const { return stage_; }
  bool overlaps_grad_reduce() const { return overlap_.grad_reduce; }
  DType compute_dtype() const { return compute_; }
  Communicator& dp() const { return dp_; }

  // Zeroes the gradients of the coming step (full buffer and/or shard).
  void zero_grad();
  // After all micro-batches: sum over dp, scale by 1/dp (stage 0: every element; stage 1:
  // the owned rows, into the gradient shard). No-op for stages 2-3 (the store reduced
  // every group during backward). With overlap: waits for what backward issued.
  void reduce_gradients();
  // Sum of squares of the reduced gradient elements this rank is responsible for, so
  // that the sum over dp ranks counts every element once: stage 0 all of them on dp
  // rank 0 (0 elsewhere), stages 1-3 the owned rows. Skips tied_copy parameters, and
  // tp-replicated ones unless count_tp_replicated (pass tp_rank == 0). Local; the sum
  // accumulates on the device and is read back with one download.
  double owned_grad_square_sum(bool count_tp_replicated) const;
  // Multiplies the reduced gradients by s (gradient clipping). Local.
  void scale_gradients(float s);
  // AdamW (decay per ParamInfo::decay) on the elements this rank updates, then for
  // stages 1-2 the all-gather of the parameters. Advances steps_taken().
  void step(float lr);
  int steps_taken() const { return step_; }
  void set_steps_taken(int steps) { step_ = steps; }  // resume

  // The full (TP-local) value of parameter `param` (index into layout.params) on the
  // host: the fp32 master. Stage 3, and stages 1-2 in mixed precision: a collective over
  // dp (all ranks call it for the same param).
  std::vector<float> gather_param(int param);
  // Sets parameter `param` from its full (TP-local) host value (numel floats): the master
  // and the compute copy (rounded to bf16 in mixed precision); every dp rank passes the
  // same values. Local.
  void load_param(int param, std::span<const float> host_full);
  // The dim-0 split of parameter `param` over this dp group.
  RowSplit shard_rows(int param) const;

  // The reduced gradient of parameter `param` that this rank holds after
  // reduce_gradients() (device memory): the whole tensor for stage 0, the owned rows
  // for stages 1-3. For the tied-embedding sum over the embedding group: both ends have
  // the same local shape and dp size, hence the same sizes.
  struct GradSlice {
    DevPtr data;  // f32
    size_t floats = 0;
  };
  GradSlice reduced_grad(int param);
  // The rows [row_begin, row_end) of `param` whose optimizer state this rank keeps, as
  // f32 device pointers to `floats` contiguous values each (parameter, first and second
  // moment): all rows for stage 0 (every rank holds everything), the owned shard for
  // stages 1-3. For checkpoints: stage 0 state is replicated, so one dp rank suffices.
  struct OwnedState {
    int64_t row_begin = 0, row_end = 0;
    size_t floats = 0;
    DevPtr param;
    DevPtr exp_avg;
    DevPtr exp_avg_sq;
  };
  OwnedState owned_state(int param);

  // Bytes allocated, by kind. Everything is allocated at construction and nothing in a
  // step (the stores take group buffers from pools planned then), so the figures do not
  // change during training:
  //   params       compute weights (the compute dtype): stages 0-2 the resident flat
  //                buffer; stage 3 the gathered-group pool (max_held_group_floats
  //                elements), with f32 plus the shard (the masters too).
  //   master       fp32 master weights kept apart from the compute weights (bf16 only):
  //                stage 3 the store's master shard.
  //   grads        f32: stages 0-1 the flat buffer; stages 2-3 the shard plus the group
  //                gradient pool (max_held_group_floats elements).
  //   optimizer    AdamW moments.
  //   comm_scratch the buffers of the dp collectives: the bucketed parameter all-gather's
  //                pack and segment (stages 1-2, compute dtype), the store's collective
  //                scratch (stages 2-3, collective_scratch_bytes), and stage 3's prefetch
  //                buffer (ShardedParamStore::prefetch_bytes).
  // params_peak / grads_peak equal params / grads (kept for readers of peaks); what the
  // pools have in use is the stores' held_*_bytes() / peak_held_*_bytes().
  struct Memory {
    size_t params = 0, master = 0, grads = 0, optimizer = 0, comm_scratch = 0;
    size_t params_peak = 0, grads_peak = 0;
  };
  Memory memory() const;
  // Resets the stores' peak_held_* figures.
  void reset_memory_peak();
  // Number of buckets (stages 0-1: gradient all-reduces; stages 1-2: parameter
  // all-gathers; stage 3: non-empty groups), for tests/logs.
  size_t num_buckets() const { return plan_.chunks().size(); }
  // The stage-3 store, or null.
  ShardedParamStore* sharded() { return sharded_.get(); }
  // The stage-2 store, or null.
  GradShardedParamStore* grad_sharded() { return zero2_.get(); }

 private:
  // [begin, end) of the flat gradient buffer that bucket b all-reduces (stages 0-1).
  std::pair<size_t, size_t> bucket_range(size_t b) const;
  void all_gather_params();  // stages 1-2
  DevPtr param_data() const;  // stages 0-2: the resident flat parameter buffer (compute dtype)
  bool mixed() const { return compute_ != DType::kF32; }
  DevPtr master() const { return master_.as(DType::kF32); }  // stages 0-2, mixed
  DevPtr grad_shard() const;  // stages 1-3: this rank's (reduced) gradient shard
  class ReleaseCounter;       // stages 0-1 with overlap: the store the model sees
  // Stages 0-1 with overlap: called on every release(group, kBackward); issues the
  // group's buckets at its last one of the step.
  void on_backward_release(int group);
  void issue_bucket(size_t b);  // stages 0-1: bucket b's reduction (sync or async)

  const ParamLayout& layout_;
  Ops& ops_;
  Communicator& dp_;
  int stage_;
  AdamWParams adamw_;
  int step_ = 0;
  // Stages 0-2: flat-layout buckets; stage 3: the store's per-group plan. Exactly one
  // store: resident_ (stages 0-1), zero2_ (stage 2) or sharded_ (stage 3).
  std::unique_ptr<ResidentParamStore> resident_;
  std::unique_ptr<GradShardedParamStore> zero2_;
  std::unique_ptr<ShardedParamStore> sharded_;
  ShardPlan plan_;
  DType compute_ = DType::kF32;
  DeviceBuffer master_;      // mixed, stages 0-2: fp32 masters, laid out like the moments
  DeviceBuffer exp_avg_;     // stage 0: total_floats (flat layout); else shard_floats
  DeviceBuffer exp_avg_sq_;
  // Stages 1-2: the parameter all-gather's [dp, chunk] output and this rank's segment
  // (compute dtype); stage 1 sizes them in f32, for its gradient reduce-scatter too
  // (reduce_scatter_add's scratch: the pack and then the segment, contiguous).
  DeviceBuffer collective_;  // (dp + 1) * plan_.max_chunk_floats() elements
  DeviceBuffer grad_shard1_;  // stage 1: the reduced gradients of the owned rows (f32)
  OverlapOptions overlap_;
  std::unique_ptr<ReleaseCounter> counter_;
  std::unique_ptr<ReduceScatterQueue> queue_;  // stages 1-3 with overlap
  std::vector<CommWork> all_reduces_;          // stage 0 with overlap: this step's buckets
  std::vector<int> released_;  // by group: backward releases since zero_grad
  std::vector<int> expected_;  // by group: releases per step (0: no buckets)
  // (1) double: owned_grad_square_sum's device accumulator (allocated at construction,
  // written by a const query), so the norm costs one device -> host read however many
  // tensors there are.
  DeviceBuffer square_sum_;
};

}  // namespace trident
