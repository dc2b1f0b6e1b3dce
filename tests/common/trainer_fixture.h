// The Trainer of the in-process tests: quiet, one CPU thread, a fixed peak (no sgemm
// measurement at start) and a fresh run (resume none). A test states only what it
// changes (a world, a hook, another peak) on the options this returns; and the config of
// the small single-process trainer tests, the tiny model on the pattern tokens.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "tests/model/tiny_config.h"
#include "trainer/trainer.h"

namespace trident::testing {

// `world`: null for a single process (the trainer's own SelfCommunicator).
inline TrainerOptions test_trainer_options(Communicator* world = nullptr) {
  TrainerOptions options;
  options.world = world;
  options.resume = "none";
  options.quiet = true;
  options.peak_flops = 1e9;
  options.threads = 1;
  return options;
}

// A Trainer for `config`, or null after a gtest failure that says why.
inline std::unique_ptr<Trainer> make_test_trainer(Config config,
                                                  TrainerOptions options = test_trainer_options()) {
  auto trainer = Trainer::create(std::move(config), std::move(options));
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
  return trainer.is_ok() ? std::move(trainer).value() : nullptr;
}

// The model of the small trainer tests: the token ids of tests/common/pattern_tokens.h
// are below 200; 16 positions and width 32 keep a step a few milliseconds.
inline constexpr TinySize kTrainerModel{.vocab_size = 200, .seq_len = 16, .d_model = 32};

// Micro-batch 2, one micro-batch a step, 10 steps, on the token file `train`, checkpoints
// (if any) in `ckpt_dir`, no metrics file. Not validated: a test changes it first.
inline Config small_trainer_config(Arch arch, const std::string& train,
                                   const std::string& ckpt_dir) {
  Config c;
  c.model = tiny_model(arch, kTrainerModel);
  c.parallel.micro_batch_size = 2;
  c.training.global_batch_size = 2;
  c.training.max_steps = 10;
  c.data.train = train;
  c.checkpoint.dir = ckpt_dir;
  c.logging.metrics = "";
  return c;
}

}  // namespace trident::testing
