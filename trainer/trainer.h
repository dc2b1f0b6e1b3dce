// The training loop of one rank: its part of the model (pipeline stage, tensor-parallel
// slice), the data-parallel / ZeRO engine, the pipeline schedule, the data, the LR
// schedule, evaluation, metrics and instrumentation.
//
// One optimizer step = grad_accum_steps() micro-batches per data-parallel rank, run
// through the pipeline schedule; the loss reported is the mean over every micro-batch
// of every dp rank. Every rank of the world calls run()/train_step()/evaluate() in
// step (they are collective over the world communicator).
//
// Determinism: initial weights and the data order do not depend on the layout, so every
// dp x tp x pp layout follows the single-process trajectory within fp32 rounding; on
// CPU the same layout run twice is bitwise identical.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/dir_lock.h"
#include "checkpoint/train_state.h"
#include "checkpoint/writer.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "config/config.h"
#include "core/status.h"
#include "data/loader.h"
#include "data/token_meta.h"
#include "kernels/ops.h"
#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline.h"
#include "plan/traffic_model.h"
#include "trainer/checkpointing.h"
#include "trainer/loss_guard.h"
#include "trainer/metrics.h"
#include "trainer/resume_compat.h"
#include "trainer/straggler.h"

namespace trident {

class Watchdog;

struct TrainerOptions {
  Communicator* world = nullptr;  // null: a single process (own SelfCommunicator)
  // auto (continue the run `latest` names), none (a new run; refused when checkpoint.dir
  // holds checkpoints), or a checkpoint directory (checkpoint/lineage.h has the rules).
  std::string resume = "auto";
  Watchdog* watchdog = nullptr;   // told the step, when given
  int hang_rank = -1, hang_step = -1;  // fault injection (TRIDENT_FAULT_HANG)
  // Test hook: called by the checkpoint writer after each chunk it writes.
  std::function<Status(int64_t written, int64_t total)> checkpoint_chunk_hook;
  int64_t checkpoint_chunk_bytes = 0;  // > 0: the writer's chunk size (test hooks)
  double peak_flops = 0;          // per device, for MFU; 0 = Ops::peak_flops() (CPU: sgemm rate)
  bool quiet = false;             // no progress lines (benchmarks, tests)
  int threads = 0;                // CPU threads per rank; > 0 overrides runtime.threads
  // Test hooks (tests/trainer/teardown_test.cpp). make_ops: the compute backend instead of
  // make_ops(runtime.device). make_group_world: the communicator the device groups are
  // split from, given the world and the Ops, instead of the default (see Trainer::init:
  // NCCL for a CUDA world of more than one rank, else SelfCommunicators moving device
  // data through Ops::copy for a world of one, else the world itself).
  std::function<Result<std::unique_ptr<Ops>>()> make_ops;
  std::function<Result<std::unique_ptr<Communicator>>(Communicator& world, Ops& ops)>
      make_group_world;
};

// Bytes moved, memory held and pipeline idle time on one rank (docs/ARCHITECTURE.md
// "Observability").
struct RankStats {
  RankTraffic traffic;   // measured by the communicators, last step
  RankTraffic analytic;  // plan/traffic_model.h for this rank
  // params: compute weights; master: fp32 masters (bf16 precision only).
  double param_bytes = 0, master_bytes = 0, grad_bytes = 0, optimizer_bytes = 0,
         activation_bytes = 0;
  double pipeline_idle_ms = 0, pipeline_total_ms = 0;
  int peak_live_micro_batches = 0;
  // Communication time per group (Communicator::times()): the last step's, and the sum
  // over this launch's steps.
  StepMetrics::GroupMs comm_exposed_ms, comm_hidden_ms;
  StepMetrics::GroupMs total_comm_exposed_ms, total_comm_hidden_ms;
  // The last step's exposed + hidden time per group (GroupMs' order) and collective kind
  // (CommTimes' by-kind split), this rank's own.
  std::array<StepMetrics::KindMs, StepMetrics::GroupMs::kCount> comm_kind_ms{};
  // The last step's all-reduce, reduce-scatter and all-gather calls per group, each with
  // this rank's seconds in it (CommTimes::calls): comm_kind_least_ms sums, per kind, the
  // least of each call over the group's ranks.
  std::array<std::vector<CommTimes::Call>, StepMetrics::GroupMs::kCount> comm_calls{};
  // The last step's asynchronous collectives' own running time (CommTimes::async_s):
  // > 0 whenever one ran. (How much of it was hidden depends on the machine's timing.)
  StepMetrics::GroupMs comm_async_ms;
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(Config config, TrainerOptions options = {});
  ~Trainer();

  // Runs the remaining steps up to training.max_steps.
  Status run();
  // One optimizer step; returns its metrics (loss and norm are global).
  Result<StepMetrics> train_step();
  // Mean loss over training.eval_batches micro-batches of the validation data.
  Result<double> evaluate();
  // Saves a checkpoint of the current step (collective). async: snapshot now, write in
  // the background, commit at a later step boundary (poll/wait).
  Status save_checkpoint(bool async);
  // True when run() stopped early on SIGTERM/SIGINT/SIGHUP/SIGUSR1 after saving (exit code 3).
  bool stopped_by_signal() const { return stopped_by_signal_; }
  // The checkpoint writer (tests: whether a save is in flight, its timings).
  CheckpointWriter& checkpoint_writer() { return *writer_; }
  // Every global parameter, assembled on world rank 0 (empty map on other ranks).
  // Collective over the world.
  std::map<std::string, std::vector<float>> gather_parameters();

  const Config& config() const { return config_; }
  int step() const { return step_; }
  // The run's identity (checkpoint/train_state.h): new for a fresh run, inherited on resume.
  const std::string& run_id() const { return run_id_; }
  uint64_t consumed_samples() const { return consumed_samples_; }
  const std::vector<double>& losses() const { return losses_; }
  // This rank's instrumentation for the last step (traffic) and now (memory).
  const RankStats& last_step_stats() const { return stats_; }
  const RankCoords& coords() const { return groups_.coords; }
  // This rank's communicators (dp, tp, pp, embedding; tests: their backends).
  const ProcessGroups& groups() const { return groups_; }
  // This rank's first model chunk (the only one unless parallel.virtual_stages > 1) and
  // its model; chunks() has them all, in layer order (plan/partition.h).
  const ModelPartition& partition() const { return chunks_.front(); }
  const std::vector<ModelPartition>& chunks() const { return chunks_; }
  Transformer& model(int chunk = 0) { return *models_[static_cast<size_t>(chunk)]; }
  // This rank's compute backend (tests: Ops::transfer_counts, the host-sync budget).
  Ops& ops() { return *ops_; }
  DataParallel& data_parallel() { return *dp_; }
  // What the data-parallel engines allocate together (under expert parallelism the dense
  // one's and the experts' one's; DataParallel::Memory).
  DataParallel::Memory data_parallel_memory() const;

 private:
  class StageRunner;
  struct InitWeights;
  Trainer(Config config, TrainerOptions options);
  // The steps below, in the order they run.
  Status init();
  // world_: the given world, or a SelfCommunicator of one.
  void attach_world();
  // Rank 0 locks checkpoint.dir and removes crash leftovers; every rank gets its status.
  Status claim_checkpoint_dir();
  // model.init_from's tensors into *init, its architecture into config_.model.
  Status read_init_from(InitWeights* init);
  // ops_: the compute backend of runtime.device.
  Status make_backend();
  // group_world_, groups_ (dp, tp, pp, embedding) and chunks_ (this rank's layers).
  Status make_groups();
  // train_data_, val_data_ and, on rank 0, data_fingerprint_.
  Status open_data();
  // Every token id of the data below model.vocab_size, checked by rank 0 for all ranks.
  Status check_token_ids();
  // layout_, dp_ (the ZeRO engine), models_ (one per chunk), executor_ and its stages.
  void build_model();
  // The parameters: init_from's values or Transformer::initial_value; gradients zeroed.
  Status load_initial_weights(const InitWeights& init);
  // run_id_ and, from the checkpoint --resume chooses, its state, step and data position.
  Status resume();
  // writer_, pruning this run's checkpoints and sparing the one resumed from.
  void make_checkpoint_writer();
  // The metrics file and its segment header (rank 0); the token buffers.
  Status open_metrics();
  // peak_flops_: the MFU denominator, agreed by every rank.
  void find_peak_flops();
  // Rank 0's decision, sent to every rank: the text, or the error it encodes
  // ("!<code>:<message>"), so that every rank fails alike.
  Result<std::string> agree(const std::string& decision);
  // The state saved with the next checkpoint; a new checkpoint uid each call.
  nlohmann::json trainer_state();
  // The loss-spike guard at a step boundary (trainer/loss_guard.h); see run().
  Status check_loss_spike(double loss, double grad_norm);
  void print_banner() const;
  void print_summary();
  double all_reduce_scalar(double local, const char* label);
  // Context parallelism: points *tokens and *targets at this cp rank's rows of inputs_
  // and targets_ (a micro-batch just loaded); at cp 1 leaves them as they are.
  void take_cp_rows(const int32_t** tokens, const int32_t** targets);
  void reset_traffic();
  void collect_traffic();

  // Members are destroyed in reverse order of declaration. The Ops (and on CUDA its
  // stream and device memory) are declared before every member that may use them: the
  // communicators, whose device work is ordered on the Ops' stream, the model and
  // data-parallel buffers, the executor and the checkpoint writer, so they all go first
  // and the Ops last (tests/trainer/teardown_test.cpp checks this order).
  Config config_;
  TrainerOptions options_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Communicator> own_world_;
  Communicator* world_ = nullptr;
  // The world the model's device groups are split from (host space): on CUDA with more
  // than one rank the NCCL world (over a host duplicate of world_); for a world of one a
  // SelfCommunicator whose device copies go through ops_ (no NCCL); null on the CPU with
  // more than one rank (the groups split from world_). Destroyed after the groups.
  std::unique_ptr<Communicator> group_world_;
  ProcessGroups groups_;
  // Host twins of groups_ (make_process_groups with MemSpace::kHost), for the per-call
  // least waits of the metrics (collect_least_waits); made only in a world of more than
  // one rank with a metrics file (else its groups are null).
  ProcessGroups host_groups_;
  std::vector<ModelPartition> chunks_;  // this rank's model chunks, in layer order
  ParamLayout layout_;
  std::unique_ptr<DataParallel> dp_;
  // Expert parallelism (parallel.ep > 1; parallel/expert_parallel.h): dp_ runs over
  // dense_layout_ (groups 0 .. L + 1), edp_ over expert_layout_ (the routed experts'
  // groups) on the expert-data-parallel group; the models read both through split_store_.
  // Null at ep 1, where dp_ runs over layout_.
  ParamLayout dense_layout_, expert_layout_;
  std::unique_ptr<DataParallel> edp_;
  std::unique_ptr<SplitParamStore> split_store_;
  // The engine of parameter i (an index of layout_), and every engine in turn.
  DataParallel& dp_of(size_t i) {
    return edp_ && layout_.params[i].group >= config_.model.n_layers + 2 ? *edp_ : *dp_;
  }
  template <class F>
  void for_each_dp(F&& f) {
    f(*dp_);
    if (edp_) f(*edp_);
  }
  ExpertEngine expert_engine() const {
    return {edp_.get(), config_.model.n_layers + 2, groups_.expert_dp_rank};
  }
  std::vector<std::unique_ptr<Transformer>> models_;  // one per chunk
  // The model of the last chunk, and whether it computes the loss (the model's last stage).
  Transformer& last_model() { return *models_.back(); }
  // Mixture of experts: the step's auxiliary losses and expert loads, over every rank.
  void collect_moe_metrics(StepMetrics& m);
  // The step's slowest rank (every rank's busy time gathered to all) into m.
  void collect_slowest_rank(StepMetrics& m);
  // Per group kind, the least exposed and exposed + hidden time of any member, in all and
  // per collective kind, into m.
  void collect_least_waits(StepMetrics& m);
  // Whether each step's metrics carry the least waits (collect_least_waits): a world of
  // more than one rank with a metrics file; host_groups_ exist exactly then.
  bool records_least_waits() const { return world_->size() > 1 && !config_.logging.metrics.empty(); }
  // The communicators whose times StepMetrics::GroupMs holds, in its order (null: none).
  std::array<Communicator*, 7> metric_groups() const { return metric_groups(groups_); }
  static std::array<Communicator*, 7> metric_groups(const ProcessGroups& groups);
  // same_host_ from hosts_ and the groups' members, and the straggler detector's hosts
  // (run(), once).
  void find_same_host_groups();
  bool computes_loss() const { return chunks_.back().last_stage(); }
  std::unique_ptr<PipelineExecutor> executor_;
  // One adapter per chunk for the executor (built once: a step allocates nothing here).
  std::vector<std::unique_ptr<StageRunner>> runners_;
  std::vector<PipelineStageModel*> stages_;
  std::unique_ptr<CheckpointWriter> writer_;
  DirLock dir_lock_;                    // rank 0: checkpoint.dir is ours while we live
  std::string run_id_;                  // the run's lineage id
  std::vector<std::string> ancestors_;  // uids the next checkpoint descends from, newest first
  std::string resumed_from_;            // the checkpoint this launch continued ("" = fresh)
  bool stopped_by_signal_ = false;
  std::optional<DataLoader> train_data_;
  std::optional<DataLoader> val_data_;
  MetricsWriter metrics_;
  std::vector<int32_t> inputs_;   // [micro_batch_size * seq_len]
  std::vector<int32_t> targets_;  // [micro_batch_size * seq_len]
  // Context parallelism: this rank's rows of inputs_ and targets_ (take_cp_rows).
  std::vector<int32_t> cp_inputs_, cp_targets_;
  std::vector<double> losses_;
  LossSpikeGuard loss_guard_;  // fed by run() after every step; its window is checkpointed
  // Stragglers (worlds of more than one rank): every rank's busy time of the last step
  // (train_step gathers it), the detector rank 0 feeds in run(), hostnames by world rank.
  std::vector<double> step_busy_ms_;
  std::vector<double> step_own_ms_;  // busy less the waits inside the host (straggler.h)
  StragglerDetector stragglers_;
  std::vector<std::string> hosts_;
  // tp, dp (dp x cp), pp, embedding, cp: the group lies inside this rank's host, in a
  // world of several hosts (its waits are the host's own time, not waiting for a slower
  // one).
  std::array<bool, 7> same_host_{};
  RankStats stats_;
  int step_ = 0;
  uint64_t consumed_samples_ = 0;
  uint64_t num_train_samples_ = 0;
  double peak_flops_ = 0;
  // The training data's fingerprint (trainer/resume_compat.h), on rank 0 only; stored in
  // checkpoints as trainer state "data" and compared on resume.
  std::optional<DataFingerprint> data_fingerprint_;
  // The tokenizer the training data's sidecars record (data/token_meta.h), on rank 0 only
  // and only when every dataset of data.train records the same one; stored in checkpoints
  // as trainer state "tokenizer", which `trident generate` decodes with.
  std::optional<TokenizerRecord> data_tokenizer_;
};

}  // namespace trident
