// Calibration of the hardware table from a measured run (`trident plan --calibrate`;
// docs/PLAN.md "Calibration"): the efficiencies and link figures of a Hardware fitted so
// that the plan of the run's own layout predicts what its metrics file measured.
//
// The metrics file is the trainer's JSONL (trainer/metrics.h): the last segment header
// {"segment": {..., "world_size"}}, the step records after it {"step", "step_ms",
// "comm_exposed_ms": {"tp", "dp", "pp", "embedding", "cp"}, "comm_hidden_ms": {...}} (rank 0's
// communication), and, when the run ended, {"summary": {"ranks": [{"rank", "pp", "dp",
// "tp", ...}]}} with every rank's coordinates. The figures taken are medians over the
// segment's steps after its first (which includes start-up work: arenas, the prefetch
// learning its order).
//
// What one run identifies, and so what is fitted (the rest keeps the table's figures):
//   - each link the run's tp, dp and cp groups use: its effective bandwidth (a GPU link's
//     `efficiency`, the cpu's `link_gbytes_per_s`), from the group's measured
//     communication, exposed + hidden, against the plan's bytes over the link (the
//     latency term kept; a link whose latency explains 90% of the time keeps its
//     figure: small messages do not identify a bandwidth). pp is not fitted: its measured wait includes the pipeline's
//     idle time, not only the transfer.
//     Where every step record has comm_kind_least_ms (the least time of each collective
//     kind), the tp and dp groups give one measurement per kind instead of one in all:
//     each kind the run moved its bytes with (all-reduce, reduce-scatter, all-gather)
//     gets its own bandwidth, as the link's figure x the kind's share (LinkSpec::share).
//     The link's own figure, which sends and the kinds the run did not measure keep
//     using, is then the bandwidth of all the measured bytes together: MPI's
//     reduce-scatter on CPU ranks, several times slower than its all-gather, no longer
//     sets one figure for both.
//     With two or more runs (calibrate_runs) whose groups use a link with different
//     calls per byte (ZeRO-1's few large collectives next to tp's many small all-reduces,
//     say), the link's bandwidth and its per-call latency are both fitted, by least
//     squares over the groups' (bytes term, latency term) -> measured seconds: the plan's
//     own bytes and call counts, measured = bytes / bandwidth + calls x latency (with
//     per-kind measurements, one bandwidth per kind and one latency for all). Runs whose
//     calls per byte on the link are within kLatencySeparation of each other do not
//     separate the two: the link then gets the bandwidth-only fit over all of them.
//   - CPU ranks on shared cores (the ranks' compute threads and communication threads
//     outnumber the cores): with several runs, where some have overlap on (their plan
//     depends on the overlap rates) and a run with overlap off has a dp group, the runs
//     with overlap off fit the links and the compute alone, and the overlapped runs fit
//     the table's two overlap rates (Hardware::overlap_comm_rate, overlap_compute_rate):
//     the collective's rate beside compute whose planned dp waits (summed over the
//     overlapped runs) are the measured ones (their exposed dp time, the least of the
//     group's ranks where the file has it), and the compute's rate whose planned steps are
//     the measured ones; the collective's in [1e-3, 1], the compute's in [the threads'
//     share of the cores (cpu_thread_share_in_flight), 1]. An overlapped run's exposed + hidden time is
//     not its transfer's (its hidden part runs at the slower rate beside compute), so it
//     fits no link. Otherwise every run fits the links and the compute, as below.
//   - the ranks' arrival skew (Hardware::arrival_skew), where the files give each
//     collective's least time and the least totals (has_kinds, has_least): per run and per
//     group whose plan waits between compute (tp; dp with overlap off), the least total
//     less the sum of the collectives' least times, against the plan's skew at 1; the
//     ratio of the sums, fitted in turn with the compute factor (the step holds it).
//   - compute: one factor on gemm_efficiency, attention_efficiency and memory_efficiency
//     together (their ratios kept), so that the predicted step equals the measured one.
//     With several runs, the factor whose predicted steps match the measured ones in the
//     least-squares sense. One run's step time is one equation; GEMM and attention efficiencies separate only
//     with runs of different sequence lengths, which this does not take.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/status.h"
#include "plan/hardware.h"
#include "plan/plan.h"

namespace trident {

// Seconds per step, per group (the metrics' {"tp", "dp", "pp", "embedding", "cp"}; cp:
// the ring attention's exchanges; 0 when a file has no such key).
struct GroupSeconds {
  double tp = 0, dp = 0, pp = 0, embedding = 0, cp = 0;
};

struct MeasuredRun {
  std::string path;
  int world_size = 0;
  int steps = 0;           // step records in the last segment
  int steps_used = 0;      // after its first
  double step_s = 0;       // median
  GroupSeconds exposed, hidden;  // medians, rank 0
  // Medians of the least exposed and exposed + hidden time of each group's members
  // (the metrics' comm_exposed_least_ms, comm_total_least_ms: the communication without
  // the ranks' arrival skew), where every step record has them (has_least).
  bool has_least = false;
  GroupSeconds exposed_least, total_least;
  // Medians of the least time of each collective kind, indexed like LinkSpec::share, of
  // the tp group and of the dp group with the tied embedding's all-reduce (the metrics'
  // comm_kind_least_ms: tp, and dp + embedding), where every step record has it.
  bool has_kinds = false;
  std::array<double, kRingKinds> tp_kinds{}, dp_kinds{};
};

// Reads `path`. Errors (invalid_input, naming the file): it cannot be read; no segment
// header; no step records after the last one; the header's world_size is not
// `expected_world`, or the summary's rank coordinates are not the config's dp x tp x pp
// (`layout` names the keys).
Result<MeasuredRun> read_metrics(const std::string& path, int expected_world,
                                 const ParallelConfig& layout);

struct Calibration {
  Hardware hardware;            // fitted
  double compute_factor = 1;    // on the three compute efficiencies
  double tp_link_factor = 1, dp_link_factor = 1, cp_link_factor = 1;  // on the links' bandwidth
  // On the links' per-call latency (1: kept; intra, inter: the cpu's one link is intra).
  double intra_latency_factor = 1, inter_latency_factor = 1;
  // On each kind's share of its link (LinkSpec::share; 1: the kind was not measured apart).
  std::array<double, kRingKinds> intra_kind_factor = {1, 1, 1}, inter_kind_factor = {1, 1, 1};
  PlanResult before, after;     // the (first) run's layout with the input and the fitted table
  std::vector<PlanResult> runs_before, runs_after;  // every run's (calibrate_runs)
  std::string notes;            // what was fitted from what, one line each
};

// Runs whose calls per byte on a link differ by less than this factor fit its bandwidth
// alone (the latency kept): nearly collinear, their least-squares latency is noise.
inline constexpr double kLatencySeparation = 1.5;

// One run of a calibration from several: the config it trained with and its metrics.
struct CalibrationRun {
  Config config;
  MeasuredRun run;
};

// Fits options.hardware to `run`, the measurement of `config`'s layout on
// options.devices. Errors when the measured step is shorter than what the plan's
// communication alone takes with the fitted links (nothing left for compute).
Result<Calibration> calibrate(const Config& config, const PlanOptions& options,
                              const MeasuredRun& run);

// Fits options.hardware to several runs on options.devices (each run's layout is its own
// config's). One run: calibrate()'s result, bit for bit (runs_before/after hold it). More:
// per link both figures where the runs separate them, else the pooled bandwidth (above);
// the compute factor by least squares over the runs' steps. Errors (naming the files):
// none given; a link fit giving a non-positive bandwidth or latency; a run whose measured
// step is shorter than its plan's communication alone, or longer than it at 1e-4 of the
// compute efficiencies.
Result<Calibration> calibrate_runs(const std::vector<CalibrationRun>& runs, const PlanOptions& options);

}  // namespace trident
