#include "trainer/trainer.h"

#include <cmath>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/cpu/sgemm_peak.h"
#include "model/llmc_checkpoint.h"
#include "trainer/lr_schedule.h"

namespace trident {

Trainer::Trainer(Config config, TrainerOptions options)
    : config_(std::move(config)), options_(options) {}

Result<std::unique_ptr<Trainer>> Trainer::create(Config config, TrainerOptions options) {
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(config), options));
  TRIDENT_RETURN_IF_ERROR(trainer->init());
  return trainer;
}

Status Trainer::init() {
  std::optional<LlmcCheckpoint> init_ckpt;
  if (!config_.model.init_from.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(init_ckpt, read_llmc_checkpoint(config_.model.init_from));
    TRIDENT_RETURN_IF_ERROR(apply_llmc_architecture(*init_ckpt, &config_.model));
    config_.model.finalize();
    TRIDENT_RETURN_IF_ERROR(validate_config(config_));
  }
  const auto& mc = config_.model;
  const int mb = config_.parallel.micro_batch_size;

  TRIDENT_ASSIGN_OR_RETURN(
      DataLoader train,
      DataLoader::open(config_.data.train, mc.vocab_size, config_.data.seed,
                       config_.data.shuffle));
  TRIDENT_ASSIGN_OR_RETURN(num_train_samples_, train.num_samples(mc.seq_len));
  train_data_.emplace(std::move(train));
  if (!config_.data.val.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(
        DataLoader val, DataLoader::open(config_.data.val, mc.vocab_size, config_.data.seed,
                                         /*shuffle=*/false));
    TRIDENT_RETURN_IF_ERROR(val.num_samples(mc.seq_len).status());
    val_data_.emplace(std::move(val));
  }

  ops_ = make_cpu_ops();
  model_ = std::make_unique<Transformer>(mc, *ops_, mb);
  if (init_ckpt) {
    for (const auto& [name, values] : init_ckpt->tensors) {
      const ParamInfo* p = model_->find_param(name);
      if (!p || static_cast<size_t>(p->numel()) != values.size()) {
        return Status::invalid_input(config_.model.init_from + ": tensor " + name +
                                     " does not fit the model");
      }
      model_->set_param(*p, values.data());
    }
    model_->zero_grads();
  } else {
    model_->init_weights(config_.training.seed);
  }
  optimizer_ = std::make_unique<AdamW>(*model_, *ops_, config_.training);
  TRIDENT_RETURN_IF_ERROR(metrics_.open(config_.logging.metrics));
  inputs_.resize(static_cast<size_t>(mb) * mc.seq_len);
  targets_.resize(inputs_.size());

  peak_flops_ = options_.peak_flops > 0 ? options_.peak_flops : measure_sgemm_peak_gflops() * 1e9;
  if (!options_.quiet) print_banner();
  return Status::ok();
}

void Trainer::print_banner() const {
  const auto& c = config_;
  const auto& m = c.model;
  log::info("trident: {} model, {} layers, {} heads ({} kv), d_model {}, d_ff {}, vocab {} (padded {}), seq_len {}",
            arch_name(m.arch), m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_ff,
            m.vocab_size, m.padded_vocab, m.seq_len);
  log::info("parameters: {} ({:.2f} M); {:.3g} FLOP/token; activations {:.1f} MiB per micro-batch",
            m.num_parameters(), m.num_parameters() / 1e6, m.flops_per_token(),
            model_->activation_bytes() / 1048576.0);
  log::info("layout: dp={} tp={} pp={} zero_stage={} | micro_batch {} x {} accumulation steps = global batch {} sequences ({} tokens)",
            c.parallel.dp, c.parallel.tp, c.parallel.pp, c.parallel.zero_stage,
            c.parallel.micro_batch_size, c.grad_accum_steps(), c.training.global_batch_size,
            static_cast<long long>(c.training.global_batch_size) * m.seq_len);
  log::info("optimizer: AdamW lr {:.2e} -> {:.2e} ({}, warmup {}), wd {}, betas ({}, {}), clip {}",
            c.training.lr, c.training.min_lr, lr_schedule_name(c.training.lr_schedule),
            c.training.warmup_steps, c.training.weight_decay, c.training.beta1, c.training.beta2,
            c.training.grad_clip);
  log::info("data: train {} ({} samples{}), val {}", c.data.train, num_train_samples_,
            c.data.shuffle ? ", shuffled" : "", c.data.val.empty() ? "none" : c.data.val);
  log::info("device: {} backend; MFU against a peak of {:.1f} GFLOP/s (measured sgemm)",
            ops_->name(), peak_flops_ / 1e9);
}

Result<StepMetrics> Trainer::train_step() {
  const auto& mc = config_.model;
  const int mb = config_.parallel.micro_batch_size;
  const int accum = config_.grad_accum_steps();
  const int T = mc.seq_len;
  Timer timer;
  model_->zero_grads();
  double loss_sum = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    TRIDENT_RETURN_IF_ERROR(
        train_data_->load(consumed_samples_, mb, T, inputs_.data(), targets_.data()));
    consumed_samples_ += static_cast<uint64_t>(mb);
    loss_sum += model_->forward(inputs_.data(), targets_.data(), mb, T);
    model_->backward(1.0f / static_cast<float>(accum));
  }
  const double loss = loss_sum / accum;
  if (!std::isfinite(loss)) {
    return Status::internal("loss is " + std::to_string(loss) + " at step " +
                            std::to_string(step_ + 1) + "; stopping (try a lower training.lr)");
  }
  const double norm = optimizer_->grad_norm();
  optimizer_->clip(norm);
  const float lr = learning_rate_at(config_.training, step_);
  optimizer_->step(lr);
  ++step_;

  StepMetrics m;
  m.step = step_;
  m.max_steps = config_.training.max_steps;
  m.loss = loss;
  m.grad_norm = norm;
  m.lr = lr;
  m.step_ms = timer.elapsed_ms();
  const double tokens = static_cast<double>(config_.training.global_batch_size) * T;
  m.tokens_per_s = tokens / (m.step_ms / 1000.0);
  m.mfu = mc.flops_per_token() * m.tokens_per_s / peak_flops_;
  losses_.push_back(loss);
  return m;
}

Result<double> Trainer::evaluate() {
  if (!val_data_) return Status::invalid_config("data.val: no validation data configured");
  const int mb = config_.parallel.micro_batch_size;
  const int T = config_.model.seq_len;
  double sum = 0.0;
  for (int b = 0; b < config_.training.eval_batches; ++b) {
    TRIDENT_RETURN_IF_ERROR(val_data_->load_sequential(static_cast<uint64_t>(b) * mb, mb, T, inputs_.data(),
                                            targets_.data()));
    sum += model_->forward(inputs_.data(), targets_.data(), mb, T);
  }
  return sum / config_.training.eval_batches;
}

Status Trainer::run() {
  const auto& t = config_.training;
  Timer total;
  const int first_step = step_;
  while (step_ < t.max_steps) {
    TRIDENT_ASSIGN_OR_RETURN(StepMetrics m, train_step());
    metrics_.write_step(m);
    const bool last = step_ == t.max_steps;
    if (!options_.quiet && (step_ % config_.logging.log_interval == 0 || step_ == 1 || last)) {
      log::info("{}", format_progress_line(m));
    }
    if (val_data_ && t.eval_interval > 0 && (step_ % t.eval_interval == 0 || last)) {
      TRIDENT_ASSIGN_OR_RETURN(double val_loss, evaluate());
      metrics_.write_eval(step_, val_loss);
      if (!options_.quiet) log::info("step {}/{} | val_loss {:.4f}", step_, t.max_steps, val_loss);
    }
  }
  if (!options_.quiet && step_ > first_step) {
    const double secs = total.elapsed_ms() / 1000.0;
    const double tokens = static_cast<double>(step_ - first_step) * t.global_batch_size *
                          config_.model.seq_len;
    log::info("done: {} steps in {:.1f} s ({:.0f} tok/s); final loss {:.4f}", step_ - first_step,
              secs, tokens / secs, losses_.empty() ? 0.0 : losses_.back());
    if (!config_.logging.metrics.empty()) log::info("metrics: {}", config_.logging.metrics);
  }
  return Status::ok();
}

}  // namespace trident
