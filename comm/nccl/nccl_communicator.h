// The NCCL backend of Communicator (issue 9 item 1): device-memory
// groups over NCCL, each with a host twin for host values. Built with the CUDA backend
// (TRIDENT_HAVE_CUDA); no NCCL or CUDA header is visible through this file. COMPILED AND
// HOST-TESTED ONLY: no line of it has run on a GPU yet (tests/comm/nccl/nccl_communicator_test.cpp
// holds the GPU tests, run by scripts/gpu_check.sh's nccl step).
//
// Shape (the four splits of comm/topology.h work unchanged):
// - make_nccl_world_communicator(host) returns the WORLD: a host-space communicator
//   (backend "nccl") whose collectives go to `host` (the MPI world, or a SelfCommunicator
//   for one process), and which owns the NCCL world communicator. Its split(...,
//   MemSpace::kDevice) makes an NCCL group (ncclCommSplit of its NCCL communicator); its
//   split(..., MemSpace::kHost) returns the host split itself.
// - A group of ONE (its host twin has size 1, e.g. tp = 1 or pp = 1 inside a bigger world)
//   is not an NCCL group: split returns a device-space SelfCommunicator (backend "self")
//   whose reduce-scatter / all-gather copies are cudaMemcpyAsync on the compute stream
//   (host-synchronous without one, like the NCCL calls); its reductions are no-ops. The
//   rank still takes part in the parent's ncclCommSplit (collective), with
//   NCCL_SPLIT_NOCOLOR. NcclWorldOptions::nccl_groups_of_one keeps NCCL for them (the GPU
//   tests: a one-GPU machine can test NCCL only on groups of one). The trainer makes no
//   NCCL world at all for a world of one (trainer/trainer.h).
// - An NCCL group (device space, backend "nccl") runs every collective on device buffers
//   through NCCL and owns its HOST TWIN: the split of the parent's host communicator with
//   the same color and key (so the same members in the same order; checked: the NCCL
//   rank and size must equal the twin's, else the split aborts naming the group). Its
//   barrier is a host barrier of the twin after this rank's NCCL work has finished; its
//   split(..., kHost) returns the twin's split; its split(..., kDevice) an NCCL group.
// - Splits: every split is a collective of the host twin first (MPI_Comm_split: the twin
//   child), then, for device space, of NCCL: ncclCommSplit(parent, color, key) with
//   kNoGroup -> NCCL_SPLIT_NOCOLOR; NCCL orders a group by (key, parent rank) like MPI.
//
// Contract beyond comm/communicator.h:
// - Non-blocking communicators (ncclConfig_t blocking = 0): no NCCL call blocks the host
//   inside NCCL. After every call the backend polls ncclCommGetAsyncError until the
//   communicator leaves ncclInProgress; an error state aborts through Communicator::fail
//   (message: group, rank, call, label, NCCL's error name and ncclGetLastError text). A
//   call that is still in progress after its timeout (effective_timeout + 1 s of grace,
//   so a running hang watchdog, which knows the step, reports first) goes down the abort
//   path of nccl_abort.h: every NCCL communicator aborted (bounded), exit 1.
// - Streams. With NcclWorldOptions::compute_stream set (the CUDA Ops' stream), device
//   collectives are STREAM-ORDERED on it: enqueued after the kernels before them, seen
//   by the kernels after them; the call returns once NCCL has enqueued (the host sees
//   results through Ops::download). Asynchronous errors of such calls are found by the
//   next call's poll of ncclCommGetAsyncError. Without a compute stream (or with
//   synchronous = true) every device call is HOST-SYNCHRONOUS: cudaDeviceSynchronize
//   first (the Ops' stream is non-blocking, so only a device-wide sync orders it before
//   NCCL without its handle), then the collective on this group's own high-priority
//   stream, then a poll of a completion event and of ncclCommGetAsyncError until done or
//   the timeout: the watchdog then sees the call's real extent.
// - Point-to-point: NCCL has no tags; the base class still checks them, and sends to one
//   peer are received in issue order (pairs must match in order, which the ordering
//   contract already demands). send/isend/recv are single ncclSend/ncclRecv; isend is
//   the blocking send (stream-ordered: a later kernel writing the buffer runs after the
//   send has read it, so "copy semantics" hold in stream order). batch_p2p is one
//   ncclGroupStart/End with the operations in their posting order, so ranks that send
//   to each other at once cannot deadlock; ibatch_p2p enqueues the same group on the
//   communicator's own stream between events, as the async collectives do.
// - Reductions: f32, bf16 (ncclBfloat16), f64, i64; sum and max. A bf16 sum is NCCL's:
//   NCCL combines in its own order and precision (ring or tree, chosen by size and
//   topology), NOT the MPI backend's fp32-add-then-round per step of communicator.h
//   "Reductions": results are not bitwise equal to the MPI backend's; they are
//   deterministic for a fixed group, size, count and NCCL version/topology (NCCL's
//   reductions do not depend on timing), but only a GPU run can confirm it.
// - Teardown: a communicator synchronises only what it owns (its communication stream),
//   never the compute stream it was given (the Ops own it, and may be gone). A group's
//   NCCL communicator is finalized (ncclCommFinalize, polled to
//   completion, bounded) and destroyed (ncclCommDestroy) when its last user goes; every
//   child keeps its parent's NCCL communicator alive, so children are destroyed before
//   the world whatever order the caller destroys them in; the host twin goes after the
//   NCCL communicator (MPI_Finalize after the last NCCL teardown). Nothing resets the
//   CUDA context (cudaDeviceReset): the primary context outlives every communicator.
// - Every live NCCL communicator is registered with nccl_abort.h (abort newest first).
// - Threads: the communicator contract's (one thread at a time); only the abort path runs
//   from another thread (ncclCommAbort is the one NCCL call meant for that).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace trident {

struct NcclWorldOptions {
  // cudaSetDevice(device) before anything else; -1 = the current device.
  int device = -1;
  // The CUDA Ops' compute stream (a cudaStream_t); null = host-synchronous calls (above).
  void* compute_stream = nullptr;
  // Wait for every device call to complete even with a compute stream (debugging, like
  // TRIDENT_CUDA_SYNC=1).
  bool synchronous = false;
  // How long ncclCommInitRankConfig may stay in progress before the world gives up.
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};
  // Device groups of one are NCCL groups too, instead of SelfCommunicators (above).
  bool nccl_groups_of_one = false;
};

// The world (see above) over `host` (host space; the MPI world or a SelfCommunicator).
// Collective over `host`. Fails (every rank, never a hang) when a rank has no usable CUDA
// device, the unique id cannot be shared, or NCCL cannot initialise; the message names
// the rank, the reason (NCCL's: its error name, ncclGetErrorString and ncclGetLastError)
// and the launch environment this rank saw (nccl_world_error_text).
// Takes `host` (the world owns it); on failure it is destroyed.
Result<std::unique_ptr<Communicator>> make_nccl_world_communicator(
    std::unique_ptr<Communicator> host, const NcclWorldOptions& options = {});

// ---- the mapping tables (host-testable) ---------------------------------------------
// ncclDataType_t of a dtype (f32 ncclFloat32, bf16 ncclBfloat16, i32 ncclInt32, f64
// ncclFloat64, i64 ncclInt64, u8 ncclUint8), as an int; nullopt for none.
std::optional<int> nccl_data_type(DType dtype);
// "ncclBfloat16", ...; "?" for none.
const char* nccl_data_type_name(DType dtype);
// ncclRedOp_t: kSum ncclSum, kMax ncclMax.
int nccl_red_op(ReduceOp op);
// ncclCommSplit's color: kNoGroup -> NCCL_SPLIT_NOCOLOR, others unchanged.
int nccl_split_color(int color);
// "ncclUnhandledCudaError (1): unhandled cuda error (...): <last error>" for an
// ncclResult_t; `last` (ncclGetLastError) may be null or empty.
std::string nccl_result_text(int result, const char* last);
// The message of a failed world, e.g. "NCCL world: rank 1 of 2: ncclCommInitRankConfig
// failed: ncclSystemError (2): ...: <last error> (launcher OMPI_COMM_WORLD_SIZE;
// OMPI_COMM_WORLD_RANK=1 ...; CUDA_VISIBLE_DEVICES=1)"; environment: launch_environment().
std::string nccl_world_error_text(int rank, int size, const std::string& what,
                                  const std::string& environment);
// The message of a call that outlived its timeout, e.g. "NCCL: all_reduce 'grad bucket 3'
// in group 'dp' (rank 1/4) still in progress after 30000 ms (timeout 29000 ms + 1000 ms
// grace); aborting every NCCL communicator".
std::string nccl_timeout_message(const std::string& group, int rank, int size, const char* call,
                                 const std::string& label, std::chrono::milliseconds waited,
                                 std::chrono::milliseconds timeout);

}  // namespace trident
