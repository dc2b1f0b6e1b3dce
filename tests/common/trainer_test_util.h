// A Trainer over the test world (tests/common/mpi_test_util.h) for the multi-rank tests
// that drive the training loop in-process: the options of tests/common/trainer_fixture.h
// (quiet, one thread per rank, a fixed peak, a fresh run), a checkpoint directory of its
// own (nothing is saved with interval 0 and save_final false, but two trainers alive at
// once may not share one: checkpoint/dir_lock.h) and no metrics file. Failures are
// reported as gtest failures and a null result.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/mpi_test_util.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident::test {

// The parallel: section of a test config for this layout and ZeRO stage (micro-batch 1).
// `extra`: more keys of the section (", sequence_parallel: true").
inline std::string parallel_yaml(const ParallelLayout& l, int zero_stage,
                                 const std::string& extra = "") {
  return "parallel: {dp: " + std::to_string(l.dp) + ", tp: " + std::to_string(l.tp) +
         ", pp: " + std::to_string(l.pp) +
         (l.cp > 1 ? ", cp: " + std::to_string(l.cp) : std::string()) +
         ", zero_stage: " + std::to_string(zero_stage) + ", micro_batch_size: 1" + extra + "}\n";
}

// "gpt2 dp2 tp1 pp1 zero3": a case's name in SCOPED_TRACE.
inline std::string case_name(const std::string& arch, const ParallelLayout& l, int zero_stage) {
  return arch + " dp" + std::to_string(l.dp) + " tp" + std::to_string(l.tp) + " pp" +
         std::to_string(l.pp) + (l.cp > 1 ? " cp" + std::to_string(l.cp) : std::string()) +
         " zero" + std::to_string(zero_stage);
}

// The model section of the per-step budget tests: a 2-layer gpt2 (tied, MHA) or llama
// (untied head, GQA 4:2) on 61 token ids.
inline std::string small_model_yaml(const std::string& arch, int n_layers = 2) {
  return testing::tiny_model_yaml(arch == "gpt2" ? Arch::kGpt2 : Arch::kLlama,
                                  {.vocab_size = 61, .seq_len = 16, .n_layers = n_layers,
                                   .d_model = 32});
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
  return testing::make_test_trainer(config.value(), testing::test_trainer_options(&world()));
}

}  // namespace trident::test
