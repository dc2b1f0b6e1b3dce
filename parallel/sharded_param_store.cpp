#include "parallel/sharded_param_store.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "parallel/reduce_scatter_queue.h"

namespace trident {

namespace {
// A ZeRO-2/3 release(kBackward): group g's chunks reduce-scattered into the shard, now
// (scratch) or on the overlap queue.
void reduce_group(Ops& ops, Communicator& dp, const ShardPlan& plan, int group, DevPtr grads,
                  DevPtr shard, DevPtr scratch, ReduceScatterQueue* queue,
                  const std::string& label) {
  for (int c : plan.group_chunks(group)) {
    const ShardChunk& chunk = plan.chunks()[static_cast<size_t>(c)];
    if (queue != nullptr) {
      queue->issue(chunk, grads, shard, label);
    } else {
      reduce_scatter_add(ops, dp, chunk, grads, shard, scratch, label);
    }
  }
}
}  // namespace

bool head_reads_embeddings(const ParamLayout& layout) {
  if (layout.groups.size() < 2) return false;
  return !layout.groups.front().params.empty() && !layout.groups.back().params.empty() &&
         layout.find("lm_head.weight") == nullptr;
}

size_t max_held_group_floats(const ParamLayout& layout) {
  size_t most = 0;
  for (const ParamGroup& g : layout.groups) {
    if (!g.params.empty()) most = std::max(most, g.num_floats);
  }
  if (head_reads_embeddings(layout)) {
    most = std::max(most, layout.groups.front().num_floats + layout.groups.back().num_floats);
  }
  return most;
}

namespace {
std::vector<size_t> group_offsets(const ParamLayout& layout) {
  std::vector<size_t> base;
  for (const ParamGroup& g : layout.groups) base.push_back(g.offset);
  return base;
}

std::string group_name(const char* what, int group) {
  return std::string(what) + " of group " + std::to_string(group);
}
}  // namespace

ShardedParamStore::ShardedParamStore(const ParamLayout& layout, Ops& ops, Communicator& dp,
                                     DType compute)
    : layout_(layout),
      ops_(ops),
      dp_(dp),
      // One chunk per group: a group moves in one collective.
      plan_(layout, dp.size(), group_offsets(layout), static_cast<size_t>(-1)),
      compute_((check_compute_dtype(compute), compute)),
      param_shard_(ops, plan_.shard_floats() * sizeof(float)),
      grad_shard_(ops, plan_.shard_floats() * sizeof(float)),
      param_pool_(ops, max_held_group_floats(layout) * dtype_size(compute_),
                  "zero3 gathered parameters"),
      grad_pool_(ops, max_held_group_floats(layout) * sizeof(float), "zero3 group gradients"),
      scratch_(ops, collective_scratch_bytes(dp.size(), plan_.max_chunk_floats())),
      gathered_(layout.groups.size()) {}

DevPtr ShardedParamStore::gather_source(const ShardChunk& chunk, DevPtr staging) {
  const DevPtr master = param_shard() + chunk.shard_offset;
  if (compute_ == DType::kF32) return master;
  // Stream-ordered before the all-gather that reads it (the same stream, or for an async
  // gather the communicator's wait on the compute stream's work so far).
  ops_.cast(staging, master, chunk.chunk_floats);
  return staging;
}

void ShardedParamStore::note_held() {
  peak_ = std::max(peak_, held_params_ + held_grads_);
  peak_params_ = std::max(peak_params_, held_params_);
  peak_grads_ = std::max(peak_grads_, held_grads_);
}

void ShardedParamStore::acquire(int group, Phase phase) {
  const std::vector<int>& chunks = plan_.group_chunks(group);
  if (chunks.empty()) return;
  Gathered& g = gathered_[static_cast<size_t>(group)];
  const size_t floats = layout_.groups[static_cast<size_t>(group)].num_floats;
  if (g.refs++ == 0) {
    const size_t bytes = floats * dtype_size(compute_);
    // Zeroed: the alignment gaps between tensors read zero, as in a resident buffer (the
    // slice last held another group).
    g.params = param_pool_.push(bytes, /*zeroed=*/true, group_name("parameters", group))
                   .as(compute_);
    held_params_ += bytes;
    note_held();
    gather_into(group, g.params);
    prefetch_after(group);
  }
  if (phase == Phase::kBackward) {
    TRIDENT_CHECK_MSG(g.grads.is_null(),
                      "group " + std::to_string(group) + " acquired twice for backward");
    const size_t bytes = floats * sizeof(float);
    g.grads = grad_pool_.push(bytes, /*zeroed=*/true, group_name("gradients", group))
                  .as(DType::kF32);
    held_grads_ += bytes;
    note_held();
  }
}

void ShardedParamStore::gather_into(int group, DevPtr params) {
  const int dp = dp_.size();
  const std::vector<int>& chunks = plan_.group_chunks(group);
  const std::string label = "zero3 gather group " + std::to_string(group);
  if (prefetched_group_ >= 0 && prefetched_group_ != group) cancel_prefetch();
  if (prefetched_group_ == group) {
    // One chunk per group: the prefetch buffer holds the whole packed group.
    prefetch_work_.wait();
    unpack_chunk(ops_, plan_.chunks()[static_cast<size_t>(chunks.front())], dp,
                 prefetch_.as(compute_), params);
    prefetched_group_ = -1;
    return;
  }
  // bf16: the cast chunk is staged past the packed output, in the scratch's unused part
  // (dp + 1 chunks of 2 bytes in a scratch of dp + 1 chunks of 4).
  const DevPtr packed = scratch_.as(compute_);
  const DevPtr staging = packed + static_cast<size_t>(dp) * plan_.max_chunk_floats();
  for (int c : chunks) {
    const ShardChunk& chunk = plan_.chunks()[static_cast<size_t>(c)];
    dp_.all_gather(CommBuf::device(gather_source(chunk, staging), chunk.chunk_floats),
                   CommBuf::device(packed, dp * chunk.chunk_floats), {.label = label});
    unpack_chunk(ops_, chunk, dp, packed, params);
  }
}

void ShardedParamStore::prefetch_after(int group) {
  if (!prefetch_on_ || !in_step_) return;
  if (learning_) {
    order_.push_back(group);
    return;
  }
  if (!following_) return;
  if (cursor_ >= order_.size() || order_[cursor_] != group) {
    following_ = false;  // departed from the learned order: no more guesses this window
    return;
  }
  ++cursor_;
  if (cursor_ == order_.size()) return;
  const int next = order_[cursor_];
  if (gathered_[static_cast<size_t>(next)].refs > 0) return;  // held: acquiring it gathers nothing
  const std::vector<int>& chunks = plan_.group_chunks(next);
  TRIDENT_CHECK(chunks.size() == 1);
  const ShardChunk& chunk = plan_.chunks()[static_cast<size_t>(chunks.front())];
  const DevPtr packed = prefetch_.as(compute_);
  const DevPtr staging = packed + static_cast<size_t>(dp_.size()) * plan_.max_chunk_floats();
  prefetch_work_ = dp_.iall_gather(
      CommBuf::device(gather_source(chunk, staging), chunk.chunk_floats),
      CommBuf::device(packed, dp_.size() * chunk.chunk_floats),
      {.label = "zero3 prefetch group " + std::to_string(next)});
  prefetched_group_ = next;
}

void ShardedParamStore::cancel_prefetch() {
  if (prefetched_group_ < 0) return;
  prefetch_work_.wait();
  prefetched_group_ = -1;
  ++prefetch_misses_;
  following_ = false;
}

void ShardedParamStore::enable_prefetch() {
  if (prefetch_on_) return;
  // bf16: one more chunk, the staging of the prefetch's cast (its own: it is read while
  // the gather is in flight).
  const size_t chunks = static_cast<size_t>(dp_.size()) + (compute_ == DType::kF32 ? 0 : 1);
  prefetch_ = DeviceBuffer(ops_, chunks * plan_.max_chunk_floats() * dtype_size(compute_));
  prefetch_on_ = true;
}

void ShardedParamStore::begin_step() {
  if (learning_) order_.clear();  // the window that ends first is the one learned
  in_step_ = true;
  cursor_ = 0;
  following_ = !learning_;
}

void ShardedParamStore::end_step() {
  // A prefetch is issued only for a gather the window still makes, so none is pending
  // at its end; complete one anyway rather than leave a work in flight.
  cancel_prefetch();
  if (in_step_ && learning_ && prefetch_on_) learning_ = false;
  in_step_ = false;
}

void ShardedParamStore::release(int group, Phase phase) {
  const std::vector<int>& chunks = plan_.group_chunks(group);
  if (chunks.empty()) return;
  Gathered& g = gathered_[static_cast<size_t>(group)];
  TRIDENT_CHECK_MSG(g.refs > 0, "group " + std::to_string(group) + " released, not acquired");
  if (phase == Phase::kBackward) {
    TRIDENT_CHECK_MSG(!g.grads.is_null(),
                      "group " + std::to_string(group) + " released for backward, not acquired");
    reduce_group(ops_, dp_, plan_, group, g.grads, grad_shard(), scratch_.get(), queue_,
                 "zero3 reduce group " + std::to_string(group));
    const size_t floats = layout_.groups[static_cast<size_t>(group)].num_floats;
    grad_pool_.pop(g.grads);
    held_grads_ -= floats * sizeof(float);
    g.grads = DevPtr();
  }
  if (--g.refs == 0) {
    const size_t floats = layout_.groups[static_cast<size_t>(group)].num_floats;
    param_pool_.pop(g.params);
    held_params_ -= floats * dtype_size(compute_);
    g.params = DevPtr();
  }
}

DevPtr ShardedParamStore::params(int group) {
  Gathered& g = gathered_[static_cast<size_t>(group)];
  TRIDENT_CHECK_MSG(g.refs > 0 || plan_.group_chunks(group).empty(),
                    "params of group " + std::to_string(group) + " read while not acquired");
  return g.params;
}

DevPtr ShardedParamStore::grads(int group) {
  Gathered& g = gathered_[static_cast<size_t>(group)];
  TRIDENT_CHECK_MSG(!g.grads.is_null() || plan_.group_chunks(group).empty(),
                    "grads of group " + std::to_string(group) + " used outside backward");
  return g.grads;
}

void ShardedParamStore::load_param(int param, const float* host_full) {
  const TensorShard& t = plan_.tensor(param);
  const int rank = dp_.rank();
  const size_t n = t.split.owned_floats(rank);
  ops_.upload(param_shard() + t.shard_offset, host_full + t.split.begin_float(rank),
              n * sizeof(float));
}

std::vector<float> ShardedParamStore::gather_param(int param) {
  const TensorShard& t = plan_.tensor(param);
  const size_t padded = t.split.padded_floats();
  const size_t numel = static_cast<size_t>(t.split.rows * t.split.row_elems);
  std::vector<float> out(numel);
  if (padded == 0) return out;
  const int dp = dp_.size();
  // padded <= the chunk of its group, so the scratch holds dp of them.
  const DevPtr gathered = scratch_.as(DType::kF32);
  dp_.all_gather(CommBuf::device((param_shard() + t.shard_offset), padded),
                 CommBuf::device(gathered, dp * padded),
                 {.label = "gather " + layout_.params[static_cast<size_t>(param)].name});
  // Rank r's rows start at row r * rows_per_rank, so the padded segments laid end to end
  // are the tensor followed by padding.
  ops_.download(out.data(), gathered, numel * sizeof(float));
  return out;
}

// ---- ZeRO-2 ------------------------------------------------------------------------------

GradShardedParamStore::GradShardedParamStore(const ParamLayout& layout, Ops& ops,
                                             Communicator& dp, DType compute)
    : layout_(layout),
      ops_(ops),
      dp_(dp),
      total_(layout.total_floats()),
      compute_((check_compute_dtype(compute), compute)),
      // One chunk per group: a group's gradients move in one collective. The shard
      // buffer's layout does not depend on the chunking (padded shards in group, offset
      // order), so it matches any bucketed plan of the same layout and dp.
      plan_(layout, dp.size(), group_offsets(layout), static_cast<size_t>(-1)),
      params_(ops, total_ * dtype_size(compute_)),
      grad_shard_(ops, plan_.shard_floats() * sizeof(float)),
      grad_pool_(ops, max_held_group_floats(layout) * sizeof(float), "zero2 group gradients"),
      scratch_(ops, collective_scratch_bytes(dp.size(), plan_.max_chunk_floats())),
      held_(layout.groups.size()) {}

void GradShardedParamStore::acquire(int group, Phase phase) {
  if (phase != Phase::kBackward || plan_.group_chunks(group).empty()) return;
  Held& h = held_[static_cast<size_t>(group)];
  if (h.refs++ > 0) return;  // nested: accumulate into the buffer already held
  const size_t bytes = layout_.groups[static_cast<size_t>(group)].num_floats * sizeof(float);
  h.grads = grad_pool_.push(bytes, /*zeroed=*/true, group_name("gradients", group))
                .as(DType::kF32);
  held_grads_ += bytes;
  peak_grads_ = std::max(peak_grads_, held_grads_);
}

void GradShardedParamStore::release(int group, Phase phase) {
  if (phase != Phase::kBackward || plan_.group_chunks(group).empty()) return;
  Held& h = held_[static_cast<size_t>(group)];
  TRIDENT_CHECK_MSG(h.refs > 0,
                    "group " + std::to_string(group) + " released for backward, not acquired");
  if (--h.refs > 0) return;
  reduce_group(ops_, dp_, plan_, group, h.grads, grad_shard(), scratch_.get(), queue_,
               "zero2 reduce group " + std::to_string(group));
  grad_pool_.pop(h.grads);
  held_grads_ -= layout_.groups[static_cast<size_t>(group)].num_floats * sizeof(float);
  h.grads = DevPtr();
}

DevPtr GradShardedParamStore::grads(int group) {
  const Held& h = held_[static_cast<size_t>(group)];
  TRIDENT_CHECK_MSG(h.refs > 0 || plan_.group_chunks(group).empty(),
                    "grads of group " + std::to_string(group) + " used outside backward");
  return h.grads;
}

}  // namespace trident
