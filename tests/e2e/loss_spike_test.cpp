// End-to-end test of the loss-spike guard (training.loss_spike_factor): a healthy run
// checkpoints every 5 steps (keep_last 2), then is resumed with training.lr = 1000,
// which diverges for real: the first step's update wrecks the weights, and the next
// loss is ~1e7, finite. The guard must stop the run with exit 1 and its message before
// any state at or after the spike is committed, so the healthy checkpoints survive
// retention and still verify. The reference comes from the window stored in the
// checkpoint: without it the guard would have no median right after the resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/reader.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

class LossSpike : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    ASSERT_TRUE(write_token_file(dir_->file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_->write("run.yaml",
                testing::cli_model_yaml() +
                "data: {train: " + dir_->file("train.bin") + "}\n"
                "parallel: {micro_batch_size: 2}\n"
                "training: {global_batch_size: 4, max_steps: 20, lr: 0.003, warmup_steps: 2}\n"
                "checkpoint: {dir: " + dir_->file("healthy") + ", interval: 5, keep_last: 2}\n"
                "logging: {metrics: \"\"}\n");
    healthy_ = new testing::CommandResult(
        run_command(testing::trident_binary() + " train --config " + dir_->file("run.yaml")));
  }
  static void TearDownTestSuite() {
    delete healthy_;
    delete dir_;
  }

  void SetUp() override {
    ASSERT_EQ(healthy_->exit_code, 0) << healthy_->output;
    ASSERT_EQ(committed(dir_->file("healthy")), (std::vector<int64_t>{15, 20}));
    root_ = dir_->file(::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::copy(dir_->file("healthy"), root_, fs::copy_options::recursive);
  }

  static std::vector<int64_t> committed(const std::string& root) {
    std::vector<int64_t> steps;
    for (const auto& [step, path] : list_steps(root)) steps.push_back(step);
    return steps;
  }

  // Resumes root_ from step 20 with a learning rate that diverges.
  testing::CommandResult diverge(const std::string& extra) {
    return run_command(testing::trident_binary() + " train --config " + dir_->file("run.yaml") +
                       " --set checkpoint.dir=" + root_ +
                       " --set training.max_steps=40 --set training.lr=1000"
                       " --set training.lr_schedule=constant --set training.warmup_steps=0 " +
                       extra);
  }

  void expect_stopped_at_22_with_healthy_checkpoints(const testing::CommandResult& r) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    // Step 21 (lr 1000 applied to the healthy step-20 weights) is the last sane loss.
    EXPECT_TRUE(std::regex_search(
        r.output,
        std::regex("error: loss [0-9.]+e\\+[0-9]+ at step 22 exceeds training.loss_spike_factor "
                   "10 x the median [0-9.]+ of the last 21 steps; stopping without saving so "
                   "the committed checkpoints \\(newest: step_20\\) stay those of the healthy "
                   "run; lower training.lr or raise training.loss_spike_factor")))
        << r.output;
    EXPECT_EQ(r.output.find("step 23/40"), std::string::npos) << r.output;
    EXPECT_EQ(committed(root_), (std::vector<int64_t>{15, 20})) << r.output;
    for (const char* step : {"/step_15", "/step_20"}) {
      auto v = run_command(testing::trident_binary() + " ckpt verify " + root_ + step);
      EXPECT_EQ(v.exit_code, 0) << v.output;
    }
  }

  static ScratchDir* dir_;
  static testing::CommandResult* healthy_;
  std::string root_;
};

// The fixture's model and batch, a constant LR, on `train`, checkpoints in `ckpt`.
std::string tiny_config(const std::string& train, const std::string& ckpt) {
  return testing::cli_model_yaml() +
         "data: {train: " + train + "}\n"
         "parallel: {micro_batch_size: 2}\n"
         "training: {global_batch_size: 4, lr_schedule: constant, warmup_steps: 2}\n"
         "checkpoint: {dir: " + ckpt + ", keep_last: 2}\n"
         "logging: {metrics: \"\"}\n";
}

ScratchDir* LossSpike::dir_ = nullptr;
testing::CommandResult* LossSpike::healthy_ = nullptr;

TEST_F(LossSpike, StopsBeforeTheNextIntervalSave) {
  auto r = diverge("");
  expect_stopped_at_22_with_healthy_checkpoints(r);
  // Deterministic: a second run stops at the same step with the same loss.
  fs::remove_all(root_);
  fs::copy(dir_->file("healthy"), root_, fs::copy_options::recursive);
  auto again = diverge("");
  EXPECT_EQ(again.output.substr(again.output.find("error: ")),
            r.output.substr(r.output.find("error: ")));
}

// A save every step: the async save of step 21 (the very weights whose loss spiked at
// step 22) is in flight when the guard fires, and must never commit; nor may a sync
// one, which the guard defers to the next boundary for this reason.
TEST_F(LossSpike, DropsTheSaveOfTheWeightsThatSpiked) {
  expect_stopped_at_22_with_healthy_checkpoints(diverge("--set checkpoint.interval=1"));
  fs::remove_all(root_);
  fs::copy(dir_->file("healthy"), root_, fs::copy_options::recursive);
  expect_stopped_at_22_with_healthy_checkpoints(
      diverge("--set checkpoint.interval=1 --set checkpoint.async=false"));
}

// What the guard prevents: the same divergence with the guard off commits diverged
// states and retention deletes the healthy ones — all but step_20, which this launch
// resumed from and which retention therefore keeps (docs/CHECKPOINTS.md, Retention).
TEST_F(LossSpike, WithoutTheGuardDivergedStatesRotateTheHealthyOnesOut) {
  auto r = diverge("--set checkpoint.interval=1 --set checkpoint.async=false"
                   " --set training.loss_spike_factor=0");
  const std::vector<int64_t> steps = committed(root_);
  ASSERT_GE(steps.size(), 2u) << r.output;
  EXPECT_EQ(steps.front(), 20) << r.output;
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_GT(steps[i], 22) << r.output;
}

// A run that diverges in its first steps, before the window has its 10 losses: the
// absolute bound (3 x ln(vocab_size)) stops it with exit 1 and commits no diverged state.
TEST(LossSpikeEarly, DivergenceAtTheFirstStepsStopsWithoutSaving) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
  dir.write("run.yaml", tiny_config(dir.file("train.bin"), dir.file("ckpt")));
  auto r = run_command(testing::trident_binary() + " train --config " + dir.file("run.yaml") +
                       " --set training.max_steps=10 --set training.lr=1000"
                       " --set training.warmup_steps=0 --set checkpoint.interval=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m,
      std::regex("error: loss [0-9.e+]+ at step ([23]) exceeds 3 x ln\\(model.vocab_size\\) = "
                 "16.6, the bound while the guard has fewer than 10 steps in its window; "
                 "stopping without saving")))
      << r.output;
  const int64_t spiked = std::stoll(m[1].str());
  // Neither the spiked step nor the one whose weights it was measured on is committed.
  for (const auto& [step, path] : list_steps(dir.file("ckpt"))) {
    EXPECT_LT(step, spiked - 1) << r.output;
  }
  EXPECT_EQ(r.output.find("step 4/10"), std::string::npos) << r.output;
}

// Resuming onto a different corpus whose loss level is far above the old one (a
// constant token, loss near 0, then English text): the old median is no reference, so
// the window restarts (and the log says so) and the continuation trains to its end.
TEST(LossSpikeEarly, ResumeOntoNewDataRestartsTheWindow) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("easy.bin"), std::vector<uint32_t>(20000, 97), 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("text.bin"), testing::english_bytes(20000), 1).is_ok());
  dir.write("run.yaml", tiny_config(dir.file("easy.bin"), dir.file("ckpt")));
  const std::string base = testing::trident_binary() + " train --config " + dir.file("run.yaml") +
                           " --set training.lr=0.01 --set checkpoint.interval=10";
  auto easy = run_command(base + " --set training.max_steps=30");
  ASSERT_EQ(easy.exit_code, 0) << easy.output;
  auto next = run_command(base + " --set training.max_steps=35 --set data.train=" +
                          dir.file("text.bin"));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_NE(next.output.find("resume: the training data changed, so the loss-spike guard's "
                             "window restarts"),
            std::string::npos)
      << next.output;
  const auto steps = list_steps(dir.file("ckpt"));
  ASSERT_FALSE(steps.empty()) << next.output;
  EXPECT_EQ(steps.back().first, 35) << next.output;
}

}  // namespace
}  // namespace trident
