// End-to-end: the final checkpoint (docs/CONFIG.md `checkpoint.save_final`). A run that
// reaches training.max_steps commits step_<max_steps> whatever checkpoint.interval is
// (0, the default, included), synchronously before `trident train` exits 0, and that
// checkpoint resumes: 6 steps then 2 more end bitwise where 8 straight steps end.
// save_final: false leaves only the interval saves; a value that is not a bool exits 2
// naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/latest.h"
#include "checkpoint/reader.h"
#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

class FinalCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    // A constant LR after warmup: a cosine schedule depends on max_steps, so a 6-step run
    // would not be the first part of an 8-step one. No checkpoint.interval: the default.
    dir_.write("run.yaml",
               testing::tiny_model_yaml(Arch::kGpt2, {.seq_len = 16, .n_heads = 2, .d_model = 32}) +
               "parallel: {micro_batch_size: 2}\n"
               "data: {train: " + dir_.file("train.bin") + "}\n"
               "training: {global_batch_size: 2, lr: 0.003, warmup_steps: 2,"
               " lr_schedule: constant}\n");
  }

  // `trident train` for `steps` steps into <scratch>/<ckpt>, metrics <scratch>/<ckpt>.jsonl.
  CommandResult train(const std::string& ckpt, int steps, const std::string& flags = "") {
    return run_command(testing::trident_binary() + " train --config " + dir_.file("run.yaml") +
                       " --set training.max_steps=" + std::to_string(steps) +
                       " --set checkpoint.dir=" + dir_.file(ckpt) +
                       " --set logging.metrics=" + dir_.file(ckpt + ".jsonl") + " " + flags);
  }

  // The names in a checkpoint directory that are step directories (committed or not).
  std::vector<std::string> step_entries(const std::string& ckpt) {
    std::vector<std::string> names;
    if (!fs::exists(dir_.file(ckpt))) return names;
    for (const auto& e : fs::directory_iterator(dir_.file(ckpt))) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // The step `latest` names in <scratch>/<ckpt>, -1 when there is none.
  int64_t latest_step(const std::string& ckpt) {
    std::string problem;
    const auto latest = read_latest(dir_.file(ckpt), &problem);
    return latest ? latest->step : -1;
  }

  ScratchDir dir_;
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(FinalCheckpoint, TheDefaultRunCommitsItsLastStepAndItResumesBitwise) {
  CommandResult r = train("split", 6);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Saved once, synchronously: committed before the process exited.
  EXPECT_EQ(count(r.output, "checkpoint step 6:"), 1u) << r.output;
  EXPECT_NE(r.output.find("written and committed"), std::string::npos) << r.output;
  EXPECT_EQ(step_entries("split"), std::vector<std::string>{"step_6"});
  EXPECT_EQ(latest_step("split"), 6);
  const Status verified = verify_checkpoint(dir_.file("split/step_6"));
  EXPECT_TRUE(verified.is_ok()) << verified.message();

  // A launch with nothing left to train (max_steps already reached) saves nothing more.
  r = train("split", 6);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("checkpoint step"), std::string::npos) << r.output;
  EXPECT_EQ(step_entries("split"), std::vector<std::string>{"step_6"});

  // It resumes (--resume auto, the default) from step 6 and ends where 8 straight steps end.
  r = train("split", 8);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(latest_step("split"), 8);
  CommandResult straight = train("straight", 8);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_EQ(latest_step("straight"), 8);

  const auto split_losses = testing::metrics_losses(dir_.file("split.jsonl"));
  const auto straight_losses = testing::metrics_losses(dir_.file("straight.jsonl"));
  ASSERT_EQ(straight_losses.size(), 8u);
  for (int step : {7, 8}) {
    ASSERT_TRUE(split_losses.count(step)) << "no loss for step " << step;
    EXPECT_EQ(split_losses.at(step), straight_losses.at(step)) << "step " << step;
  }
  std::string error;
  const testing::TensorMap a = testing::read_all_tensors(dir_.file("split/step_8"), &error);
  ASSERT_TRUE(error.empty()) << error;
  const testing::TensorMap b = testing::read_all_tensors(dir_.file("straight/step_8"), &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, values] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(testing::bitwise_equal(values, b.at(name))) << name;
  }
}

TEST_F(FinalCheckpoint, AnIntervalStepAtTheEndIsSavedOnce) {
  CommandResult r = train("interval", 6, "--set checkpoint.interval=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "checkpoint step 6:"), 1u) << r.output;
  EXPECT_EQ(step_entries("interval"), (std::vector<std::string>{"step_3", "step_6"}));
  EXPECT_EQ(latest_step("interval"), 6);
}

TEST_F(FinalCheckpoint, SaveFinalFalseKeepsOnlyTheIntervalSaves) {
  // Interval 0: nothing at all is written, not even `latest`.
  CommandResult r = train("off", 6, "--set checkpoint.save_final=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("checkpoint step"), std::string::npos) << r.output;
  EXPECT_TRUE(step_entries("off").empty());
  EXPECT_FALSE(fs::exists(dir_.file("off/latest")));

  // Interval 4 of 6 steps: step 4 only; interval 3: step 6 is on the schedule.
  r = train("off4", 6, "--set checkpoint.save_final=false --set checkpoint.interval=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(step_entries("off4"), std::vector<std::string>{"step_4"});
  EXPECT_EQ(latest_step("off4"), 4);
  r = train("off3", 6, "--set checkpoint.save_final=false --set checkpoint.interval=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(step_entries("off3"), (std::vector<std::string>{"step_3", "step_6"}));
  EXPECT_EQ(latest_step("off3"), 6);
}

TEST_F(FinalCheckpoint, ANonBoolValueExits2NamingTheKey) {
  for (const char* value : {"maybe", "3"}) {
    SCOPED_TRACE(value);
    CommandResult r = train("bad", 6, std::string("--set checkpoint.save_final=") + value);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("checkpoint.save_final"), std::string::npos) << r.output;
    EXPECT_TRUE(step_entries("bad").empty());
  }
}

}  // namespace
}  // namespace trident
