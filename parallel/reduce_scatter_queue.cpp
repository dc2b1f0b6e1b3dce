#include "parallel/reduce_scatter_queue.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace trident {

size_t ReduceScatterQueue::scratch_bytes(int dp, size_t max_chunk_floats, int depth) {
  return static_cast<size_t>(depth) * collective_scratch_bytes(dp, max_chunk_floats);
}

ReduceScatterQueue::ReduceScatterQueue(Ops& ops, Communicator& dp, size_t max_chunk_floats,
                                       int depth)
    : ops_(ops),
      dp_(dp),
      slot_bytes_(collective_scratch_bytes(dp.size(), max_chunk_floats)),
      depth_(depth),
      scratch_(ops, scratch_bytes(dp.size(), max_chunk_floats, std::max(depth, 0))) {
  TRIDENT_CHECK_MSG(depth >= 1, "ReduceScatterQueue depth must be >= 1");
}

void ReduceScatterQueue::issue(const ShardChunk& chunk, DevPtr full, DevPtr shard,
                               const std::string& label) {
  // Slots are taken round-robin and completed in issue order, so with every slot in
  // flight the oldest work is the one holding the next slot.
  if (pending_.size() == static_cast<size_t>(depth_)) complete_oldest();
  const size_t n = static_cast<size_t>(dp_.size());
  TRIDENT_CHECK(collective_scratch_bytes(dp_.size(), chunk.chunk_floats) <= slot_bytes_);
  const DevPtr packed = (scratch_.get() + static_cast<size_t>(next_slot_) * slot_bytes_).as(DType::kF32);
  next_slot_ = (next_slot_ + 1) % depth_;
  const DevPtr mine = packed + n * chunk.chunk_floats;
  pack_chunk(ops_, chunk, dp_.size(), full, packed);
  Pending p;
  p.work = dp_.ireduce_scatter(CommBuf::device(packed, n * chunk.chunk_floats),
                               CommBuf::device(mine, chunk.chunk_floats), {.label = label});
  p.result = mine;
  p.shard = shard + chunk.shard_offset;
  p.floats = chunk.chunk_floats;
  pending_.push_back(std::move(p));
}

void ReduceScatterQueue::complete_oldest() {
  Pending& p = pending_.front();
  p.work.wait();
  finish_reduce_scatter(ops_, dp_.size(), p.result, p.shard, p.floats);
  pending_.pop_front();
}

void ReduceScatterQueue::drain() {
  while (!pending_.empty()) complete_oldest();
}

}  // namespace trident
