// A Trainer over the test world (tests/mpi/mpi_test_util.h) for the multi-rank tests
// that drive the training loop in-process: quiet, one thread per rank, a fixed peak (no
// sgemm measurement), a fresh run in a checkpoint directory of its own (nothing is saved
// with interval 0 and save_final false, but two trainers alive at once may not share one:
// checkpoint/dir_lock.h)
// and no metrics file. Failures are reported as gtest failures and a null result.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/mpi/mpi_test_util.h"
#include "trainer/trainer.h"

namespace trident::test {

// The parallel: section of a test config for this layout and ZeRO stage (micro-batch 1).
// `extra`: more keys of the section (", sequence_parallel: true").
inline std::string parallel_yaml(const ParallelLayout& l, int zero_stage,
                                 const std::string& extra = "") {
  return "parallel: {dp: " + std::to_string(l.dp) + ", tp: " + std::to_string(l.tp) +
         ", pp: " + std::to_string(l.pp) + ", zero_stage: " + std::to_string(zero_stage) +
         ", micro_batch_size: 1" + extra + "}\n";
}

// "gpt2 dp2 tp1 pp1 zero3": a case's name in SCOPED_TRACE.
inline std::string case_name(const std::string& arch, const ParallelLayout& l, int zero_stage) {
  return arch + " dp" + std::to_string(l.dp) + " tp" + std::to_string(l.tp) + " pp" +
         std::to_string(l.pp) + " zero" + std::to_string(zero_stage);
}

// The model section of the per-step budget tests: a 2-layer gpt2 (tied, MHA) or llama
// (untied head, GQA 4:2) on 61 token ids.
inline std::string small_model_yaml(const std::string& arch) {
  return "model: {arch: " + arch + ", vocab_size: 61, seq_len: 16, n_layers: 2, n_heads: 4, " +
         "n_kv_heads: " + (arch == "gpt2" ? "4" : "2") + ", d_model: 32}\n";
}

// `yaml` has no checkpoint or logging section; the checkpoint directory is
// `<dir_base>.ckpt<k>`, k counting the trainers made (the same on every rank).
inline std::unique_ptr<Trainer> make_world_trainer(const std::string& yaml,
                                                   const std::string& dir_base) {
  static int trainers = 0;
  auto config = parse_config(yaml + "checkpoint: {dir: " + dir_base + ".ckpt" +
                                 std::to_string(++trainers) +
                                 ", save_final: false}\nlogging: {metrics: ''}\n",
                             {});
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  if (!config.is_ok()) return nullptr;
  TrainerOptions options;
  options.world = &world();
  options.resume = "none";
  options.quiet = true;
  options.peak_flops = 1e9;
  options.threads = 1;
  auto trainer = Trainer::create(config.value(), options);
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
  return trainer.is_ok() ? std::move(trainer).value() : nullptr;
}

}  // namespace trident::test
