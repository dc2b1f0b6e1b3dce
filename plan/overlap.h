// The data-parallel communication a step leaves exposed (docs/PLAN.md "Time: overlap"):
// a rank's compute thread runs its ops (one parameter group's forward or backward) in
// order while the dp communicator's collectives run in issue order on one communication
// stream, as the trainer issues them (parallel/data_parallel.h "Overlap",
// parallel/sharded_param_store.h, parallel/reduce_scatter_queue.h):
//   gather   ZeRO-3's all-gather of the op's group, needed before the op starts. With
//            prefetch (parallel.overlap_param_gather) it is issued when the previous
//            gathering op starts (one gather ahead, so it runs behind that op's compute);
//            the first gather of the step, and every gather without prefetch, is issued
//            at the op's start and waited for.
//   reduce   a gradient reduction issued when the op ends, in `pieces` equal collectives
//            (ZeRO-0/1: the group's buckets; ZeRO-2/3: one reduce-scatter). Async
//            (parallel.overlap_grad_reduce) it runs behind the ops that follow; a bounded
//            queue (ReduceScatterQueue, 2 slots) makes the compute thread wait for the
//            oldest reduction before it issues one more. Sync it is waited for at once.
// The step ends when the ops are done and every collective has completed (the trainer's
// reduce_gradients). The communication stream progresses while an op computes, and not
// while the op's tensor-parallel collectives hold the same link (`busy`: tp on NVLink
// while dp is on NVLink too; when dp crosses nodes and tp does not, tp time is free).
// What no compute covers is the result: the step's length minus the ops' own time.
// Thread-compatible; pure arithmetic.
#pragma once

#include <vector>

namespace trident {

struct OverlapOp {
  double compute = 0;   // seconds during which the dp link is free
  double busy = 0;      // seconds of the op during which the dp link is taken (after compute)
  double gather = 0;    // seconds of the gather needed before the op (0: none)
  double reduce = 0;    // seconds of the reduction issued at the op's end (0: none)
  int pieces = 1;       // collectives the reduction is issued as (equal shares)
};

struct OverlapPolicy {
  bool prefetch = false;      // gathers issued one ahead (else at the op, waited for)
  bool async_reduce = false;  // reductions issued and left running (else waited for)
  int queue_depth = 0;        // reductions in flight at most (0: unbounded)
  // The share of its speed an op's compute keeps while a collective is in flight: 1 on a
  // GPU (NCCL runs on its own SMs and links); below 1 on CPU ranks, whose communication
  // thread runs a blocking MPI collective (polling shared memory) on the cores the ranks'
  // compute threads use. The compute the thread loses lengthens the step (exposed) and
  // is returned apart from the waits (exposed_dp_seconds' `slowdown`).
  double compute_rate_in_flight = 1;
  // The share of its speed a collective keeps while an op computes beside it: 1 on a GPU;
  // on CPU ranks the communication thread gets a share of the same cores as the compute
  // threads, and the whole core only while the compute thread waits for it. (Both CPU
  // rates: the threads' shares of the cores, or a calibrated table's; plan.cpp.)
  double comm_rate_in_compute = 1;
  // Synchronous reductions waited for after the last op instead of at each op's end
  // (ZeRO-0/1 without overlap: the trainer reduces the buckets in reduce_gradients). The
  // same exposed time; only where the compute thread waits differs (`segments`).
  bool reduce_at_end = false;
};

// The compute between the compute thread's waits on the dp stream (a wait is where a rank
// meets its group's other ranks: the collective completes only once the last of them has
// issued it): the sum of the segments' seconds and of their squares, the step's end
// (everything issued completes) closing the last one (plan.cpp arrival_skew_seconds).
struct WaitSegments {
  double sum = 0, squares = 0;
  double open = 0;  // compute before the ops since the last wait (a caller's earlier micro-batches)
  void add(double d, double count = 1) {
    sum += count * d;
    squares += count * d * d;
  }
};

// Seconds the dp stream adds to the ops in `ops` (>= 0): the step's end (every collective
// completed) minus the sum of the ops' compute + busy. Of it, `*slowdown` (when given) is
// what the ops' compute lost to collectives in flight beside it (compute_rate_in_flight
// < 1; 0 on a GPU), the rest the compute thread's waits. `*segments` (when given) gets the
// ops' compute between the waits (a wait of any length is one).
double exposed_dp_seconds(const std::vector<OverlapOp>& ops, const OverlapPolicy& policy,
                          double* slowdown = nullptr, WaitSegments* segments = nullptr);

}  // namespace trident
