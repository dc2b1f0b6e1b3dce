// End-to-end resume compatibility through the real binary (trainer/resume_compat.h): a
// tiny model trains 4 steps with checkpoints at steps 2 and 4, then resumes from step 2
// with one key changed:
//  - a different model (model.n_heads; model.vocab_size within the same padded size,
//    so every tensor shape still fits) is refused with exit 2, naming the key and both
//    values, on one rank and on two (every rank returns the same error);
//  - a changed training.lr or data.seed, or changed data, resumes (exit 0) with a
//    warning naming the key and the consequence;
//  - the checkpoint stores the data fingerprint as trainer state "data";
//  - a checkpoint whose AdamW moment is stored as bf16 (the format allows it, this trainer
//    keeps fp32 moments) is refused with exit 2 naming the tensor and both dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"

#include "checkpoint/writer.h"
#include "comm/communicator.h"

namespace trident {
namespace {

using testing::CommandResult;
using testing::run_command;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class ResumeCompatE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_.write("base.yaml",
               "model: {arch: gpt2, vocab_size: 256, seq_len: 16, n_layers: 2, n_heads: 4,"
               " d_model: 32}\n"
               "parallel: {micro_batch_size: 1}\n"
               "data: {train: " +
                   dir_.file("train.bin") +
                   "}\n"
                   "training: {global_batch_size: 4, lr: 0.003, max_steps: 4}\n"
                   "checkpoint: {dir: " +
                   dir_.file("ckpt") +
                   ", interval: 2, keep_last: 5}\n"
                   "logging: {log_interval: 1000, metrics: " +
                   dir_.file("metrics.jsonl") + "}\n");
    const CommandResult r = run_command(command("--resume none"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(std::filesystem::exists(dir_.file("ckpt/step_2/manifest.json"))) << r.output;
  }

  std::string command(const std::string& args, int ranks = 1) const {
    std::string cmd = "OMP_WAIT_POLICY=passive ";
    if (ranks > 1) {
      cmd += "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --timeout 60 -np " +
             std::to_string(ranks) + " ";
    }
    return cmd + testing::trident_binary() + " train --config " + dir_.file("base.yaml") + " " +
           args;
  }

  // Resumes from step 2 with `sets` ("--set k=v ...").
  CommandResult resume(const std::string& sets, int ranks = 1) const {
    return run_command(command("--resume " + dir_.file("ckpt/step_2") + " " + sets, ranks));
  }

  testing::ScratchDir dir_;
};

TEST_F(ResumeCompatE2e, RefusesAMomentStoredInAnotherDtype) {
  // step_2 rewritten as one rank's checkpoint with the same trainer state, but with the
  // first adam_m tensor stored as bf16.
  std::string error;
  const testing::TensorMap tensors = testing::read_all_tensors(dir_.file("ckpt/step_2"), &error);
  ASSERT_FALSE(tensors.empty()) << error;
  auto ckpt = open_checkpoint(dir_.file("ckpt/step_2"));
  ASSERT_TRUE(ckpt.is_ok());
  std::string bf16_tensor;
  std::vector<bf16_t> bf16_values;
  std::vector<BoxRef> boxes;
  for (const auto& [name, values] : tensors) {
    const std::vector<int64_t> shape = ckpt->shape(name).value();
    BoxRef box{name, shape, std::vector<int64_t>(shape.size(), 0), shape, values.data()};
    if (bf16_tensor.empty() && name.starts_with("adam_m/")) {
      bf16_tensor = name;
      for (float v : values) bf16_values.push_back(float_to_bf16(v));
      box.data = bf16_values.data();
    }
    boxes.push_back(box);
  }
  ASSERT_FALSE(bf16_tensor.empty());
  SelfCommunicator self;
  CheckpointWriterOptions options;
  options.dir = dir_.file("bf16");
  CheckpointWriter writer(options);
  ASSERT_TRUE(writer.save(2, boxes, ckpt->trainer_state(), self, false).is_ok());

  const CommandResult r =
      run_command(command("--resume " + dir_.file("bf16/step_2")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "tensor '" + bf16_tensor +
                                     "' is bf16 in the checkpoint, but the destination is f32"))
      << r.output;
}

TEST_F(ResumeCompatE2e, RefusesADifferentNumberOfHeads) {
  // d_model 32 with 8 heads has the same qkv shapes as with 4: only the config can tell.
  const CommandResult r = resume("--set model.n_heads=8");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "error: cannot resume from " + dir_.file("ckpt/step_2") +
                                     ": model.n_heads: the checkpoint was trained with 4, the "
                                     "config says 8 (a different model"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from")) << r.output;
}

TEST_F(ResumeCompatE2e, RefusesADifferentVocabularyOfTheSamePaddedSize) {
  // 200 and 256 both pad to 256 rows: every tensor loads, the model is still another.
  const CommandResult r = resume("--set model.vocab_size=200");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "model.vocab_size: the checkpoint was trained with 256, the "
                       "config says 200 (a different model"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from")) << r.output;
}

TEST_F(ResumeCompatE2e, EveryRankRefusesAlike) {
  if (run_command("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not found";
  const CommandResult r = resume("--set model.n_heads=8 --set parallel.dp=2", 2);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Rank 0 prints a config error once; rank 1 returned the same error silently (had it
  // gone on, it would have hung in the checkpoint load or been named by mpirun).
  EXPECT_EQ(count(r.output, "model.n_heads: the checkpoint was trained with 4, the config says 8"),
            1)
      << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from")) << r.output;
}

TEST_F(ResumeCompatE2e, WarnsAboutAChangedLearningRate) {
  const CommandResult r = resume("--set training.lr=0.001");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "warning: resume: training.lr: the checkpoint was trained with "
                       "0.003, the config says 0.001: the LR schedule is a function of "
                       "training.max_steps"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "from step 2 the curve follows the new one")) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from")) << r.output;
  EXPECT_EQ(testing::metrics_losses(dir_.file("metrics.jsonl")).count(4), 1u);
}

TEST_F(ResumeCompatE2e, WarnsAboutAChangedDataSeed) {
  const CommandResult r = resume("--set data.seed=7");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "warning: resume: data.seed: the checkpoint was trained with "
                       "1234, the config says 7: the global sample order changes, so "
                       "the samples after the resume point (step 2) are not the ones "
                       "the old order would have given"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from")) << r.output;
}

TEST_F(ResumeCompatE2e, WarnsWhenTheDataChanged) {
  // Same size, other content: only the content hash can tell.
  std::vector<uint32_t> tokens = testing::english_bytes(20000);
  std::reverse(tokens.begin(), tokens.end());
  ASSERT_TRUE(write_token_file(dir_.file("train.bin"), tokens, 1).is_ok());
  const CommandResult r = resume("");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: resume: data file " + dir_.file("train.bin") +
                                     " changed since the checkpoint (content hash "))
      << r.output;
}

TEST_F(ResumeCompatE2e, AnUnchangedResumeSaysNothing) {
  const CommandResult r = resume("");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "resume: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from")) << r.output;
}

TEST_F(ResumeCompatE2e, StoresTheDataFingerprint) {
  const nlohmann::json state = testing::checkpoint_trainer_state(dir_.file("ckpt/step_2"));
  ASSERT_TRUE(state.contains("data")) << state.dump();
  const nlohmann::json& data = state["data"];
  EXPECT_EQ(data.value("spec", ""), dir_.file("train.bin"));
  EXPECT_EQ(data.value("total_tokens", uint64_t{0}), testing::english_bytes(20000).size());
  EXPECT_EQ(data.value("seed", uint64_t{0}), 1234u);
  EXPECT_EQ(data.value("shuffle", false), true);
  ASSERT_TRUE(data.contains("files") && data["files"].size() == 1u) << data.dump();
  const nlohmann::json& file = data["files"][0];
  EXPECT_EQ(file.value("path", ""), dir_.file("train.bin"));
  EXPECT_EQ(file.value("bytes", uint64_t{0}), std::filesystem::file_size(dir_.file("train.bin")));
  EXPECT_EQ(file.value("content_hash", "").size(), 16u) << file.dump();
}

}  // namespace
}  // namespace trident
