#include "trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "checkpoint/lineage.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "comm/nccl_world.h"
#include "comm/versions.h"
#include "comm/watchdog.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/sampler.h"
#include "data/token_check.h"
#include "kernels/backend.h"
#include "model/hf_export.h"
#include "model/llmc_checkpoint.h"
#include "plan/memory_plan.h"
#include "plan/partition.h"
#include "trainer/checkpointing.h"
#include "trainer/lr_schedule.h"
#include "trainer/signals.h"

#include <nlohmann/json.hpp>

namespace trident {

namespace {

// Rank 0's text, sent to every rank (over the host-space world).
std::string broadcast_string(Communicator& world, std::string text) {
  std::int64_t size = world.rank() == 0 ? static_cast<std::int64_t>(text.size()) : 0;
  world.all_reduce(CommBuf::host(std::span<std::int64_t>(&size, 1)), ReduceOp::kSum);
  text.resize(static_cast<size_t>(size));
  world.broadcast(CommBuf::host(std::as_writable_bytes(std::span<char>(text.data(), text.size()))),
                  0);
  return text;
}

std::string encode_error(const Status& st) {
  std::string text(1, '!');  // (not "!" + ...: GCC 12 warns falsely on that, -Wrestrict)
  text += std::to_string(static_cast<int>(st.code()));
  text += ':';
  text += st.message();
  return text;
}


}  // namespace

// Adapts the model's stage interface to the pipeline executor, loading each
// micro-batch's tokens (first stage) and targets (last stage) from the data.
class Trainer::StageRunner : public PipelineStageModel {
 public:
  // The runner of model chunk `chunk` of this rank.
  StageRunner(Trainer& t, int chunk)
      : t_(t), model_(*t.models_[static_cast<size_t>(chunk)]),
        part_(t.chunks_[static_cast<size_t>(chunk)]) {}
  size_t boundary_floats() const override { return model_.boundary_floats(); }
  DevPtr input_activation(int slot) override { return model_.input_activation(slot); }
  DevPtr output_activation(int slot) override { return model_.output_activation(slot); }
  DevPtr output_grad(int) override { return model_.output_grad(); }
  DevPtr input_grad(int) override { return model_.input_grad(); }

  void forward(int micro, int slot) override {
    const auto& c = t_.config_;
    const int mb = c.parallel.micro_batch_size, T = c.model.seq_len;
    const bool first = part_.first_stage(), last = part_.last_stage();
    const int32_t* tokens = t_.inputs_.data();
    const int32_t* targets = t_.targets_.data();
    if (first || last) {
      // The step's global batch starts at consumed_samples_ in the global sample order
      // (which carries over a resume even when the global batch size changes); within
      // it, dp rank r takes its slice and splits it into micro-batches (data/sampler.h).
      const uint64_t first =
          t_.consumed_samples_ + micro_batch_range(0, c.training.global_batch_size, c.parallel.dp,
                                                   t_.groups_.coords.dp_rank, mb, micro)
                                     .first;
      Status st = t_.train_data_->load(first, mb, T, t_.inputs_.data(), t_.targets_.data());
      if (!st.is_ok()) {
        // Keep the collective pattern intact (other ranks are waiting on this one); the
        // step reports the error on every rank afterwards.
        if (status_.is_ok()) status_ = st;
        std::fill(t_.inputs_.begin(), t_.inputs_.end(), 0);
        std::fill(t_.targets_.begin(), t_.targets_.end(), 0);
      }
      t_.take_cp_rows(&tokens, &targets);
    }
    // The last stage adds the micro-batch's loss to the model's device accumulator;
    // train_step reads it back once.
    model_.forward_stage(slot, first ? tokens : nullptr, last ? targets : nullptr, mb,
                         T / c.parallel.cp);
  }

  void backward(int, int slot) override {
    model_.backward_stage(slot, 1.0f / static_cast<float>(t_.config_.grad_accum_steps()));
  }

  const Status& status() const { return status_; }
  void reset_status() { status_ = Status::ok(); }

 private:
  Trainer& t_;
  Transformer& model_;
  const ModelPartition& part_;
  Status status_;
};

Trainer::Trainer(Config config, TrainerOptions options)
    : config_(std::move(config)),
      options_(options),
      loss_guard_(config_.training.loss_spike_factor, config_.training.loss_spike_window,
                  config_.model.vocab_size),
      stragglers_(config_.logging.straggler_factor, config_.logging.straggler_window) {}

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(Config config, TrainerOptions options) {
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(config), options));
  TRIDENT_RETURN_IF_ERROR(trainer->init());
  return trainer;
}

// model.init_from's tensors: read (and its architecture applied) before anything is sized,
// loaded into the parameters once the model is built.
struct Trainer::InitWeights {
  std::optional<LlmcCheckpoint> llmc;
  std::optional<HfModel> hf;
};

Status Trainer::init() {
  attach_world();
  TRIDENT_RETURN_IF_ERROR(claim_checkpoint_dir());
  InitWeights init_weights;
  TRIDENT_RETURN_IF_ERROR(read_init_from(&init_weights));
  TRIDENT_RETURN_IF_ERROR(make_backend());
  TRIDENT_RETURN_IF_ERROR(make_groups());
  // Before the data is opened or anything big allocated: refuse a run whose ranks would
  // not fit in their machine's memory (exit 2 naming the figures), rather than abort in
  // an allocation or be OOM-killed later (plan/memory_plan.h).
  TRIDENT_RETURN_IF_ERROR(plan_and_check_memory(config_, chunks_.front(),
                                                groups_.topology.dp_cp_rank(groups_.coords), *ops_,
                                                *world_, options_.quiet));
  TRIDENT_RETURN_IF_ERROR(open_data());
  TRIDENT_RETURN_IF_ERROR(check_token_ids());
  build_model();
  TRIDENT_RETURN_IF_ERROR(load_initial_weights(init_weights));
  TRIDENT_RETURN_IF_ERROR(resume());
  make_checkpoint_writer();
  TRIDENT_RETURN_IF_ERROR(open_metrics());
  find_peak_flops();
  if (!options_.quiet && world_->rank() == 0) print_banner();
  return Status::ok();
}

void Trainer::attach_world() {
  if (options_.world) {
    world_ = options_.world;
  } else {
    own_world_ = std::make_unique<SelfCommunicator>();
    world_ = own_world_.get();
  }
}

Status Trainer::read_init_from(InitWeights* init) {
  // model.init_from: a directory is a Hugging Face model (model/hf_export.h), a file an
  // llm.c GPT-2 checkpoint (model/llmc_checkpoint.h).
  if (config_.model.init_from.empty()) return Status::ok();
  if (is_hf_model_dir(config_.model.init_from)) {
    TRIDENT_ASSIGN_OR_RETURN(init->hf, read_hf_model(config_.model.init_from));
    TRIDENT_RETURN_IF_ERROR(apply_hf_architecture(*init->hf, &config_.model));
  } else {
    TRIDENT_ASSIGN_OR_RETURN(init->llmc, read_llmc_checkpoint(config_.model.init_from));
    TRIDENT_RETURN_IF_ERROR(apply_llmc_architecture(*init->llmc, &config_.model));
  }
  config_.model.finalize();
  return validate_config(config_);
}

Status Trainer::make_backend() {
  // The backend first: it sizes the attention state the memory plan counts, and on CUDA
  // its stream orders the device groups. The ranks of this world share the machine's
  // cores (make_ops divides them).
  const int threads = options_.threads > 0 ? options_.threads : config_.runtime.threads;
  Result<std::unique_ptr<Ops>> ops =
      options_.make_ops ? options_.make_ops()
                        : make_ops(config_.runtime.device, threads, world_->size());
  if (!ops.is_ok()) return ops.status();
  ops_ = std::move(ops).value();
  return Status::ok();
}

Status Trainer::make_groups() {
  if (options_.make_group_world) {
    TRIDENT_ASSIGN_OR_RETURN(group_world_, options_.make_group_world(*world_, *ops_));
  } else if (world_->size() == 1) {
    // A world of one: every group has one rank, so no NCCL (nothing to initialise, nothing
    // that can fail): reductions are no-ops and the reduce-scatter / all-gather copies go
    // through Ops::copy, device to device and ordered on the Ops' stream.
    Ops& backend = *ops_;
    group_world_ = std::make_unique<SelfCommunicator>(
        "world", MemSpace::kHost, [&backend](void* dst, const void* src, std::size_t bytes) {
          backend.copy(DevPtr::wrap(dst, DType::kU8),
                       DevPtr::wrap(const_cast<void*>(src), DType::kU8), bytes);
        });
  } else if (ops_->native_stream() != nullptr && build_has_nccl()) {
    // CUDA with more than one rank: the model's groups (dp, tp, pp, embedding) are NCCL
    // groups on device memory, stream-ordered on the Ops' stream (comm/nccl_world.h;
    // groups of one among them are SelfCommunicators); the world itself stays the host
    // (MPI) world for flags, losses and agreement. The NCCL world owns its host side, so
    // it gets a duplicate of the world. (Compiled, not yet run on a GPU.)
    std::unique_ptr<Communicator> host =
        world_->split(0, world_->rank(), "world", MemSpace::kHost, {.label = "NCCL host world"});
    NcclWorldConfig nccl;
    nccl.compute_stream = ops_->native_stream();
    TRIDENT_ASSIGN_OR_RETURN(group_world_, make_nccl_world(std::move(host), nccl));
  }
  if (group_world_) group_world_->set_default_timeout(world_->default_timeout());
  Communicator* group_world = group_world_ ? group_world_.get() : world_;
  TRIDENT_ASSIGN_OR_RETURN(
      groups_, make_process_groups(*group_world, config_.parallel, config_.model.tied()));
  if (records_least_waits()) {
    // Split from the host world (an MPI world under NCCL groups too).
    TRIDENT_ASSIGN_OR_RETURN(host_groups_, make_process_groups(*world_, config_.parallel, config_.model.tied(),
                                                               MemSpace::kHost));
    // Each step's calls, for their least (reset_traffic clears them every step).
    for (Communicator* c : metric_groups()) {
      if (c != nullptr) c->record_calls(true);
    }
  }
  chunks_ = rank_chunks(config_, groups_.coords.tp_rank, groups_.coords.pp_rank,
                        groups_.ep_rank);
  for (ModelPartition& chunk : chunks_) {  // context parallelism: this rank's sequence chunks
    chunk.cp_rank = groups_.coords.cp_rank;
    chunk.cp_size = config_.parallel.cp;
  }
  return Status::ok();
}

void Trainer::take_cp_rows(const int32_t** tokens, const int32_t** targets) {
  const int cp = config_.parallel.cp;
  if (cp == 1) return;
  // Each cp rank's rows of the micro-batch's sequences (parallel/context_parallel.h):
  // the data order, and so the global batch, is that of cp 1.
  const int mb = config_.parallel.micro_batch_size, T = config_.model.seq_len;
  const CpChunks chunks = cp_chunks(T, cp, groups_.coords.cp_rank);
  cp_inputs_.resize(inputs_.size() / cp);
  cp_targets_.resize(targets_.size() / cp);
  trident::take_cp_rows(inputs_.data(), cp_inputs_.data(), mb, T, 1, chunks);
  trident::take_cp_rows(targets_.data(), cp_targets_.data(), mb, T, 1, chunks);
  *tokens = cp_inputs_.data();
  *targets = cp_targets_.data();
}

Status Trainer::open_data() {
  const auto& mc = config_.model;
  TRIDENT_ASSIGN_OR_RETURN(
      DataLoader train,
      config_.data.train_blend.empty()
          ? DataLoader::open(config_.data.train, mc.vocab_size, config_.data.seed,
                             config_.data.shuffle)
          : DataLoader::open_blend(config_.data.train_blend, mc.vocab_size, config_.data.seed,
                                   config_.data.shuffle));
  TRIDENT_ASSIGN_OR_RETURN(num_train_samples_, train.num_samples(mc.seq_len));
  train_data_.emplace(std::move(train));
  if (world_->rank() == 0) {
    // ---- resume compatibility (trainer/resume_compat.h): fingerprint the data ----
    auto fp = fingerprint_datasets(train_data_->datasets(), train_data_->blend(), config_.data);
    if (fp.is_ok()) {
      data_fingerprint_ = std::move(fp).value();
    } else {
      log::warn("data.train: cannot fingerprint the training data ({}); checkpoints will not "
                "record it", fp.status().message());
    }
  }
  if (!config_.data.val.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(DataLoader val, DataLoader::open(config_.data.val, mc.vocab_size,
                                                              config_.data.seed, false));
    TRIDENT_RETURN_IF_ERROR(val.num_samples(mc.seq_len).status());
    val_data_.emplace(std::move(val));
  }
  return Status::ok();
}

Status Trainer::check_token_ids() {
  // Out-of-vocabulary ids fail now, not when a batch first reads one hours in. The
  // ranks read the same files: rank 0 checks (data/token_check.h), all exit together.
  const int vocab_size = config_.model.vocab_size;
  std::string verdict;  // rank 0's error; empty: every id fits
  if (world_->rank() == 0) {
    Status st = Status::ok();
    const auto& train_sets = train_data_->datasets();
    for (size_t i = 0; i < train_sets.size() && st.is_ok(); ++i) {
      const std::string key =
          train_data_->blend() ? "data.train[" + std::to_string(i) + "]" : "data.train";
      std::optional<TokenizerRecord> tokenizer;
      st = check_token_ids_at_startup(key, train_sets[i], vocab_size, &tokenizer);
      // A blend whose datasets name different (or no) tokenizers records none.
      if (i == 0) {
        data_tokenizer_ = tokenizer;
      } else if (!tokenizer || !data_tokenizer_ || tokenizer->sha256 != data_tokenizer_->sha256 ||
                 tokenizer->vocab_size != data_tokenizer_->vocab_size) {
        data_tokenizer_.reset();
      }
    }
    if (st.is_ok() && val_data_) {
      st = check_token_ids_at_startup("data.val", val_data_->dataset(), vocab_size);
    }
    if (!st.is_ok()) verdict = encode_error(st);
  }
  return agree(verdict).status();
}

void Trainer::build_model() {
  const auto& mc = config_.model;
  const auto& par = config_.parallel;
  layout_ = describe_params(mc, chunks_);
  AdamWParams adamw;
  adamw.beta1 = config_.training.beta1;
  adamw.beta2 = config_.training.beta2;
  adamw.eps = config_.training.eps;
  adamw.weight_decay = config_.training.weight_decay;
  const DType compute =
      config_.training.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  const int accum = config_.grad_accum_steps();
  OverlapOptions overlap;
  overlap.grad_reduce = par.overlap_grad_reduce;
  overlap.param_gather = par.overlap_param_gather;
  overlap.micro_batches = accum;
  // Over dp x cp: the cp ranks of a replica hold the same parameters, each the gradient of
  // its share of the tokens (docs/ARCHITECTURE.md "Context parallelism").
  ParamStore* store = nullptr;
  if (par.ep > 1) {
    // Expert parallelism (parallel/expert_parallel.h): the routed experts' groups (L + 2
    // and up) reduced and sharded over the expert-data-parallel group, the rest over dp.
    const int L = mc.n_layers;
    dense_layout_ = layout_subset(layout_, 0, L + 2);
    expert_layout_ = layout_subset(layout_, L + 2, static_cast<int>(layout_.groups.size()));
    dp_ = std::make_unique<DataParallel>(dense_layout_, *ops_, groups_.data_parallel(),
                                         par.zero_stage, static_cast<size_t>(par.bucket_mb) << 20,
                                         adamw, compute, overlap);
    edp_ = std::make_unique<DataParallel>(expert_layout_, *ops_, *groups_.expert_dp,
                                          par.zero_stage,
                                          static_cast<size_t>(par.bucket_mb) << 20, adamw,
                                          compute, overlap);
    split_store_ = std::make_unique<SplitParamStore>(dp_->store(), edp_->store(), L + 2);
    store = split_store_.get();
  } else {
    dp_ = std::make_unique<DataParallel>(layout_, *ops_, groups_.data_parallel(), par.zero_stage,
                                         static_cast<size_t>(par.bucket_mb) << 20, adamw, compute,
                                         overlap);
    store = &dp_->store();
  }
  const PipeSchedule schedule = par.pipeline_schedule;
  const int v = par.virtual_stages;
  // The stage's slots; with v > 1 one pool its chunks share (slot ids are the executor's).
  const int slots =
      PipelineExecutor::required_slots(schedule, par.pp, groups_.coords.pp_rank, accum, v);
  std::vector<Transformer*> pooled;
  for (const ModelPartition& chunk : chunks_) {
    models_.push_back(std::make_unique<Transformer>(mc, *ops_, chunk, groups_.tp.get(),
                                                    store, par.micro_batch_size, slots,
                                                    compute, config_.training.recompute,
                                                    groups_.cp.get(), groups_.ep.get(), v > 1));
    models_.back()->set_moe_loss_coefs(config_.training.moe_aux_loss_coef,
                                       config_.training.moe_z_loss_coef);
    pooled.push_back(models_.back().get());
  }
  if (v > 1) Transformer::share_activations(pooled);
  executor_ = std::make_unique<PipelineExecutor>(*groups_.pp, schedule, accum, slots, v);
  for (size_t k = 0; k < models_.size(); ++k) {
    runners_.push_back(std::make_unique<StageRunner>(*this, static_cast<int>(k)));
    stages_.push_back(runners_.back().get());
  }
}

Status Trainer::load_initial_weights(const InitWeights& init) {
  if (init.llmc || init.hf) {
    for (size_t i = 0; i < layout_.params.size(); ++i) {
      const ParamInfo& p = layout_.params[i];
      const std::vector<float>* values =
          init.llmc ? init.llmc->find(p.name) : init.hf->find(p.name);
      if (!values || static_cast<int64_t>(values->size()) != p.shape.numel()) {
        return Status::invalid_input(config_.model.init_from + ": tensor " + p.name +
                                     " does not fit the model");
      }
      const std::vector<float> local = local_part(p, values->data());
      dp_of(i).load_param(static_cast<int>(i), local);
    }
  } else {
    for (size_t i = 0; i < layout_.params.size(); ++i) {
      const std::vector<float> local =
          Transformer::initial_value(config_.model, layout_.params[i], config_.training.seed);
      dp_of(i).load_param(static_cast<int>(i), local);
    }
  }
  for_each_dp([](DataParallel& dp) { dp.zero_grad(); });
  return Status::ok();
}

void Trainer::make_checkpoint_writer() {
  CheckpointWriterOptions writer_options;
  writer_options.ops = ops_.get();
  writer_options.dir = config_.checkpoint.dir;
  writer_options.keep_last = config_.checkpoint.keep_last;
  writer_options.on_chunk = options_.checkpoint_chunk_hook;
  if (options_.checkpoint_chunk_bytes > 0) writer_options.chunk_bytes = options_.checkpoint_chunk_bytes;
  std::error_code ec;
  // Retention prunes this run's checkpoints only, and keeps the one this launch resumed
  // from (the way back if the continued run goes wrong).
  writer_options.run_id = run_id_;
  if (!resumed_from_.empty() && std::filesystem::equivalent(
          std::filesystem::path(resumed_from_).parent_path(), config_.checkpoint.dir, ec)) {
    writer_options.protect_steps.insert(step_);
  }
  writer_ = std::make_unique<CheckpointWriter>(writer_options);
}

Status Trainer::open_metrics() {
  if (world_->rank() == 0) {
    TRIDENT_RETURN_IF_ERROR(metrics_.open(config_.logging.metrics));
    metrics_.write_segment(run_id_, step_, resumed_from_, world_->size());
  }
  inputs_.resize(static_cast<size_t>(config_.parallel.micro_batch_size) * config_.model.seq_len);
  targets_.resize(inputs_.size());
  return Status::ok();
}

void Trainer::find_peak_flops() {
  // The MFU denominator: given (options), configured (runtime.peak_tflops), or the
  // backend's (CPU: measured sgemm rate; CUDA: the peak table, 0 for an unknown GPU).
  const double configured = options_.peak_flops > 0 ? options_.peak_flops
                                                     : config_.runtime.peak_tflops * 1e12;
  double peak = configured;
  if (peak <= 0) peak = world_->rank() == 0 ? ops_->peak_flops() : 0.0;
  peak_flops_ = configured > 0 ? peak : all_reduce_scalar(peak, "peak flops");
}

double Trainer::all_reduce_scalar(double local, const char* label) {
  double v = local;
  CollectiveOptions opts;
  opts.label = label;  // names the call if the watchdog ever reports it
  world_->all_reduce(CommBuf::host(std::span<double>(&v, 1)), ReduceOp::kSum, opts);
  return v;
}

void Trainer::print_banner() const {
  const auto& c = config_;
  const auto& m = c.model;
  log::info("trident: {} model, {} layers, {} heads ({} kv), d_model {}, d_ff {}, vocab {} (padded {}), seq_len {}",
            arch_name(m.arch), m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_ff,
            m.vocab_size, m.padded_vocab, m.seq_len);
  log::info("parameters: {} ({:.2f} M); {:.3g} FLOP/token", m.num_parameters(),
            m.num_parameters() / 1e6, m.flops_per_token());
  std::string stages;
  const int v = c.parallel.virtual_stages;
  if (v == 1) {
    for (int n : stage_layer_counts(m.n_layers, c.parallel.pp, c.parallel.stage_layers)) {
      if (!stages.empty()) stages += ',';  // (not "," + ...: GCC 12 warns falsely, -Wrestrict)
      stages += std::to_string(n);
    }
  } else {
    stages = std::to_string(m.n_layers / (c.parallel.pp * v));
  }
  // Expert parallelism folds into dp: shown inside it ("dp 4 (ep 2)").
  const std::string dp_text =
      std::to_string(c.parallel.dp) +
      (c.parallel.ep > 1 ? " (ep " + std::to_string(c.parallel.ep) + ")" : std::string());
  log::info("layout: world {} = dp {}{} x tp {}{} x pp {} | zero_stage {} | pipeline {}{} (layers per {} {}) | recompute {}",
            world_->size(), dp_text,
            c.parallel.cp > 1 ? " x cp " + std::to_string(c.parallel.cp) : "", c.parallel.tp,
            c.parallel.sequence_parallel ? " (sequence parallel)" : "", c.parallel.pp,
            c.parallel.zero_stage, pipe_schedule_name(c.parallel.pipeline_schedule),
            v > 1 ? " interleaved, " + std::to_string(v) + " chunks per stage" : "",
            v > 1 ? "chunk" : "stage", stages, recompute_name(c.training.recompute));
  log::info("batch: micro_batch {} x {} micro-batches x dp {} = global batch {} sequences ({} tokens)",
            c.parallel.micro_batch_size, c.grad_accum_steps(), c.parallel.dp,
            c.training.global_batch_size,
            static_cast<long long>(c.training.global_batch_size) * m.seq_len);
  log::info("precision: {}{}", precision_name(c.training.precision),
            c.training.precision == Precision::kBf16
                ? " (bf16 compute weights and activations; fp32 masters, gradients, moments)"
                : "");
  log::info("optimizer: AdamW lr {:.2e} -> {:.2e} ({}, warmup {}), wd {}, betas ({}, {}), clip {}",
            c.training.lr, c.training.min_lr, lr_schedule_name(c.training.lr_schedule),
            c.training.warmup_steps, c.training.weight_decay, c.training.beta1, c.training.beta2,
            c.training.grad_clip);
  log::info("data: train {} ({} samples{}), val {}", data_train_text(c.data), num_train_samples_,
            c.data.shuffle ? ", shuffled" : "", c.data.val.empty() ? "none" : c.data.val);
  const char* peak_source = "the backend's peak";
  if (options_.peak_flops > 0) {
    peak_source = "given";
  } else if (c.runtime.peak_tflops > 0) {
    peak_source = "runtime.peak_tflops";
  } else if (peak_flops_ <= 0) {
    peak_source = "unknown: MFU reported as 0";
  }
  log::info("device: {} backend, {} ranks; MFU against {:.1f} GFLOP/s per rank ({})",
            ops_->name(), world_->size(), peak_flops_ / 1e9, peak_source);
  log::info("backend: {}", ops_->description());
  log::info("communication: {}", communication_libraries());
}

void Trainer::reset_traffic() {
  for (Communicator* c : {groups_.dp.get(), groups_.tp.get(), groups_.pp.get(),
                          groups_.embedding.get(), groups_.cp.get(), groups_.dp_cp.get(),
                          groups_.ep.get(), groups_.expert_dp.get(), world_}) {
    if (c) c->reset_traffic();
  }
}

void Trainer::collect_traffic() {
  // The world carries only scalars (loss, norm, flags); the groups carry the model's
  // traffic. A one-rank group moves nothing between ranks.
  auto measure = [](const Communicator* c) {
    GroupTraffic g;
    if (c == nullptr || c->size() == 1) return g;
    const TrafficCounters& t = c->traffic();
    g.all_reduce = static_cast<double>(t.bytes_of(CollectiveKind::kAllReduce));
    g.reduce_scatter = static_cast<double>(t.bytes_of(CollectiveKind::kReduceScatter));
    g.all_gather = static_cast<double>(t.bytes_of(CollectiveKind::kAllGather));
    g.send = static_cast<double>(t.bytes_of(CollectiveKind::kSend));
    g.all_to_all = static_cast<double>(t.bytes_of(CollectiveKind::kAllToAll));
    return g;
  };
  stats_.traffic.tp = measure(groups_.tp.get());
  // The data-parallel traffic is that of the dp x cp group under context parallelism.
  stats_.traffic.dp = measure(&groups_.data_parallel());
  stats_.traffic.pp = measure(groups_.pp.get());
  stats_.traffic.embedding = measure(groups_.embedding.get());
  stats_.traffic.cp = measure(groups_.cp.get());  // the ring's sends (null at cp 1)
  // Expert parallelism (null at ep 1): the tokens' all-to-all, the experts' reduction.
  stats_.traffic.ep = measure(groups_.ep.get());
  stats_.traffic.expert_dp = measure(groups_.expert_dp.get());
  // Where the communication time went (a one-rank group's calls are local copies).
  const std::array<Communicator*, 7> groups = metric_groups();
  auto measured = [&](size_t g) { return groups[g] != nullptr && groups[g]->size() > 1; };
  auto times = [&](double CommTimes::*field) {
    std::array<double, 7> ms{};
    for (size_t g = 0; g < 7; ++g) {
      if (measured(g)) ms[g] = groups[g]->times().*field * 1e3;
    }
    return StepMetrics::GroupMs::of(ms);
  };
  stats_.comm_exposed_ms = times(&CommTimes::exposed_s);
  stats_.comm_hidden_ms = times(&CommTimes::hidden_s);
  stats_.comm_async_ms = times(&CommTimes::async_s);
  stats_.total_comm_exposed_ms += stats_.comm_exposed_ms;
  stats_.total_comm_hidden_ms += stats_.comm_hidden_ms;
  // The same split by the collective kinds of StepMetrics::KindMs, exposed + hidden.
  for (size_t g = 0; g < 7; ++g) {
    stats_.comm_kind_ms[g] = {};
    stats_.comm_calls[g].clear();
    if (!measured(g)) continue;
    const CommTimes& t = groups[g]->times();
    stats_.comm_calls[g] = t.calls;
    auto ms = [&](CollectiveKind k) { return (t.exposed_of(k) + t.hidden_of(k)) * 1e3; };
    stats_.comm_kind_ms[g] = {.all_reduce = ms(CollectiveKind::kAllReduce),
                              .reduce_scatter = ms(CollectiveKind::kReduceScatter),
                              .all_gather = ms(CollectiveKind::kAllGather)};
  }
  // Under expert parallelism the dp group reduces the dense engine's groups, expert_dp the
  // experts' (analytic_traffic tells them apart in the whole table).
  stats_.analytic = analytic_traffic(config_, chunks_.front(), layout_);
  const DataParallel::Memory mem = data_parallel_memory();
  stats_.param_bytes = static_cast<double>(mem.params);
  stats_.master_bytes = static_cast<double>(mem.master);
  stats_.grad_bytes = static_cast<double>(mem.grads);
  stats_.optimizer_bytes = static_cast<double>(mem.optimizer);
  stats_.activation_bytes = 0;
  for (const auto& model : models_) {
    stats_.activation_bytes += static_cast<double>(model->activation_bytes());
  }
}

DataParallel::Memory Trainer::data_parallel_memory() const {
  DataParallel::Memory mem = dp_->memory();
  if (edp_) {
    const DataParallel::Memory e = edp_->memory();
    mem.params += e.params;
    mem.master += e.master;
    mem.grads += e.grads;
    mem.optimizer += e.optimizer;
    mem.comm_scratch += e.comm_scratch;
    mem.params_peak += e.params_peak;
    mem.grads_peak += e.grads_peak;
  }
  return mem;
}

nlohmann::json Trainer::trainer_state() {
  const auto& par = config_.parallel;
  TrainState state;
  state.step = step_;
  state.consumed_samples = consumed_samples_;
  state.optimizer_steps = dp_->steps_taken();
  state.layout = {par.dp, par.tp, par.pp, par.zero_stage, world_->size(), par.cp};
  state.init_seed = config_.training.seed;
  state.data_seed = config_.data.seed;
  state.config_yaml = config_to_yaml(config_);
  state.run_id = run_id_;
  state.checkpoint_uid = new_lineage_id();  // rank 0's copy is the one stored
  state.ancestors = ancestors_;
  // The data fingerprint (trainer/resume_compat.h), compared on resume; rank 0 knows it.
  state.extra["data"] =
      data_fingerprint_ ? nlohmann::json(*data_fingerprint_) : nlohmann::json();
  // The data's tokenizer, for `trident generate`; absent when the data does not say.
  if (data_tokenizer_) state.extra["tokenizer"] = tokenizer_record_to_json(*data_tokenizer_);
  state.extra["recent_losses"] = loss_guard_.recent_losses();  // the loss-spike guard's window
  // The next checkpoint descends from this one (whether or not this one commits: an id
  // that names no checkpoint matches nothing).
  ancestors_.insert(ancestors_.begin(), state.checkpoint_uid);
  if (ancestors_.size() > kMaxAncestors) ancestors_.resize(kMaxAncestors);
  return train_state_to_json(state);
}


Result<std::string> Trainer::agree(const std::string& decision) {
  std::string d = broadcast_string(*world_, decision);
  if (d.empty() || d[0] != '!') return d;
  const size_t colon = d.find(':');
  return Status(static_cast<StatusCode>(std::stoi(d.substr(1, colon - 1))), d.substr(colon + 1));
}

Status Trainer::claim_checkpoint_dir() {
  std::string decision;
  if (world_->rank() == 0) {
    // The lock first: only the run holding it may clean up or prune in this directory.
    auto lock = DirLock::acquire(config_.checkpoint.dir);
    if (lock.is_ok()) {
      dir_lock_ = std::move(lock).value();
      // A crash can leave uncommitted saves and temporary files behind; no save of
      // this run is in flight yet, and no other run can be writing here.
      std::vector<std::string> removed;
      Status st = remove_crash_leftovers(config_.checkpoint.dir, &removed);
      for (const std::string& r : removed) log::info("checkpoint.dir: removed crash leftover {}", r);
      if (!st.is_ok()) log::warn("checkpoint.dir: {}", st.message());
    } else {
      decision = encode_error(lock.status());
    }
  }
  return agree(decision).status();
}

Status Trainer::resume() {
  const std::string& root = config_.checkpoint.dir;
  // Rank 0 decides: "F<run_id>" (start fresh), "R<run_id>\n<step dir>", or an error.
  std::string decision;
  if (world_->rank() == 0) {
    auto decide = [&]() -> Result<std::string> {
      std::string chosen;
      if (options_.resume == "none") {
        TRIDENT_RETURN_IF_ERROR(check_fresh_start(root));
      } else if (options_.resume == "auto") {
        TRIDENT_ASSIGN_OR_RETURN(ResumeChoice choice, choose_auto_resume(root));
        for (const std::string& w : choice.warnings) log::warn("--resume auto: {}", w);
        chosen = choice.dir;
      } else {
        std::string note;
        auto dir = resolve_step_dir(options_.resume, &note);
        if (!note.empty()) log::warn("{}", note);
        if (!dir.is_ok()) return dir.status().with_context("--resume " + options_.resume);
        Status st = verify_training_checkpoint(dir.value()).status();
        if (!st.is_ok()) return st.with_context("--resume " + options_.resume);
        chosen = dir.value();
      }
      if (chosen.empty()) return "F" + new_lineage_id();
      TRIDENT_ASSIGN_OR_RETURN(Checkpoint ckpt, open_checkpoint(chosen));
      TRIDENT_ASSIGN_OR_RETURN(TrainState state,
                               parse_train_state(ckpt.trainer_state(), ckpt.step(),
                                                 ckpt.manifest().world_size, chosen));
      // The stored config and data against this run's (trainer/resume_compat.h): refuse a
      // different model before anything in the directory changes; say what else changes.
      const ResumeCompat compat = check_resume_compat(
          ckpt.trainer_state(), config_, ckpt.step(),
          data_fingerprint_ ? *data_fingerprint_ : fingerprint_from_config(config_.data));
      for (const std::string& note : compat.notes) log::info("resume: {}", note);
      for (const std::string& warning : compat.warnings) log::warn("resume: {}", warning);
      TRIDENT_RETURN_IF_ERROR(resume_compat_status(compat, chosen));
      std::vector<std::string> moved;
      TRIDENT_RETURN_IF_ERROR(prepare_continuation(root, chosen, state, &moved));
      for (const std::string& m : moved) {
        log::warn("set aside {} (newer than the step this run continues from; kept, not "
                  "deleted: remove it when no longer needed)", m);
      }
      // A checkpoint from before runs had an identity starts a lineage of its own.
      const std::string run = state.run_id.empty() ? new_lineage_id() : state.run_id;
      // The second line: whether the loss-spike guard's window restarts (see resume()).
      return "R" + run + "\n" + (compat.loss_level_changes ? "1" : "0") + "\n" + chosen;
    };
    auto d = decide();
    decision = d.is_ok() ? d.value() : encode_error(d.status());
  }
  TRIDENT_ASSIGN_OR_RETURN(decision, agree(decision));
  if (decision[0] == 'F') {
    run_id_ = decision.substr(1);
    return Status::ok();
  }
  const size_t nl = decision.find('\n');
  run_id_ = decision.substr(1, nl - 1);
  const bool restart_loss_window = decision.compare(nl + 1, 1, "1") == 0;
  const std::string chosen = decision.substr(nl + 3);

  Status st;
  auto ckpt = open_checkpoint(chosen);
  std::optional<TrainState> state;
  if (ckpt.is_ok()) {
    auto parsed = parse_train_state(ckpt->trainer_state(), ckpt->step(),
                                    ckpt->manifest().world_size, chosen);
    st = parsed.status();
    if (st.is_ok()) {
      state = std::move(parsed).value();
      st = load_checkpoint_state(ckpt.value(), layout_, *dp_, *ops_, expert_engine());
    }
  } else {
    st = ckpt.status();
  }
  // Every rank must have loaded before anyone trains on.
  if (all_reduce_scalar(st.is_ok() ? 0.0 : 1.0, "checkpoint load status") > 0) {
    return st.is_ok() ? Status::corrupt("another rank failed to load " + chosen) : st;
  }
  step_ = static_cast<int>(state->step);
  consumed_samples_ = state->consumed_samples;
  for_each_dp([&](DataParallel& dp) { dp.set_steps_taken(static_cast<int>(state->optimizer_steps)); });
  // The loss-spike guard's window (absent in older checkpoints; ignored when malformed).
  if (auto it = state->extra.find("recent_losses"); it != state->extra.end() && it->is_array()) {
    std::vector<double> window;
    for (const nlohmann::json& v : *it) {
      if (v.is_number()) window.push_back(v.get<double>());
    }
    loss_guard_.restore(window);
  }
  if (restart_loss_window) {
    // New data (warned about above): the old data's median would stop a legitimate
    // continuation at its first step, and every requeue alike.
    loss_guard_.reset();
    if (world_->rank() == 0 && loss_guard_.enabled()) {
      log::warn("resume: the training data changed, so the loss-spike guard's window restarts: "
                "until it holds {} steps only its absolute bound applies",
                loss_guard_.min_count());
    }
  }
  for_each_dp([](DataParallel& dp) { dp.zero_grad(); });
  resumed_from_ = chosen;
  if (!state->checkpoint_uid.empty()) {
    ancestors_ = state->ancestors;
    ancestors_.insert(ancestors_.begin(), state->checkpoint_uid);
    if (ancestors_.size() > kMaxAncestors) ancestors_.resize(kMaxAncestors);
  }
  if (world_->rank() == 0) {
    const TrainLayout& l = state->layout;
    log::info("resumed from {} (step {}, {} samples consumed; saved by dp={}{} tp={} pp={} "
              "zero_stage={}; run {})",
              chosen, step_, consumed_samples_, l.dp,
              l.cp > 1 ? " cp=" + std::to_string(l.cp) : "", l.tp, l.pp, l.zero_stage, run_id_);
  }
  return Status::ok();
}

Status Trainer::save_checkpoint(bool async) {
  const std::vector<BoxRef> boxes =
      checkpoint_boxes(layout_, *dp_, groups_.coords, config_.parallel.zero_stage, expert_engine());
  Status st = writer_->save(step_, boxes, trainer_state(), *world_, async);
  if (!st.is_ok()) return st.with_context("checkpoint step " + std::to_string(step_));
  const SaveStats& stats = writer_->last_stats();
  if (world_->rank() == 0 && !options_.quiet) {
    log::info("checkpoint step {}: snapshot {:.1f} ms{}", step_, stats.snapshot_ms,
              async ? ", writing in the background" : fmt::format(", written and committed in {:.1f} ms", stats.write_ms + stats.commit_ms));
  }
  return Status::ok();
}

Result<StepMetrics> Trainer::train_step() {
  const auto& c = config_;
  const int T = c.model.seq_len;
  const int accum = c.grad_accum_steps();
  Timer timer;
  reset_traffic();
  for_each_dp([](DataParallel& dp) { dp.zero_grad(); });
  if (computes_loss()) last_model().reset_loss_sum();  // clean even after a failed step
  for (const auto& r : runners_) r->reset_status();
  for (const auto& model : models_) model->take_moe_stats();  // drop what evaluation recorded
  const PipelineExecutor::Stats pipe = executor_->run(stages_);
  Status data_status;
  for (const auto& r : runners_) {
    if (data_status.is_ok()) data_status = r->status();
  }
  // Before the step can stop on a data error: what backward issued must complete.
  for_each_dp([](DataParallel& dp) { dp.reduce_gradients(); });
  // Expert parallelism: an expert's gradient sums its ep group's tokens, then the expert dp
  // group's, and that engine divides by its size dp / ep; the mean over dp takes 1 / ep more.
  if (edp_) edp_->scale_gradients(1.0f / static_cast<float>(c.parallel.ep));

  // A data error on any rank stops every rank with the same step.
  const double failed = all_reduce_scalar(data_status.is_ok() ? 0.0 : 1.0, "step data status");
  if (failed > 0) {
    if (!data_status.is_ok()) return data_status;
    return Status::invalid_input("another rank failed to load step " + std::to_string(step_ + 1) +
                                 "'s data (see its message)");
  }
  if (groups_.embedding) {
    // The tied embedding lives on the first and the last stage: sum the two gradients.
    const ParamInfo* wte = layout_.find("wte");
    const DataParallel::GradSlice grad =
        dp_->reduced_grad(static_cast<int>(wte - layout_.params.data()));
    CollectiveOptions opts;
    opts.label = "tied wte grad";
    groups_.embedding->all_reduce(CommBuf::device(grad.data, grad.floats), ReduceOp::kSum, opts);
  }
  const double norm =
      std::sqrt(all_reduce_scalar(dp_->owned_grad_square_sum(groups_.coords.tp_rank == 0) +
                                      (edp_ ? edp_->owned_grad_square_sum(groups_.coords.tp_rank == 0) : 0.0),
                                  "grad norm"));
  if (c.training.grad_clip > 0 && norm > c.training.grad_clip) {
    for_each_dp([&](DataParallel& dp) {
      dp.scale_gradients(static_cast<float>(c.training.grad_clip / norm));
    });
  }
  const float lr = learning_rate_at(c.training, step_);
  for_each_dp([&](DataParallel& dp) { dp.step(lr); });
  // The step's second (and last) device -> host read: the accumulated loss, on the
  // reporting ranks; the other last-stage ranks (tp > 0) only reset theirs.
  const bool reports_loss = computes_loss() && groups_.coords.tp_rank == 0;
  double loss_sum = 0.0;
  if (reports_loss) {
    loss_sum = last_model().download_loss_sum();
  } else if (computes_loss()) {
    last_model().reset_loss_sum();
  }
  const double loss =
      all_reduce_scalar(reports_loss ? loss_sum / accum / (c.parallel.dp * c.parallel.cp) : 0.0,
                        "loss");
  // A non-finite loss or gradient norm is the guard's to report (check_loss_spike), at
  // the step boundary, so that no state of this step or the one before it commits.
  ++step_;
  consumed_samples_ += static_cast<uint64_t>(c.training.global_batch_size);
  collect_traffic();
  stats_.pipeline_idle_ms = pipe.idle_seconds * 1e3;
  stats_.pipeline_total_ms = pipe.total_seconds * 1e3;
  stats_.peak_live_micro_batches = pipe.peak_live_slots;

  StepMetrics m;
  m.step = step_;
  m.max_steps = c.training.max_steps;
  m.loss = loss;
  m.grad_norm = norm;
  m.lr = lr;
  m.step_ms = timer.elapsed_ms();
  const double tokens = static_cast<double>(c.training.global_batch_size) * T;
  m.tokens_per_s = tokens / (m.step_ms / 1000.0);
  m.comm_exposed_ms = stats_.comm_exposed_ms;
  m.comm_hidden_ms = stats_.comm_hidden_ms;
  m.mfu = peak_flops_ > 0
              ? c.model.flops_per_token() * m.tokens_per_s / (peak_flops_ * world_->size())
              : 0.0;  // an unknown peak (a GPU missing from the table): no MFU
  // Only when someone reads it: a metrics file or the warning (the same on every rank).
  if (world_->size() > 1 && (!c.logging.metrics.empty() || stragglers_.enabled())) {
    collect_slowest_rank(m);
  }
  if (records_least_waits()) collect_least_waits(m);
  if (c.model.moe()) collect_moe_metrics(m);
  losses_.push_back(loss);
  return m;
}

void Trainer::collect_slowest_rank(StepMetrics& m) {
  // This rank's busy time: the step minus its training thread's waits in communicator
  // calls, the groups' (collect_traffic) and the world's, but for groups inside this
  // rank's host in a world of several hosts; and its own time, the step minus all of them
  // (trainer/straggler.h says why both). Gathered after the step's timer and its last
  // training collective: it moves 16 bytes per rank and touches no training state.
  const std::array<double, 7> group_ms = stats_.comm_exposed_ms.values();
  double remote_ms = world_->times().exposed_s * 1e3, local_ms = 0;
  for (size_t g = 0; g < 7; ++g) (same_host_[g] ? local_ms : remote_ms) += group_ms[g];
  const double busy = std::max(0.0, m.step_ms - remote_ms);
  const double mine[2] = {busy, std::max(0.0, busy - local_ms)};
  std::vector<double> gathered(2 * static_cast<size_t>(world_->size()), 0.0);
  world_->all_gather(CommBuf::host(std::span<const double>(mine)),
                     CommBuf::host(std::span<double>(gathered)), {.label = "step busy times"});
  step_busy_ms_.resize(static_cast<size_t>(world_->size()));
  step_own_ms_.resize(step_busy_ms_.size());
  for (size_t r = 0; r < step_busy_ms_.size(); ++r) {
    step_busy_ms_[r] = gathered[2 * r];
    step_own_ms_[r] = gathered[2 * r + 1];
  }
  const SlowestRank s = slowest_rank(step_busy_ms_);
  m.has_slowest = true;
  m.slowest_rank = s.rank;
  m.slowest_host = static_cast<size_t>(s.rank) < hosts_.size() ? hosts_[static_cast<size_t>(s.rank)] : "";
  m.slowest_busy_ms = s.busy_ms;
  m.median_busy_ms = s.median_ms;
  m.slowest_ratio = s.ratio;
}

std::array<Communicator*, 7> Trainer::metric_groups(const ProcessGroups& groups) {
  // In the order of StepMetrics::GroupMs: the dp slot is the data-parallel group whose
  // waits comm_exposed_ms.dp counts (dp x cp under context parallelism), then the cp ring,
  // then expert parallelism's ep and expert_dp groups.
  return {groups.tp.get(),        &groups.data_parallel(), groups.pp.get(),
          groups.embedding.get(), groups.cp.get(),         groups.ep.get(),
          groups.expert_dp.get()};
}

namespace {

// Per collective kind, the sum over `calls` (this rank's, CommTimes::calls) of each
// call's least seconds over `group`'s ranks, in ms: the group's communication of that
// kind without the ranks' arrival skew at each call. Two all-reduces over the group: the
// calls' count and a checksum of their kinds (every rank issues the same collectives in
// the same order), then each call's least. Ranks whose calls differ (which the
// collectives' contract rules out) get `own` instead.
StepMetrics::KindMs call_least_ms(Communicator& group, const std::vector<CommTimes::Call>& calls,
                                  const StepMetrics::KindMs& own) {
  double order = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    order += static_cast<double>((i % 1024) + 1) * (static_cast<int>(calls[i].kind) + 1);
  }
  const double n = static_cast<double>(calls.size());
  std::array<double, 4> shape = {n, -n, order, -order};
  group.all_reduce(CommBuf::host(std::span<double>(shape)), ReduceOp::kMax, {.label = "least waits: calls"});
  if (shape[0] != -shape[1] || shape[2] != -shape[3]) return own;
  std::vector<double> neg(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) neg[i] = -calls[i].seconds;
  if (!neg.empty()) {
    group.all_reduce(CommBuf::host(std::span<double>(neg)), ReduceOp::kMax, {.label = "least waits: per call"});
  }
  std::array<double, StepMetrics::KindMs::kCount> ms{};  // all_reduce, reduce_scatter, all_gather
  for (size_t i = 0; i < calls.size(); ++i) ms[static_cast<size_t>(calls[i].kind)] -= neg[i] * 1e3;
  return StepMetrics::KindMs::of(ms);
}

}  // namespace

void Trainer::collect_least_waits(StepMetrics& m) {
  // Per group kind, the least any rank in a group of that kind waited in the step
  // (exposed) and the least any spent in its communication (exposed + hidden; a group of
  // one rank counts for none). A rank that reaches a blocking
  // collective first waits for the others to arrive as well as for the transfer; the
  // last to arrive waits for the transfer alone. The least is then the communication
  // without the ranks' arrival skew, the figure `trident plan` models (its calibration
  // reads it). Per collective kind, each group's calls of that kind, each call's least
  // over the group's ranks (call_least_ms: the last to arrive is not the same rank at every
  // call, so the least of the ranks' sums would keep the skew of the calls each rank
  // reached first), lets it fit each kind's bandwidth apart. Then one world all-reduce of
  // 7 * (2 + 3) doubles, whatever the world's size, for the least over the groups of a
  // kind: the maximum of the negated times, with -inf from a rank outside the group.
  constexpr size_t kKinds = StepMetrics::KindMs::kCount;
  const std::array<double, 7> exposed = stats_.comm_exposed_ms.values();
  const std::array<double, 7> hidden = stats_.comm_hidden_ms.values();
  const std::array<Communicator*, 7> groups = metric_groups();
  const std::array<Communicator*, 7> host = metric_groups(host_groups_);  // their host twins
  // [exposed per group | exposed + hidden per group | per group, per collective kind]
  std::array<double, 7 * (2 + kKinds)> v;
  for (size_t g = 0; g < 7; ++g) {
    const bool member = groups[g] != nullptr && groups[g]->size() > 1;
    constexpr double kOutside = -std::numeric_limits<double>::infinity();
    v[g] = member ? -exposed[g] : kOutside;
    v[7 + g] = member ? -(exposed[g] + hidden[g]) : kOutside;
    const std::array<double, kKinds> kinds =
        member ? call_least_ms(*host[g], stats_.comm_calls[g], stats_.comm_kind_ms[g]).values()
               : std::array<double, kKinds>{};
    for (size_t k = 0; k < kKinds; ++k) v[14 + kKinds * g + k] = member ? -kinds[k] : kOutside;
  }
  world_->all_reduce(CommBuf::host(std::span<double>(v)), ReduceOp::kMax, {.label = "least waits"});
  auto least = [&](size_t i) { return std::isinf(v[i]) ? 0.0 : -v[i]; };
  std::array<double, 7> least_exposed, least_total;
  for (size_t g = 0; g < 7; ++g) {
    least_exposed[g] = least(g);
    least_total[g] = least(7 + g);
    std::array<double, kKinds> kinds;
    for (size_t k = 0; k < kKinds; ++k) kinds[k] = least(14 + kKinds * g + k);
    m.comm_kind_least_ms[g] = StepMetrics::KindMs::of(kinds);
  }
  m.has_least = true;
  m.comm_exposed_least_ms = StepMetrics::GroupMs::of(least_exposed);
  m.comm_total_least_ms = StepMetrics::GroupMs::of(least_total);
}

void Trainer::find_same_host_groups() {
  same_host_ = {};
  stragglers_.set_hosts({});
  const auto host = [&](int world_rank) -> const std::string& {
    return hosts_[static_cast<size_t>(world_rank)];
  };
  if (hosts_.size() != static_cast<size_t>(world_->size()) ||
      std::all_of(hosts_.begin(), hosts_.end(), [&](const std::string& h) { return h == hosts_[0]; })) {
    return;  // no host names, or one host: every rank is its own unit
  }
  std::vector<int> host_index(hosts_.size());
  for (size_t r = 0; r < hosts_.size(); ++r) {
    host_index[r] = static_cast<int>(std::find(hosts_.begin(), hosts_.end(), hosts_[r]) - hosts_.begin());
  }
  stragglers_.set_hosts(std::move(host_index));
  const std::array<Communicator*, 7> groups = metric_groups();
  for (size_t g = 0; g < 7; ++g) {
    // Members' world ranks: the MPI groups know them; a backend that does not (NCCL)
    // leaves the group counted as spanning hosts.
    const std::vector<int> members = groups[g] ? groups[g]->world_ranks() : std::vector<int>{};
    same_host_[g] = !members.empty() && std::all_of(members.begin(), members.end(), [&](int w) {
      return w >= 0 && w < world_->size() && host(w) == host(world_->rank());
    });
  }
}

void Trainer::collect_moe_metrics(StepMetrics& m) {
  const auto& c = config_;
  const size_t L = static_cast<size_t>(c.model.n_layers), E = static_cast<size_t>(c.model.moe_experts);
  // [aux, z, counts per global layer and expert], summed over the tp rank 0s: each dp
  // rank's stages hold every layer once, and its tp ranks route the same rows alike.
  std::vector<double> sums(2 + L * E, 0.0);
  for (size_t k = 0; k < models_.size(); ++k) {
    const Transformer::MoeStats s = models_[k]->take_moe_stats();
    if (groups_.coords.tp_rank != 0) continue;
    sums[0] += s.aux_loss;
    sums[1] += s.z_loss;
    for (size_t l = 0; l < s.counts.size(); ++l) {
      const size_t layer = static_cast<size_t>(chunks_[k].layer_begin) + l;
      for (size_t e = 0; e < E; ++e) sums[2 + layer * E + e] += static_cast<double>(s.counts[l][e]);
    }
  }
  CollectiveOptions opts;
  opts.label = "moe metrics";
  world_->all_reduce(CommBuf::host(std::span<double>(sums)), ReduceOp::kSum, opts);
  const double micro_batches = static_cast<double>(c.grad_accum_steps()) * c.parallel.dp;
  m.moe = true;
  m.moe_histogram = step_ % c.logging.log_interval == 0;
  m.moe_aux_loss = sums[0] / micro_batches;
  m.moe_z_loss = sums[1] / micro_batches;
  m.moe_fractions.assign(L, std::vector<double>(E, 0.0));
  for (size_t l = 0; l < L; ++l) {
    double total = 0;
    for (size_t e = 0; e < E; ++e) total += sums[2 + l * E + e];
    for (size_t e = 0; e < E; ++e) {
      m.moe_fractions[l][e] = total > 0 ? sums[2 + l * E + e] / total : 0.0;
    }
  }
}

Result<double> Trainer::evaluate() {
  if (!val_data_) return Status::invalid_config("data.val: no validation data configured");
  const int mb = config_.parallel.micro_batch_size;
  const int T = config_.model.seq_len;
  const bool last = computes_loss();
  Communicator& pp = *groups_.pp;
  const int p = pp.size(), v = static_cast<int>(models_.size());
  Status status;
  if (last) last_model().reset_loss_sum();
  for (int b = 0; b < config_.training.eval_batches; ++b) {
    if (chunks_.front().first_stage() || last) {
      Status st = val_data_->load_sequential(static_cast<uint64_t>(b) * mb, mb, T, inputs_.data(),
                                             targets_.data());
      if (!st.is_ok() && status.is_ok()) status = st;
    }
    const int32_t* tokens = inputs_.data();
    const int32_t* targets = targets_.data();
    take_cp_rows(&tokens, &targets);
    // Forward only, virtual stage after virtual stage (chunk c of every rank, then chunk
    // c + 1 from rank 0 on): receive, compute, pass on.
    for (int c = 0; c < v; ++c) {
      Transformer& model = *models_[static_cast<size_t>(c)];
      const ModelPartition& part = chunks_[static_cast<size_t>(c)];
      const int slot = c;  // the chunks share one slot pool (>= v slots); each its own slot
      const size_t n = model.boundary_floats();
      // Tag: the batch and the sending chunk (rank 0 receives chunk c from rank p-1's c-1).
      if (!part.first_stage()) {
        const bool wrap = pp.rank() == 0;
        pp.recv(CommBuf::device(model.input_activation(slot), n), wrap ? p - 1 : pp.rank() - 1,
                b * v + (wrap ? c - 1 : c));
      }
      model.forward_stage(slot, part.first_stage() ? tokens : nullptr,
                          part.last_stage() ? targets : nullptr, mb, T / config_.parallel.cp);
      if (!part.last_stage()) {
        pp.send(CommBuf::device(model.output_activation(slot), n), (pp.rank() + 1) % p,
                b * v + c);
      }
    }
  }
  if (all_reduce_scalar(status.is_ok() ? 0.0 : 1.0, "eval data status") > 0) {
    if (!status.is_ok()) return status;
    return Status::invalid_input("another rank failed to load validation data");
  }
  // Every dp rank evaluates the same batches; the cp ranks of one replica report (each
  // the mean over its equal share of the tokens).
  // One device -> host read per evaluation, on each reporting rank.
  const bool reports = last && groups_.coords.tp_rank == 0 && groups_.coords.dp_rank == 0;
  const double sum = reports ? last_model().download_loss_sum() : 0.0;
  if (last && !reports) last_model().reset_loss_sum();
  const double share = config_.training.eval_batches * config_.parallel.cp;
  return all_reduce_scalar(reports ? sum / share : 0.0, "val loss");
}

std::map<std::string, std::vector<float>> Trainer::gather_parameters() {
  // Every rank first gathers its own (tensor-parallel local) values over dp; then the
  // dp-rank-0 replica of every (pp, tp) part sends them to world rank 0, which knows
  // every part's layout from describe_params and assembles the global tensors.
  std::vector<float> mine;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    std::vector<float> v = dp_of(i).gather_param(static_cast<int>(i));
    if (!layout_.params[i].tied_copy) mine.insert(mine.end(), v.begin(), v.end());
  }
  std::map<std::string, std::vector<float>> out;
  const Topology& topo = groups_.topology;
  if (world_->rank() != 0) {
    // Under expert parallelism the first ep ranks of dp together hold every expert.
    if (groups_.coords.dp_rank < config_.parallel.ep && groups_.coords.cp_rank == 0) {
      world_->send(CommBuf::host(std::span<const float>(mine)), 0, 7001);
    }
    return out;
  }
  for (int r = 0; r < world_->size(); ++r) {
    const RankCoords rc = topo.coords_of(r);
    if (rc.dp_rank >= config_.parallel.ep || rc.cp_rank != 0) continue;
    const ParamLayout layout = describe_params(
        config_.model, rank_chunks(config_, rc.tp_rank, rc.pp_rank, rc.dp_rank));
    std::vector<float> blob;
    if (r == 0) {
      blob = mine;
    } else {
      size_t total = 0;
      for (const ParamInfo& p : layout.params) {
        if (!p.tied_copy) total += static_cast<size_t>(p.numel());
      }
      blob.resize(total);
      world_->recv(CommBuf::host(std::span<float>(blob)), r, 7001);
    }
    size_t cursor = 0;
    for (const ParamInfo& p : layout.params) {
      if (p.tied_copy) continue;
      auto& global = out[p.name];
      if (global.empty()) global.assign(static_cast<size_t>(p.shape.numel()), 0.0f);
      place_local_part(p, blob.data() + cursor, global.data());
      cursor += static_cast<size_t>(p.numel());
    }
  }
  return out;
}

namespace {
// The end-of-run record of the metrics file: every rank's instrumentation.
std::string summary_json(const RankStats* stats, int n, const Topology& topo) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  auto traffic = [](const RankTraffic& t) {
    return nlohmann::ordered_json{{"tp", t.tp.total()},
                                  {"dp", t.dp.total()},
                                  {"pp", t.pp.total()},
                                  {"embedding", t.embedding.total()},
                                  {"cp", t.cp.total()},
                                  {"ep", t.ep.total()},
                                  {"expert_dp", t.expert_dp.total()}};
  };
  for (int r = 0; r < n; ++r) {
    const RankStats& x = stats[r];
    const RankCoords rc = topo.coords_of(r);
    ranks.push_back({{"rank", r},
                     {"pp", rc.pp_rank},
                     {"dp", rc.dp_rank},
                     {"tp", rc.tp_rank},
                     {"cp", rc.cp_rank},
                     {"param_bytes", x.param_bytes},
                     {"master_bytes", x.master_bytes},
                     {"grad_bytes", x.grad_bytes},
                     {"optimizer_bytes", x.optimizer_bytes},
                     {"activation_bytes", x.activation_bytes},
                     {"bytes_sent_per_step", traffic(x.traffic)},
                     {"bytes_sent_per_step_analytic", traffic(x.analytic)},
                     {"pipeline_idle_ms", x.pipeline_idle_ms},
                     {"pipeline_step_ms", x.pipeline_total_ms},
                     {"peak_live_micro_batches", x.peak_live_micro_batches},
                     {"comm_exposed_ms_last_step", x.comm_exposed_ms},
                     {"comm_hidden_ms_last_step", x.comm_hidden_ms},
                     {"comm_exposed_ms_total", x.total_comm_exposed_ms},
                     {"comm_hidden_ms_total", x.total_comm_hidden_ms}});
  }
  nlohmann::ordered_json j = {{"summary", {{"ranks", ranks}}}};
  return j.dump();
}
}  // namespace

void Trainer::print_summary() {
  // Every rank's instrumentation, gathered to all (small), printed by rank 0.
  const int n = world_->size();
  std::vector<std::byte> all(sizeof(RankStats) * static_cast<size_t>(n));
  world_->all_gather(CommBuf::host(std::as_bytes(std::span<const RankStats>(&stats_, 1))),
                     CommBuf::host(std::span<std::byte>(all)));
  if (world_->rank() != 0) return;
  const auto* s = reinterpret_cast<const RankStats*>(all.data());
  metrics_.write_summary(summary_json(s, n, groups_.topology));
  if (options_.quiet || n == 1) return;
  log::info("per-rank summary (MiB held; MiB sent in the last step, measured / analytic):");
  log::info("{:>5} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>15} {:>15} {:>15} {:>13} {:>8}", "rank",
            "pp/dp/tp", "params", "master", "grads", "optim", "activ", "tp", "dp", "pp",
            "embedding", "pp idle");
  const double mib = 1.0 / 1048576.0;
  auto pair = [&](double measured, double analytic) {
    return fmt::format("{:.3f}/{:.3f}", measured * mib, analytic * mib);
  };
  for (int r = 0; r < n; ++r) {
    const RankCoords rc = groups_.topology.coords_of(r);
    const RankStats& x = s[r];
    const double idle =
        x.pipeline_total_ms > 0 ? 100.0 * x.pipeline_idle_ms / x.pipeline_total_ms : 0;
    log::info("{:>5} {:>9} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>15} {:>15} {:>15} {:>13} "
              "{:>7.1f}%",
              r,
              std::to_string(rc.pp_rank) + "/" + std::to_string(rc.dp_rank) + "/" +
                  std::to_string(rc.tp_rank),
              x.param_bytes * mib, x.master_bytes * mib, x.grad_bytes * mib,
              x.optimizer_bytes * mib,
              x.activation_bytes * mib, pair(x.traffic.tp.total(), x.analytic.tp.total()),
              pair(x.traffic.dp.total(), x.analytic.dp.total()),
              pair(x.traffic.pp.total(), x.analytic.pp.total()),
              pair(x.traffic.embedding.total(), x.analytic.embedding.total()), idle);
  }
  log::info("communication over the run, ms exposed (the compute waited) / hidden (ran "
            "behind compute):");
  log::info("{:>5} {:>17} {:>17} {:>17} {:>17}", "rank", "tp", "dp", "pp", "embedding");
  auto times = [](double exposed, double hidden) {
    return fmt::format("{:.1f}/{:.1f}", exposed, hidden);
  };
  for (int r = 0; r < n; ++r) {
    const StepMetrics::GroupMs& e = s[r].total_comm_exposed_ms;
    const StepMetrics::GroupMs& h = s[r].total_comm_hidden_ms;
    log::info("{:>5} {:>17} {:>17} {:>17} {:>17}", r, times(e.tp, h.tp), times(e.dp, h.dp),
              times(e.pp, h.pp), times(e.embedding, h.embedding));
  }
  if (config_.parallel.cp > 1) {  // the ring: synchronous (not overlapped), so all exposed
    log::info("cp ring: MiB sent in the last step (measured / analytic), ms exposed over the run:");
    for (int r = 0; r < n; ++r) {
      log::info("{:>5} {:>17} {:>10.1f}", r, pair(s[r].traffic.cp.total(), s[r].analytic.cp.total()),
                s[r].total_comm_exposed_ms.cp);
    }
  }
  if (config_.parallel.ep > 1) {  // the all-to-all: synchronous, so all exposed
    log::info("ep all-to-all and expert_dp: MiB sent in the last step (measured / analytic), ms "
              "exposed over the run:");
    log::info("{:>5} {:>17} {:>10} {:>17} {:>10}", "rank", "ep", "ep ms", "expert_dp",
              "expert ms");
    for (int r = 0; r < n; ++r) {
      log::info("{:>5} {:>17} {:>10.1f} {:>17} {:>10.1f}", r,
                pair(s[r].traffic.ep.total(), s[r].analytic.ep.total()),
                s[r].total_comm_exposed_ms.ep,
                pair(s[r].traffic.expert_dp.total(), s[r].analytic.expert_dp.total()),
                s[r].total_comm_exposed_ms.expert_dp);
    }
  }
}

Status Trainer::check_loss_spike(double loss, double grad_norm) {
  Status spike = loss_guard_.push(step_, loss, grad_norm);
  if (spike.is_ok()) {
    if (!config_.checkpoint.async && writer_->in_flight()) {
      // A sync save deferred by the guard (see run()): its weights are now vouched for.
      TRIDENT_RETURN_IF_ERROR(writer_->wait());
      if (world_->rank() == 0 && !options_.quiet) {
        log::info("checkpoint step {} committed", *writer_->last_committed_step());
      }
    }
    return Status::ok();
  }
  // The spiked loss was measured on the weights after step_ - 1, and this step has been
  // applied on top: neither state may be committed. A save in flight of an older step
  // passed the guard at the step after it, so it still commits; one of step_ - 1 is
  // dropped (the writer never commits it; the next start removes its .tmp).
  if (writer_->in_flight() && writer_->in_flight_step() < step_ - 1) {
    TRIDENT_RETURN_IF_ERROR(writer_->wait());
  }
  std::string problem;
  const auto latest = read_latest(config_.checkpoint.dir, &problem);
  const std::string newest =
      latest ? fmt::format("newest: step_{}", latest->step) : std::string("none yet");
  return Status::internal(fmt::format(
      "{}; stopping without saving so the committed checkpoints ({}) stay those of the healthy "
      "run; lower training.lr or raise training.loss_spike_factor",
      spike.message(), newest));
}

Status Trainer::run() {
  set_stop_mode_graceful();  // from here a first stop signal saves at a step boundary
  const auto& t = config_.training;
  Timer total;
  const int first_step = step_;
  const bool rank0 = world_->rank() == 0;
  const auto& ck = config_.checkpoint;
  // The stragglers' hosts: those the watchdog learnt (cmd_train); none without one.
  if (options_.watchdog) hosts_ = options_.watchdog->hosts();
  find_same_host_groups();
  while (step_ < t.max_steps) {
    if (options_.watchdog) options_.watchdog->set_step(step_ + 1);
    if (world_->rank() == options_.hang_rank && step_ + 1 == options_.hang_step) {
      log::warn("fault injection: rank {} hangs at step {}", options_.hang_rank, step_ + 1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    TRIDENT_ASSIGN_OR_RETURN(StepMetrics m, train_step());
    if (rank0) metrics_.write_step(m);
    if (rank0 && !step_busy_ms_.empty()) {
      if (auto found = stragglers_.push(step_busy_ms_, step_own_ms_); found && !found->empty()) {
        log::warn("straggler: {} (logging.straggler_factor; a slow node, CPU or device holds "
                  "every step back)",
                  straggler_text(*found, hosts_, stragglers_.factor(), stragglers_.window()));
      }
    }
    const bool last = step_ == t.max_steps;
    if (!options_.quiet && (step_ % config_.logging.log_interval == 0 || step_ == 1 || last)) {
      log::info("{}", format_progress_line(m));
    }
    // Before anything at this boundary can save or commit (docs/CONFIG.md, loss spikes).
    TRIDENT_RETURN_IF_ERROR(check_loss_spike(m.loss, m.grad_norm));
    if (val_data_ && t.eval_interval > 0 && (step_ % t.eval_interval == 0 || last)) {
      TRIDENT_ASSIGN_OR_RETURN(double val_loss, evaluate());
      if (rank0) metrics_.write_eval(step_, val_loss);
      if (!options_.quiet) log::info("step {}/{} | val_loss {:.4f}", step_, t.max_steps, val_loss);
    }
    // Step boundary: finish a background save, honour a stop request, save on schedule.
    if (writer_->in_flight()) {
      bool committed = false;
      TRIDENT_RETURN_IF_ERROR(writer_->poll(&committed));
      if (committed && rank0 && !options_.quiet) {
        log::info("checkpoint step {} committed (write {:.1f} ms in the background)",
                  *writer_->last_committed_step(), writer_->last_stats().write_ms);
      }
    }
    if (all_reduce_scalar(stop_requested() ? 1.0 : 0.0, "stop request") > 0) {
      TRIDENT_RETURN_IF_ERROR(writer_->wait());
      if (writer_->last_committed_step() != step_) TRIDENT_RETURN_IF_ERROR(save_checkpoint(false));
      stopped_by_signal_ = true;
      if (rank0) log::warn("stop requested (SIGTERM/SIGINT/SIGHUP/SIGUSR1): saved step {} in {}; exiting with 3", step_, ck.dir);
      return Status::ok();
    }
    if (ck.interval > 0 && step_ % ck.interval == 0 && step_ < t.max_steps) {
      // With the loss guard on, even a sync save commits only at the next boundary, after
      // the first loss measured on its weights has passed the guard.
      TRIDENT_RETURN_IF_ERROR(save_checkpoint(ck.async || loss_guard_.enabled()));
    }
  }
  // training.max_steps reached: the run's end is what a user continues, exports or
  // evaluates, so it is saved whatever the interval (checkpoint.save_final), and committed
  // (sync) before the run returns; an interval step is saved either way. A step an interval
  // save already committed, or a launch that trained nothing, writes nothing.
  TRIDENT_RETURN_IF_ERROR(writer_->wait());
  const bool on_schedule = ck.interval > 0 && step_ % ck.interval == 0;
  if ((ck.save_final || on_schedule) && writer_->last_committed_step() != step_ &&
      step_ > first_step) {
    TRIDENT_RETURN_IF_ERROR(save_checkpoint(false));
  }
  if (step_ > first_step) {
    print_summary();
    if (!options_.quiet) {
      const double secs = total.elapsed_ms() / 1000.0;
      const double tokens = static_cast<double>(step_ - first_step) * t.global_batch_size *
                            config_.model.seq_len;
      log::info("done: {} steps in {:.1f} s ({:.0f} tok/s); final loss {:.4f}",
                step_ - first_step, secs, tokens / secs, losses_.empty() ? 0.0 : losses_.back());
      if (!config_.logging.metrics.empty()) log::info("metrics: {}", config_.logging.metrics);
    }
  }
  return Status::ok();
}

}  // namespace trident
