// The ZeRO-2 and ZeRO-3 parameter stores, on dim-0 sharding of the parameters over the
// data-parallel group (ZeRO / FSDP2 style; the geometry and the packing of a chunk:
// parallel/shard_plan.h).
//
// ShardedParamStore (ZeRO-3): parameters and gradients live only as shards. The f32
// master shard (param_shard(), what AdamW updates and checkpoints hold) is the only
// persistent copy of the parameters, in either compute dtype (FSDP2's mixed precision):
// a bf16 store keeps no bf16 shard but casts each chunk's slice of the masters (round
// to nearest even, as adamw_update's compute_copy rounds) into a one-chunk staging
// buffer right before its all-gather, so the gathered weights are bf16(master) exactly.
// acquire(g, phase) all-gathers group g's shard in the compute dtype (so bf16 halves the
// traffic) into a full group buffer of the compute dtype (taken then, and kept while any
// acquire of g is outstanding); acquire(g, kBackward) also takes a zeroed full f32 gradient
// buffer. release(g, kBackward) reduce-scatters that buffer, scales by 1/dp (the loss is
// the mean over dp ranks) and ADDS the result to the persistent gradient shard
// (accumulation over micro-batches), then gives it back.
//
// No allocation after construction. The group buffers come from BufferStacks
// (parallel/buffer_stack.h) sized for the most held at once, max_held_group_floats()
// elements: one group, or group 0 on top of the head group when a tied one-stage head
// reads wte from group 0 (head_reads_embeddings). So acquisitions must nest (release in
// the reverse order; the model's do), and holding more CHECK-fails naming the groups.
// The transient buffers of the collectives (the packed [dp, chunk] all-gather output and,
// in bf16, the staged chunk past it; the reduce-scatter pack and result; gather_param's)
// share one scratch buffer of collective_scratch_bytes(dp, plan().max_chunk_floats()),
// also allocated once. Collectives: one
// all_gather per acquire that finds g not gathered, one reduce_scatter per
// release(kBackward), all on the dp communicator, so every dp rank must acquire and
// release the same groups in the same order. Groups without parameters (other pipeline
// stages) are no-ops. Not thread-safe; the training thread only. The layout, ops and
// communicator must outlive the store.
//
// GradShardedParamStore (ZeRO-2): parameters resident (in the compute dtype) and
// replicated over dp in one flat buffer (as ResidentParamStore: group g at groups[g].offset; acquire gathers
// nothing), gradients only as a persistent shard plus, during backward, one full
// gradient buffer per group held. acquire(g, kBackward) takes group g's zeroed full
// gradient buffer (from a BufferStack planned as for ZeRO-3); the matching release
// reduce-scatters it into the shard exactly as ZeRO-3 does (sum, 1/dp, added), then
// gives it back. A backward acquire of a group whose
// backward buffer is already held shares that buffer (the last release reduces it); a
// later acquire after the release gets a fresh buffer, reduced separately, which is
// correct because accumulation is additive. So gradient memory is the shard plus the
// groups held at once (one, or two while the tied head also writes group 0's wte)
// instead of the whole model. Collectives: one reduce_scatter on the dp communicator
// per outermost release(kBackward) of a non-empty group; same ordering rule as ZeRO-3.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "kernels/ops.h"
#include "parallel/buffer_stack.h"
#include "parallel/param_store.h"
#include "parallel/shard_plan.h"

namespace trident {

class ReduceScatterQueue;

// Whether the model holds group 0 and the last group at once: both non-empty (a
// one-stage layout) and no lm_head.weight (core/param_layout.h: a tied head has no
// weight of its own and reads wte from group 0, inside its own acquire of the head).
bool head_reads_embeddings(const ParamLayout& layout);
// The most group-buffer elements a ZeRO-2/3 store holds at once: the largest group's
// num_floats, or group 0's plus the last group's when head_reads_embeddings.
size_t max_held_group_floats(const ParamLayout& layout);

class ShardedParamStore : public ParamStore {
 public:
  // Shards start zero; fill them with load_param or through param_shard() (a gather
  // reads the masters as they are then). `compute`: f32 or bf16.
  ShardedParamStore(const ParamLayout& layout, Ops& ops, Communicator& dp,
                    DType compute = DType::kF32);
  ~ShardedParamStore() override = default;

  void acquire(int group, Phase phase) override;
  void release(int group, Phase phase) override;
  DevPtr params(int group) override;  // CHECK: acquired
  DevPtr grads(int group) override;   // CHECK: acquired for kBackward
  DType compute_dtype() const override { return compute_; }

  // This rank's shard buffers (plan().shard_floats() elements each): the f32 master
  // parameters and the f32 gradients.
  DevPtr param_shard() { return param_shard_.as(DType::kF32); }
  // Overlapped gradient reduction (parallel.overlap_grad_reduce): release(g, kBackward)
  // issues its reduce-scatters on `queue` instead of running them (the owner drains it
  // before reading the gradient shard); null = synchronous. The queue must outlive the
  // store's use.
  void set_reduce_queue(ReduceScatterQueue* queue) { queue_ = queue; }
  // Prefetch (parallel.overlap_param_gather): allocates the prefetch buffer (dp chunks of
  // the compute dtype, in bf16 one more for the prefetch's own staged chunk:
  // prefetch_bytes()) and turns the prefetch on. The store learns the
  // step's order of gathers (the acquires that find a group not gathered) in the first
  // begin_step()..end_step() window, and in later windows issues, at each gather, the
  // next one's all-gather asynchronously (one gather ahead, in forward and in backward,
  // whatever the schedule or recomputation), into the prefetch buffer; the acquire that
  // needs it waits for it and unpacks it into its pool slice as a synchronous gather
  // would: the same bytes, the same values. An acquire that departs from the learned
  // order (it does not, for a fixed schedule; evaluation runs outside the window) waits
  // for the pending prefetch, discards it and gathers synchronously for the rest of the
  // window, so a wrong guess costs traffic, never correctness.
  void enable_prefetch();
  size_t prefetch_bytes() const { return prefetch_.bytes(); }
  // The training step's window (DataParallel::zero_grad .. reduce_gradients): gathers in
  // it are learned (first window) or prefetched (later ones). end_step() completes a
  // pending prefetch.
  void begin_step();
  void end_step();
  // Prefetched all-gathers discarded because the acquire order departed (tests).
  int prefetch_misses() const { return prefetch_misses_; }
  DevPtr grad_shard() { return grad_shard_.as(DType::kF32); }
  const ShardPlan& plan() const { return plan_; }
  // Writes this rank's rows of parameter `param` (its master rows) from the full
  // (TP-local) host values.
  void load_param(int param, const float* host_full);
  // Collective over dp: the full (TP-local) master value of parameter `param`, on the
  // host (f32).
  std::vector<float> gather_param(int param);

  // Bytes allocated at construction: the two group-buffer pools (compute-dtype
  // parameters, f32 gradients; max_held_group_floats() elements each) and the collective
  // scratch.
  size_t param_pool_bytes() const { return param_pool_.capacity(); }
  size_t grad_pool_bytes() const { return grad_pool_.capacity(); }
  size_t scratch_bytes() const { return scratch_.bytes(); }
  // Bytes of the pools in use now (gathered groups), and the most in use at once since
  // construction / reset_peak(): at most the pools' sizes.
  size_t held_param_bytes() const { return held_params_; }
  size_t held_grad_bytes() const { return held_grads_; }
  size_t peak_held_bytes() const { return peak_; }
  // The most of each kind held at once (not necessarily at the same time).
  size_t peak_held_param_bytes() const { return peak_params_; }
  size_t peak_held_grad_bytes() const { return peak_grads_; }
  void reset_peak() {
    peak_ = held_params_ + held_grads_;
    peak_params_ = held_params_;
    peak_grads_ = held_grads_;
  }

 private:
  struct Gathered {
    int refs = 0;  // outstanding acquires
    DevPtr params;  // a param_pool_ slice while refs > 0
    DevPtr grads;   // a grad_pool_ slice between acquire(kBackward) and release(kBackward)
  };
  void note_held();

  const ParamLayout& layout_;
  Ops& ops_;
  Communicator& dp_;
  ShardPlan plan_;
  DType compute_ = DType::kF32;
  DeviceBuffer param_shard_;
  DeviceBuffer grad_shard_;
  BufferStack param_pool_;
  BufferStack grad_pool_;
  DeviceBuffer scratch_;
  std::vector<Gathered> gathered_;  // by group
  ReduceScatterQueue* queue_ = nullptr;
  // Prefetch: the learned gather order, where this window is in it, the pending gather.
  // What a gather of `chunk` sends: the masters' slice (f32), or its bf16 cast written
  // to `staging` (one chunk of the compute dtype).
  DevPtr gather_source(const ShardChunk& chunk, DevPtr staging);
  void gather_into(int group, DevPtr params);  // synchronous (or the prefetched one)
  void prefetch_after(int group);              // at a gather: the next one, if known
  void cancel_prefetch();
  bool prefetch_on_ = false;
  bool in_step_ = false;
  bool learning_ = true;   // the first window records order_
  bool following_ = false;  // this window still follows order_
  std::vector<int> order_;
  size_t cursor_ = 0;  // gathers of this window so far
  DeviceBuffer prefetch_;  // [dp (+ 1 staged in bf16), max chunk] of the compute dtype
  int prefetched_group_ = -1;
  CommWork prefetch_work_;
  int prefetch_misses_ = 0;
  size_t held_params_ = 0;
  size_t held_grads_ = 0;
  size_t peak_ = 0;
  size_t peak_params_ = 0;
  size_t peak_grads_ = 0;
};

class GradShardedParamStore : public ParamStore {
 public:
  // Parameters and the gradient shard start zero; fill parameters through param_data().
  // `compute`: the parameters' dtype, f32 or bf16.
  GradShardedParamStore(const ParamLayout& layout, Ops& ops, Communicator& dp,
                        DType compute = DType::kF32);
  ~GradShardedParamStore() override = default;

  void acquire(int group, Phase phase) override;
  void release(int group, Phase phase) override;
  DevPtr params(int group) override { return param_data() + layout_.groups[group].offset; }
  DevPtr grads(int group) override;  // CHECK: acquired for kBackward (non-empty group)
  DType compute_dtype() const override { return compute_; }

  // The resident flat parameter buffer (layout.total_floats() elements, compute dtype).
  DevPtr param_data() { return params_.as(compute_); }
  size_t num_floats() const { return total_; }
  // This rank's gradient shard (plan().shard_floats() floats); one chunk per group.
  DevPtr grad_shard() { return grad_shard_.as(DType::kF32); }
  // As ShardedParamStore::set_reduce_queue.
  void set_reduce_queue(ReduceScatterQueue* queue) { queue_ = queue; }
  const ShardPlan& plan() const { return plan_; }

  // Bytes allocated at construction: the gradient pool (max_held_group_floats() f32)
  // and the reduce-scatter scratch.
  size_t grad_pool_bytes() const { return grad_pool_.capacity(); }
  size_t scratch_bytes() const { return scratch_.bytes(); }
  // Bytes of the pool in use now (full group gradient buffers), and the most in use at
  // once since construction / reset_peak().
  size_t held_grad_bytes() const { return held_grads_; }
  size_t peak_held_grad_bytes() const { return peak_grads_; }
  void reset_peak() { peak_grads_ = held_grads_; }

 private:
  struct Held {
    int refs = 0;  // outstanding backward acquires
    DevPtr grads;  // a grad_pool_ slice while refs > 0
  };

  const ParamLayout& layout_;
  Ops& ops_;
  Communicator& dp_;
  size_t total_ = 0;
  DType compute_ = DType::kF32;
  ShardPlan plan_;
  DeviceBuffer params_;
  DeviceBuffer grad_shard_;
  BufferStack grad_pool_;
  DeviceBuffer scratch_;
  std::vector<Held> held_;  // by group
  ReduceScatterQueue* queue_ = nullptr;
  size_t held_grads_ = 0;
  size_t peak_grads_ = 0;
};

}  // namespace trident
