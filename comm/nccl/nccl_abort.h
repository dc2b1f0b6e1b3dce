// The NCCL abort path: what the hang watchdog (comm/watchdog.h) does on a missed deadline
// or an asynchronous NCCL error when NCCL communicators exist (docs/ARCHITECTURE.md "Failures": on
// NCCL the watchdog aborts the communicators). Built with
// comm/nccl/ (TRIDENT_HAVE_CUDA); no NCCL header here.
//
// Contract:
// - Every live NCCL communicator of the process (nccl_communicator.h) registers an abort
//   action here when it is created and unregisters it in its destructor. The registry is
//   process-wide and thread-safe (a mutex held only to copy or edit the list, never while
//   an action runs), so the watchdog thread may abort while the training thread is inside
//   a communicator call.
// - abort_nccl_communicators runs every registered action (ncclCommAbort), newest first
//   (children were made after their parents: children before the world, as in a normal
//   teardown), on a detached helper thread, and waits at most `bound`: ncclCommAbort
//   "nominally shouldn't hang though it sometimes does" (pytorch#119250, NVIDIA/nccl#549),
//   so a stuck abort never keeps the process alive. Each action runs at most once.
// - abort_nccl_and_exit writes `message` and a line saying how many communicators were
//   aborted (or that the abort did not finish within the bound) to stderr with write(2),
//   then std::_Exit(kWatchdogExitCode): no destructors, no atexit handlers, no
//   MPI_Finalize, as the watchdog's own exit (comm/watchdog.h). The process is gone at
//   most `bound` (+ the write) after the call.
// - nccl_hang_handler is the WatchdogOptions::on_hang that does this for a HangReport;
//   installing it needs no change to comm/communicator.* or comm/watchdog.*.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "comm/watchdog.h"

namespace trident {

// How long the abort path waits for ncclCommAbort before exiting anyway.
inline constexpr std::chrono::milliseconds kNcclAbortBound{2000};

// Registers an abort action named `what` (e.g. "group 'dp' (rank 1/4)"); returns its id.
std::uint64_t register_nccl_abort(std::string what, std::function<void()> abort);
// Removes it (no-op for an unknown id or an action already run).
void unregister_nccl_abort(std::uint64_t id);
// Actions registered and not yet run (for tests).
std::size_t registered_nccl_aborts();

struct NcclAbortOutcome {
  std::size_t aborted = 0;  // actions that returned within the bound
  std::size_t pending = 0;  // actions still running (or not started) at the bound
  std::string names;        // "group 'dp' (rank 1/4), group 'world' (rank 1/4)"
};
// Runs and unregisters every action (newest first) and waits at most `bound`.
NcclAbortOutcome abort_nccl_communicators(std::chrono::milliseconds bound = kNcclAbortBound);

// The line abort_nccl_and_exit writes after `message`, e.g. "watchdog: aborted 2 NCCL
// communicators (group 'tp' (rank 0/1), group 'world' (rank 0/1)); exiting 1" or
// "...: 1 of 2 NCCL communicators not aborted after 2.0 s; exiting 1 anyway".
std::string nccl_abort_summary(const NcclAbortOutcome& outcome, std::chrono::milliseconds bound);

// Aborts every NCCL communicator (bounded), reports, and ends the process with exit code 1.
[[noreturn]] void abort_nccl_and_exit(const std::string& message,
                                      std::chrono::milliseconds bound = kNcclAbortBound);

// WatchdogOptions::on_hang for a process with NCCL communicators.
std::function<void(const HangReport&)> nccl_hang_handler(
    std::chrono::milliseconds bound = kNcclAbortBound);

}  // namespace trident
