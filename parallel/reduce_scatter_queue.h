// Overlapped gradient reduce-scatters (parallel.overlap_grad_reduce): the asynchronous
// form of reduce_scatter_add (parallel/shard_plan.h), for ZeRO-1's buckets and
// the per-group reductions of ZeRO-2/3.
//
// issue(chunk, full, shard) packs the chunk's full gradients into a free scratch slot
// (at once, on the caller's thread, so `full` may be overwritten or freed when issue
// returns) and issues an ireduce_scatter on the dp communicator; the work completes
// later, while backward goes on. Completing a work (the 1/dp scale and the add into
// shard[chunk.shard_offset ...]) happens on the caller's thread, in issue order: when a
// slot is needed and all are in flight (the oldest is completed first), and in drain().
// So every shard element receives the same additions in the same order as the
// synchronous reduce_scatter_add calls would give it, and overlap on and off train
// bitwise identically.
//
// Memory: `depth` slots of collective_scratch_bytes(dp, max_chunk_floats) each, allocated
// at construction; a slot is reused only after its collective has completed. The shard
// must not be read until drain() (the owner, DataParallel, drains in reduce_gradients).
// Every dp rank must issue the same chunks in the same order (the communicator's
// ordering rule). Not thread-safe; the Ops and communicator must outlive the queue, and
// it must be drained before it is destroyed (an unfinished CommWork CHECK-fails).
#pragma once

#include <cstddef>
#include <deque>
#include <string>

#include "comm/communicator.h"
#include "kernels/ops.h"
#include "parallel/shard_plan.h"

namespace trident {

class ReduceScatterQueue {
 public:
  // depth >= 1 (CHECK): reduce-scatters in flight at once.
  ReduceScatterQueue(Ops& ops, Communicator& dp, size_t max_chunk_floats, int depth = 2);

  void issue(const ShardChunk& chunk, DevPtr full, DevPtr shard, const std::string& label);
  // Completes every issued reduce-scatter, in issue order.
  void drain();
  size_t in_flight() const { return pending_.size(); }
  size_t scratch_bytes() const { return scratch_.bytes(); }
  static size_t scratch_bytes(int dp, size_t max_chunk_floats, int depth);

 private:
  struct Pending {
    CommWork work;
    DevPtr result;  // the slot's segment: this rank's summed chunk
    DevPtr shard;   // where it is added
    size_t floats = 0;
  };
  void complete_oldest();

  Ops& ops_;
  Communicator& dp_;
  size_t slot_bytes_ = 0;
  int depth_ = 1;
  int next_slot_ = 0;
  DeviceBuffer scratch_;
  std::deque<Pending> pending_;
};

}  // namespace trident
