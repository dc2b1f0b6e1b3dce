// The training configuration: every YAML key of docs/CONFIG.md with its default. Strict:
// an unknown key, a value of the wrong type or an impossible value is an error whose
// message names the key ("training.lr: expected a number, got 'abc'") and exits 2.
// docs/CONFIG.md documents every key.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/parallel_layout.h"
#include "core/status.h"
#include "data/blend.h"
#include "kernels/backend.h"
#include "model/model_config.h"
#include "parallel/pipeline.h"

namespace trident {

enum class LrSchedule { kConstant, kCosine, kLinear };
// training.precision (docs/ARCHITECTURE.md "Memory, dtypes and streams"): fp32, or bf16 compute
// weights and activations over fp32 masters, gradients and AdamW moments.
enum class Precision { kFp32, kBf16 };

// The layout's degrees and choices (comm/parallel_layout.h: dp, cp, tp, pp, virtual_stages,
// zero_stage, sequence_parallel; ep has no key yet) are the base, so that
// config.parallel.dp reads as before and a ParallelConfig is a ParallelLayout wherever
// the layers below take one; the rest is how the trainer runs that layout.
struct ParallelConfig : ParallelLayout {
  int micro_batch_size = 4;          // sequences per micro-batch per rank
  PipeSchedule pipeline_schedule = PipeSchedule::kOneFOneB;
  std::vector<int> stage_layers;     // layers per stage; empty = balanced
  int bucket_mb = 25;                // gradient reduction bucket size (MiB)
  // Gradient reduction issued asynchronously during backward (parallel/data_parallel.h
  // "Overlap"); bitwise the same results as false.
  bool overlap_grad_reduce = true;
  // ZeRO-3: each group's all-gather prefetched one ahead; bitwise the same results.
  bool overlap_param_gather = true;
  int comm_timeout_s = 600;          // a collective blocked longer ends the job (watchdog)
};

// Where the run computes (docs/CONFIG.md "runtime").
// runtime.threads may be at most max(kMinThreadsLimit, kMaxThreadsPerCore * cores).
inline constexpr int kMaxThreadsPerCore = 4;
inline constexpr int kMinThreadsLimit = 256;

struct RuntimeConfig {
  DeviceKind device = DeviceKind::kAuto;  // auto = cuda when built and a GPU is visible, else cpu
  int threads = 0;  // CPU threads per rank; 0 = the machine's cores / ranks per node
  float peak_tflops = 0;  // per device, the MFU denominator; 0 = Ops::peak_flops()
};

struct DataConfig {
  // data.train is either one spec (file, glob, directory or Megatron prefix; data/dataset.h)
  // in `train`, or a blend (a YAML list of {path, weight}; data/blend.h) in `train_blend`
  // with `train` empty.
  std::string train;
  std::vector<BlendSource> train_blend;
  std::string val;    // same; empty = no validation
  bool shuffle = true;
  uint64_t seed = 1234;
};

struct TrainingConfig {
  int global_batch_size = 8;  // sequences per optimizer step = micro_batch_size * accum * dp
  int max_steps = 100;
  float lr = 3e-4f;
  float min_lr = 0.0f;
  int warmup_steps = 0;
  LrSchedule lr_schedule = LrSchedule::kCosine;
  Precision precision = Precision::kFp32;
  Recompute recompute = Recompute::kNone;
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // 0 = off
  uint64_t seed = 42;
  int eval_interval = 0;   // 0 = off
  int eval_batches = 4;
  // Stop when a step's loss exceeds factor x the median of the last `window` losses,
  // before that state can be checkpointed (trainer/loss_guard.h); 0 = off.
  float loss_spike_factor = 10.0f;
  int loss_spike_window = 50;
  // Mixture of experts (model/transformer.h): the coefficients of the load-balancing loss
  // and of the router z-loss in the objective.
  float moe_aux_loss_coef = 0.01f;
  float moe_z_loss_coef = 0.0f;
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int interval = 0;  // 0 = off
  int keep_last = 3;
  bool async = true;
  // Save the state after training.max_steps whatever the interval (a run's end is what a
  // user goes on from, exports or evaluates); false = interval saves and stop signals only.
  bool save_final = true;
};

struct LoggingConfig {
  std::string metrics = "metrics.jsonl";  // JSONL file; empty = none
  int log_interval = 1;
  // Straggler warning (trainer/straggler.h): a rank whose busy time (step time minus the
  // time blocked in communication) exceeds this many times the median rank's in at least
  // half of a window of straggler_window steps is named, with its host, once per window;
  // 0 = no warning (the metrics file records the slowest rank either way).
  float straggler_factor = 2.0f;
  int straggler_window = 20;
};

struct Config {
  TransformerConfig model;
  ParallelConfig parallel;
  RuntimeConfig runtime;
  DataConfig data;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  LoggingConfig logging;

  // Micro-batches per optimizer step on each data-parallel rank.
  int grad_accum_steps() const {
    return training.global_batch_size / (parallel.micro_batch_size * parallel.dp);
  }
};

// Loads `path`, applies `overrides` ("section.key=value", YAML value syntax) in order,
// finalizes the model config and validates everything. Errors name the file and key;
// a missing, unreadable or directory `path` is an invalid_input error (exit 2).
Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides);
// Same, from YAML text (tests).
Result<Config> parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                            const std::string& source_name = "<string>");
// Validates cross-section constraints (batch divisibility, layout vs heads, ...).
Status validate_config(const Config& config);
// The config as YAML (printed at start-up, stored in checkpoints); parse_config of
// the result gives back an equal Config.
std::string config_to_yaml(const Config& config);
// Every key of the field table as ("section.key", value as config_to_yaml prints it), in
// table order: compares two configs key by key without listing the keys again.
std::vector<std::pair<std::string, std::string>> config_values(const Config& config);

// data.train as config_to_yaml prints it, unquoted for a plain spec ("data/train_*.bin")
// and as a flow list for a blend ("[{path: \"a\", weight: 0.7}, {path: \"b\", weight: 0.3}]").
std::string data_train_text(const DataConfig& data);

const char* lr_schedule_name(LrSchedule s);
const char* precision_name(Precision p);  // "fp32", "bf16"

}  // namespace trident
