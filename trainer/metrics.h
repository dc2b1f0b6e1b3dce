// Progress output: rank 0's one line per step and the JSONL metrics file with exactly
// the fields of docs/ARCHITECTURE.md "Observability": {"step","loss","lr","grad_norm",
// "step_ms","tokens_per_s","mfu","comm_exposed_ms","comm_hidden_ms"} per training step
// (and "slowest", "comm_exposed_least_ms", "comm_total_least_ms", "comm_kind_least_ms"
// with more than one rank),
// {"step","val_loss"} per evaluation, and at the end of a run one
// {"summary": {"ranks": [...]}} record with every rank's memory, traffic and pipeline
// idle time. Each launch of `trident train` first writes one segment header,
// {"segment": {"run_id", "start_step", "resumed_from", "time", "world_size"}}: the file is
// appended to across resumes, so a step can appear in several segments (the steps after
// the last checkpoint of a crashed launch are trained again); a plot takes each step's
// record from the last segment that has it (scripts/plot_metrics.py). Each record goes to
// the file in one write(2) as it is produced, so a killed run keeps every line it printed.
// A write error (a full disk) does not stop training: the first one is logged as a
// warning naming the file and the error, and the end of the run says how many records
// were lost. A record cut off part-way is followed by a fresh line, and a launch that
// finds the file ending mid-line starts its segment on a new line, so every line of the
// file is one JSON object except, at worst, the torn one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace trident {

struct StepMetrics {
  int step = 0;  // 1-based: the number of optimizer steps done
  int max_steps = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // fraction of peak, 0..1
  // This rank's communication time in the step, per group (Communicator::times()):
  // exposed = the compute waited; hidden = asynchronous communication that ran behind
  // computation. Written as {"comm_exposed_ms": {"tp", "dp", "pp", "embedding"},
  // "comm_hidden_ms": {...}}.
  struct GroupMs {
    double tp = 0, dp = 0, pp = 0, embedding = 0;
    double cp = 0;  // the ring of ring attention (parallel.cp > 1; else 0)
    // Expert parallelism (parallel.ep > 1; else 0): the all-to-all, the experts' reduction.
    double ep = 0, expert_dp = 0;
    GroupMs& operator+=(const GroupMs& o) {
      tp += o.tp;
      dp += o.dp;
      pp += o.pp;
      embedding += o.embedding;
      cp += o.cp;
      ep += o.ep;
      expert_dp += o.expert_dp;
      return *this;
    }
    // The seven groups in the order above (Trainer::metric_groups' order), and back.
    static constexpr std::size_t kCount = 7;
    std::array<double, kCount> values() const { return {tp, dp, pp, embedding, cp, ep, expert_dp}; }
    static GroupMs of(const std::array<double, kCount>& v) {
      return {.tp = v[0], .dp = v[1], .pp = v[2], .embedding = v[3], .cp = v[4], .ep = v[5], .expert_dp = v[6]};
    }
  };
  // Communication time of one group split by collective kind (CommTimes::exposed_by_kind
  // + hidden_by_kind), for the three kinds whose bandwidths differ: written as
  // {"all_reduce", "reduce_scatter", "all_gather"}.
  struct KindMs {
    double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
    // The three kinds in the order above, and back.
    static constexpr std::size_t kCount = 3;
    std::array<double, kCount> values() const { return {all_reduce, reduce_scatter, all_gather}; }
    static KindMs of(const std::array<double, kCount>& v) {
      return {.all_reduce = v[0], .reduce_scatter = v[1], .all_gather = v[2]};
    }
  };
  GroupMs comm_exposed_ms, comm_hidden_ms;
  // Worlds of more than one rank with a metrics file (has_least): per group kind, the
  // least exposed time in the step of any rank in a group of that kind (of more than one
  // rank), and the least exposed + hidden time. The rank that reached a blocking
  // collective last waited for the transfer alone, the others also for its arrival:
  // these are the communication without that skew. Written as
  // {"comm_exposed_least_ms": {...}, "comm_total_least_ms": {...}} (0 for a kind whose
  // groups are all of one rank).
  bool has_least = false;
  GroupMs comm_exposed_least_ms, comm_total_least_ms;
  // With has_least, per group kind (GroupMs' order) and per collective kind, a group's
  // calls of that kind, each call's least exposed + hidden time over the group's ranks,
  // summed (the least over the groups of that kind): the communication of that kind
  // without the arrival skew of any call, since the last rank to arrive at a call waited
  // for its transfer alone (CommTimes::calls). At most comm_total_least_ms in sum. They let
  // a calibration fit each collective kind's bandwidth apart. Written as
  // {"comm_kind_least_ms": {"tp": {"all_reduce", "reduce_scatter", "all_gather"}, "dp":
  // {...}, ...}} (all seven groups).
  std::array<KindMs, GroupMs::kCount> comm_kind_least_ms{};
  // Mixture-of-experts models only (written when `moe` is set): the load-balancing and
  // z-losses summed over the layers (mean over micro-batches, before their coefficients;
  // `loss` stays the LM loss), and per layer the fraction of the step's assignments each
  // expert received. The file gets "moe_aux_loss", "moe_z_loss" and "moe_layers": per layer
  // {"min", "max", "cv"} (coefficient of variation) of the fractions, and with
  // moe_histogram (each logging.log_interval steps) also "fractions", the histogram.
  // Worlds of more than one rank (has_slowest): the rank with the largest busy time of the
  // step (step time minus time blocked in communication; trainer/straggler.h), its host,
  // its busy time and the median rank's. Written as {"slowest": {"rank", "host",
  // "busy_ms", "median_busy_ms", "ratio"}}.
  bool has_slowest = false;
  int slowest_rank = -1;
  std::string slowest_host;
  double slowest_busy_ms = 0, median_busy_ms = 0, slowest_ratio = 1;
  bool moe = false;
  bool moe_histogram = false;
  double moe_aux_loss = 0, moe_z_loss = 0;
  std::vector<std::vector<double>> moe_fractions;  // [layer][expert]
};

// {"tp", "dp", "pp", "embedding", "cp", "ep", "expert_dp"}: the metrics file's and the summary's form of GroupMs.
void to_json(nlohmann::ordered_json& j, const StepMetrics::GroupMs& g);
// {"all_reduce", "reduce_scatter", "all_gather"}: the metrics file's form of KindMs.
void to_json(nlohmann::ordered_json& j, const StepMetrics::KindMs& k);

// "step 12/300 | loss 2.4817 | norm 0.8123 | lr 1.00e-03 | 153.2 ms | 13371 tok/s | MFU 41.2%"
std::string format_progress_line(const StepMetrics& m);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Opens `path` for appending (creating parent directories); empty path = disabled.
  Status open(const std::string& path);
  void write_step(const StepMetrics& m);
  void write_eval(int step, double val_loss);
  // The segment header of this launch. resumed_from: the checkpoint directory, or empty
  // for a run started from scratch (written as null).
  void write_segment(const std::string& run_id, int start_step, const std::string& resumed_from,
                     int world_size);
  // One JSON object (already serialised), e.g. the end-of-run {"summary": ...} record.
  void write_summary(const std::string& json) { write_line(json); }

 private:
  void write_line(const std::string& line);
  int fd_ = -1;
  std::string path_;
  bool mid_line_ = false;  // the file's last byte is not '\n'
  int64_t records_ = 0, failed_ = 0;
};

}  // namespace trident
