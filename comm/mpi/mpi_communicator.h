// The MPI backend of Communicator (Open MPI 4.1 on CPU; on GPUs the host twins and the
// bootstrap of the NCCL world, comm/nccl_world.h). This header deliberately does not
// include <mpi.h>: the rest of the tree reaches MPI only through comm/communicator.h and
// this factory.
//
// Contract (beyond comm/communicator.h):
// - MPI is initialized with MPI_THREAD_MULTIPLE (at least MPI_THREAD_SERIALIZED must be
//   provided) if nobody has initialized it; a process that initialized MPI itself
//   (tests/common/mpi_main.cpp) keeps that duty and its finalize.
// - Async collectives (communicator.h "Asynchronous collectives"): when MPI provides
//   MPI_THREAD_MULTIPLE, the first async call of a communicator duplicates its MPI_Comm
//   (MPI_Comm_dup, collective, in call order) and starts its communication thread; each
//   async call queues the same blocking MPI call the synchronous one makes, on the
//   duplicate, and that thread runs the queue in issue order (the caller's later
//   synchronous calls go on the original MPI_Comm concurrently: separate communicators,
//   each matched in order on every rank). wait() blocks on the task's completion flag,
//   not in MPI; a transport error is reported by wait()/test() on the caller's thread.
//   Below MPI_THREAD_MULTIPLE the async calls complete at issue (the base default). The
//   destructor joins the thread and frees the duplicate after check_no_outstanding_work().
//   Cost: the thread busy-polls inside MPI while a collective is in flight (Open MPI's
//   blocking progress), i.e. one core per communicator with work in flight. ibatch_p2p
//   is one task of that thread too: MPI_Isend / MPI_Irecv of every operation on the
//   duplicate, then MPI_Waitall.
// - Every communicator (world and split children) shares one runtime handle; the last
//   one destroyed calls MPI_Finalize when this file did the MPI_Init. Children free their
//   MPI_Comm on destruction.
// - isend is MPI_Isend from a copy of the payload in a staging buffer of the
//   communicator's grow-only pool (the copy runs inside the call's DeviceAccessScope for
//   device memory); finished requests are reaped (MPI_Test) on each isend and their
//   buffers reused, the rest complete in wait_sends (MPI_Waitall) or, at the latest, in
//   the destructor before MPI_Comm_free. A warm isend allocates nothing.
// - bf16 travels as a committed 2-byte contiguous type; its sum and max are user-defined
//   commutative MPI_Ops (fp32 add, one round to nearest even per combining step; see
//   communicator.h "Reductions"), created once with the runtime and freed before
//   MPI_Finalize.
// - Either memory space: on CPU both are host RAM, so MPI reads and writes device
//   buffers directly (inside the scope the public call opens).
// - Communicators use MPI_ERRORS_RETURN, and every MPI call goes through TRIDENT_MPI_CHECK
//   (mpi_check.h), which aborts naming rank, group, collective, label and MPI's error
//   string, instead of MPI's default handler, which names none of them.
// - Determinism: MPI_Allreduce / MPI_Reduce_scatter_block pick their algorithm from
//   (group size, count), so a fixed layout reduces in a fixed order: bitwise identical
//   run to run and across the group (tests/comm/collectives_mpi_test.cpp checks both).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace trident {

// The "world" group over a private duplicate of MPI_COMM_WORLD; initializes MPI if
// needed (see above). Collective: every process of the launch calls it once at start-up.
std::unique_ptr<Communicator> make_mpi_world_communicator(int* argc, char*** argv);

// The MPI library's name and version, e.g. "Open MPI v4.1.4" (MPI_Get_library_version up
// to its first comma; callable before MPI_Init).
std::string mpi_library_version();

}  // namespace trident
