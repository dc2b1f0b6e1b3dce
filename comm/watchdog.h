// Hang watchdog: ends a process whose communicator call has blocked past its timeout,
// saying which call, group and step, so a dead or hung peer ends the job instead of
// stalling it (docs/ARCHITECTURE.md "Failures"; PyTorch c10d's watchdog, without the teardown
// subtleties: we do not try to recover, the next launch resumes from a checkpoint).
//
// Contract:
// - Off unless a Watchdog exists. Constructing one starts one background thread and
//   installs it as the process's CallObserver (comm/communicator.h); destroying it
//   stops the thread and uninstalls it. At most one per process; create and destroy it
//   while no communicator call is in flight (at start-up, after the world communicator,
//   and at shutdown). Idle cost per call: one atomic load; running: a mutex and a map
//   insert/erase around each blocking call (negligible next to any transfer).
// - What is watched: every blocking call through a Communicator's public interface
//   (collectives, send/recv, isend, wait_sends, barrier, split), from the backend hook's
//   entry to its return. Deadline = entry + opts.timeout, or + the communicator's
//   default_timeout() when opts.timeout is 0. Work outside communicator calls (compute,
//   I/O, sleep) is never watched: a rank stuck there is detected by its peers, whose
//   collectives with it time out and name the group and call they were waiting on.
// - On a missed deadline the watchdog thread builds one line, e.g.
//     [rank 3 on node7] watchdog: all_reduce 'attn.o' in group 'tp' (rank 1/2) has not
//     completed after 30.0 s (timeout 30.0 s) at step 17; a peer of this group is hung,
//     dead or in a different call; aborting
//   Once learn_hosts() has run, the line also says where the other side is: for a
//   point-to-point call "rank 1 is world rank 5 on host node3", for a collective the
//   hosts of the group's ranks ("the group's ranks are on hosts node1, node2, node3"), so
//   a dead node or a cut link is named by the ranks that waited for it.
//   The line is by default written to stderr (write(2): no stdio lock that a stuck thread may
//   hold) and ends the process with std::_Exit(kWatchdogExitCode) (no destructors, no
//   atexit handlers, no MPI_Finalize: the blocked thread still owns MPI state; no core
//   dump, unlike abort()). Under mpirun a rank that exits non-zero without finalizing
//   makes mpirun kill every other rank, the hung one included, and exit non-zero; under
//   srun pass --kill-on-bad-exit=1 for the same effect. Calls already seen are caught at
//   their deadline; a call that started less than poll_interval ago, within one poll.
//   Measured (mpi_watchdog_names_culprit_np2, Open MPI 4.1.4, one node): the message
//   says 2.0 s for a 2 s timeout and mpirun exits 1.03-1.05 s after the deadline, of
//   which 1 s is mpirun's grace between SIGTERM and SIGKILL for the other ranks
//   (odls_base_sigkill_timeout, default 1); with --mca odls_base_sigkill_timeout 0 it
//   exits about 0.06 s after the deadline.
// - Messages carry the training step set by set_step() (the trainer calls it at the start
//   of every step); before the first call they say "before the first step".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace trident {

// The exit code of a failure (docs/ARCHITECTURE.md "Commands and exit codes").
inline constexpr int kWatchdogExitCode = 1;

// A call that missed its deadline, as the watchdog saw it.
struct HangReport {
  std::string call;   // "all_reduce", "recv", "wait_sends", ...
  std::string label;  // opts.label, may be empty
  std::string group;  // the communicator's name()
  int group_rank = 0;
  int group_size = 1;
  int peer = -1;       // group rank of the other end of a send/recv, else -1
  int world_rank = 0;  // process_identity().rank (core/check.h)
  int peer_world_rank = -1;  // the peer's world rank, when the communicator knows it
  std::string peer_host;     // the peer's host, once learn_hosts() has run; else empty
  // The distinct hosts of the group's ranks in group-rank order (once learn_hosts() has
  // run and the communicator knows its members' world ranks; else empty).
  std::vector<std::string> group_hosts;
  double timeout_s = 0;
  double waited_s = 0;     // time since the call started, when the watchdog noticed
  std::int64_t step = -1;  // the last set_step() value; -1 = none yet
  std::string message;     // the line above, without a trailing newline
};

struct WatchdogOptions {
  // Upper bound on how long a newly started call goes unseen; calls already seen are
  // checked exactly at their deadline. Also bounds how late the destructor joins.
  std::chrono::milliseconds poll_interval{1000};
  // What to do on a missed deadline, on the watchdog thread. Empty (the default): write
  // report.message to stderr and std::_Exit(kWatchdogExitCode). Tests pass a recorder;
  // when it returns, the call is reported once and the watchdog keeps watching.
  std::function<void(const HangReport&)> on_hang;
};

class Watchdog final : public CallObserver {
 public:
  explicit Watchdog(WatchdogOptions options = {});
  ~Watchdog() override;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The training step for messages; any thread, lock-free.
  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  // Calls being watched right now (for tests).
  std::size_t in_flight() const;
  // Every rank's host name, gathered once over `world` (a collective of the world: every
  // rank calls it, at start-up, after the world communicator exists), so that messages
  // name the hosts of peers and groups. set_hosts: the same from a list by world rank.
  void learn_hosts(Communicator& world);
  void set_hosts(std::vector<std::string> hosts_by_world_rank);
  // The list learn_hosts/set_hosts gave, by world rank; empty before (the trainer names a
  // straggler's host with it).
  std::vector<std::string> hosts() const;

  // CallObserver, called by the communicators.
  std::uint64_t call_started(const Communicator& comm, const char* call, int peer,
                             const CollectiveOptions& opts) override;
  void call_ended(std::uint64_t token) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    HangReport report;  // filled on entry but for waited_s, step, hosts and message
    // The communicator of the call: alive while the entry is (call_ended erases it
    // before the call returns); asked for its members' world ranks only on a report.
    const Communicator* comm = nullptr;
    Clock::time_point started;
    Clock::time_point deadline;
    bool reported = false;
  };

  void run();
  // The message for an entry that missed its deadline at `now`.
  HangReport make_report(const Entry& entry, Clock::time_point now) const;

  WatchdogOptions options_;
  std::string host_;
  std::vector<std::string> hosts_;  // by world rank; guarded by mutex_
  std::atomic<std::int64_t> step_{-1};
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::uint64_t, Entry> calls_;  // by token; guarded by mutex_
  std::uint64_t next_token_ = 1;          // guarded by mutex_
  bool stopping_ = false;                 // guarded by mutex_
  std::thread thread_;
};

}  // namespace trident
