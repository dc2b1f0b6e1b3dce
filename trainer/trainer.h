// The training loop of one process: model, optimizer, data, schedule, evaluation and
// metrics. One optimizer step = grad_accum_steps() micro-batches of micro_batch_size
// sequences each; the loss reported is the mean over all of them.
//
// Determinism: on CPU the same config gives bitwise identical losses run to run
// (counter-based init, layout-independent data order, thread-count-independent ops).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/loader.h"
#include "kernels/ops.h"
#include "model/transformer.h"
#include "trainer/config.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"

namespace trident {

struct TrainerOptions {
  double peak_flops = 0;   // device peak FLOP/s for MFU; 0 = measure (CPU: sgemm rate)
  bool quiet = false;      // no progress lines (benchmarks, tests)
};

class Trainer {
 public:
  // Loads init_from (if any), builds the model and opens the data. Errors name the
  // config key or file. `config.model` must be finalized and validated.
  static Result<std::unique_ptr<Trainer>> create(Config config, TrainerOptions options = {});

  // Runs the remaining steps up to training.max_steps.
  Status run();
  // One optimizer step; returns its metrics. Used by run() and the benchmarks.
  Result<StepMetrics> train_step();
  // Mean loss over training.eval_batches micro-batches of the validation data.
  Result<double> evaluate();

  const Config& config() const { return config_; }
  Transformer& model() { return *model_; }
  int step() const { return step_; }
  uint64_t consumed_samples() const { return consumed_samples_; }
  const std::vector<double>& losses() const { return losses_; }

 private:
  Trainer(Config config, TrainerOptions options);
  Status init();
  void print_banner() const;

  Config config_;
  TrainerOptions options_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::optional<DataLoader> train_data_;
  std::optional<DataLoader> val_data_;
  MetricsWriter metrics_;
  std::vector<int32_t> inputs_;   // [micro_batch_size * seq_len]
  std::vector<int32_t> targets_;  // [micro_batch_size * seq_len]
  std::vector<double> losses_;    // per step, for tests
  int step_ = 0;
  uint64_t consumed_samples_ = 0;
  uint64_t num_train_samples_ = 0;
  double peak_flops_ = 0;
};

}  // namespace trident
