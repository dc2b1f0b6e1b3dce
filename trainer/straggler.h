// Stragglers: which rank held a step back, and a warning when one keeps doing so
// (docs/SLURM.md "Stragglers", logging.straggler_* in docs/CONFIG.md).
//
// Every rank's step takes the same wall time in synchronous training (the fast ones wait
// for the slow one inside their collectives), so the measure is each rank's busy time:
// the step's wall time minus the time its training thread was blocked in communicator
// calls (CommTimes::exposed_s of its tp, dp (dp x cp under context parallelism), pp,
// embedding and cp groups and of the world, all reset at the start of the step). A rank that computes slowly (a throttled CPU, a noisy
// neighbour) has the largest busy time; its peers' waits for it are their exposed
// communication. In a world of several hosts the unit that straggles is a host: waits in
// a group whose members all share this rank's host (tp inside a node) count as busy, since
// a slow node's ranks wait for each other there (cluster.sh slow showed it: with a node's
// CPU throttled, most of its slowdown landed in its own tp all-reduces). This holds where
// communication blocks the host (the MPI groups of CPU runs; the world's flags and scalars
// everywhere). NCCL groups are stream-ordered: their calls return at once and a fast rank
// waits for a slow peer in its next device-to-host read, which counts as busy, so on CUDA
// worlds the busy times say less (docs/SLURM.md "Stragglers").
//
// A wait inside one host counts as busy, so a rank of a healthy node that waited there for
// its host peer, which itself waited on a slow node, looks busy too (a nodes_e2e straggler
// run once named the first stage's second tp rank that way: it got its activation first
// and waited in the tp all-reduce for its peer, still receiving from the slowed stage).
// So in a world of several hosts a rank's step counts as slow only when its own time (the
// step minus all its waits, those inside its host included) exceeds the factor, or when
// every rank of its host is over it (the host is the slow unit: its ranks wait for each
// other). Of one host, or with no hosts known, every rank is its own unit and the two
// figures are the same.
//
// "The median" is the median rank's busy time: of n values in ascending order the one at
// floor((n - 1) / 2), one rank's own figure (of two ranks, the faster one's).
// slowest_rank() finds, for one step, the rank with the largest busy time and its ratio to
// the median (the metrics file's "slowest" record). StragglerDetector looks at consecutive
// windows of `window` steps: a rank slow (as above) in at least half of a window's steps
// (ceil(window / 2)) is a straggler of that window; at the window's end push() returns
// them, most often slow first, and the trainer warns once, naming each with its host.
// Half, not every step: a throttled node still has quick steps when the throttle's period
// lines up, and a window with only a few slow steps (a checkpoint write, a page-cache
// miss) is noise, not a straggler. Every rank over the factor counts, not only the
// slowest: the tp ranks of one slow node take turns at being the slowest. Not
// thread-safe; rank 0 keeps one. The window is not checkpointed: a resumed launch starts
// a new one.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace trident {

struct SlowestRank {
  int rank = -1;           // the largest busy time (the lowest rank among equals)
  double busy_ms = 0;      // its busy time
  double median_ms = 0;    // the median rank's busy time
  double ratio = 1;        // busy_ms / median_ms; 1 when the median is 0
};
// busy_ms: one per rank, in rank order; empty gives rank -1.
SlowestRank slowest_rank(std::span<const double> busy_ms);

struct Straggler {
  int rank = 0;
  int slow_steps = 0;        // steps of the window in which it exceeded factor x the median
  double slow_ratio = 0;     // the median of its busy / median ratios in those steps
};

class StragglerDetector {
 public:
  // factor <= 0: off (push never reports). window >= 1.
  StragglerDetector(double factor, int window);
  bool enabled() const { return factor_ > 0; }
  int window() const { return window_; }
  double factor() const { return factor_; }
  // Each rank's host as an index below the rank count (ranks sharing one share it, e.g.
  // the first rank on that host); empty (the default): every rank its own host.
  void set_hosts(std::vector<int> host_of_rank) { host_of_ = std::move(host_of_rank); }
  // One step's busy times and own times (the busy time less the waits inside the rank's
  // host; empty: the busy times), one per rank, the same count every step. At the end of
  // each window: the window's stragglers (possibly none); otherwise nullopt.
  std::optional<std::vector<Straggler>> push(std::span<const double> busy_ms,
                                             std::span<const double> own_ms = {});

 private:
  double factor_;
  int window_;
  int steps_ = 0;                             // in the current window
  std::vector<int> host_of_;                  // set_hosts(); empty: one rank per host
  std::vector<double> host_min_;              // push()'s scratch: each host's least busy time
  std::vector<std::vector<double>> slow_;     // per rank, its ratios in this window's slow steps
};

// "rank 4 on node3 exceeded 2x the median rank's busy time in 18 of the last 20 steps
// (by 3.1x in the median of those)", one clause per straggler joined by "; ". hosts: by rank (empty or a
// missing entry: no "on HOST").
std::string straggler_text(const std::vector<Straggler>& stragglers,
                           const std::vector<std::string>& hosts, double factor, int window);

}  // namespace trident
