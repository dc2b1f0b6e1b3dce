// training.precision end to end (docs/ARCHITECTURE.md "Memory, dtypes and streams"): bf16 mixed
// precision tracks the fp32 run of the same model and data, really rounds, resumes
// bitwise, and crosses precisions through its fp32 checkpoints.
//
// The models are the architectures of configs/tiny.yaml (gpt2) and configs/tiny_llama.yaml
// (llama: GQA, SwiGLU, RoPE, untied head) at their full size, trained for 200 steps as
// the issue asks, but on 4 sequences of 64 tokens per step instead of 16 of 128, so that
// the four runs fit the suite's time budget on 2 cores. At that batch the gpt2 config's
// peak lr of 3e-3 is past the edge of stability in fp32 too (measured on English text:
// fp32 spiked to
// loss 6.8, grad norm 13 at step 35; bf16 at step 32), so both models run at the
// llama config's lr 1e-3 -> 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "core/rng.h"
#include "data/token_file.h"
#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::run_command;

class Precision : public ::testing::Test {
 public:
  void SetUp() override {
    // A fixed random bigram source over 64 byte values, each followed by one of 6
    // successors with skewed weights (entropy ~1.5 nats): the models learn it rather than
    // memorise it (repeated text would drive both losses towards 0, where a relative
    // comparison means nothing), and it never changes with the repository's files.
    const uint64_t key = rng_key(2026, 12);
    std::vector<uint32_t> tokens(120000);
    uint32_t x = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const double u = uniform_at(key, 2 * t);
      const int pick = u < 0.4 ? 0 : u < 0.65 ? 1 : u < 0.8 ? 2 : u < 0.9 ? 3 : u < 0.96 ? 4 : 5;
      x = static_cast<uint32_t>(uniform_int_at(rng_key(x, 99), static_cast<uint64_t>(pick), 64)) +
          32;
      tokens[t] = x;
    }
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), tokens, 1).is_ok());
  }

  // A run of `config` (a file under configs/) in `precision`; returns the exit status.
  testing::CommandResult train(const std::string& config, const std::string& precision,
                               const std::string& name, int steps, int interval = 0,
                               const std::string& resume = "none") {
    const std::string cmd =
        "OMP_WAIT_POLICY=passive " + testing::trident_binary() + " train --config " +
        std::string(TRIDENT_SOURCE_DIR) + "/configs/" + config + " --resume " + resume +
        " --set data.train=" + dir_.file("train.bin") +
        " --set data.val= --set training.eval_interval=0"
        " --set model.seq_len=64 --set parallel.micro_batch_size=4"
        " --set training.global_batch_size=4 --set training.lr=1e-3 --set training.min_lr=1e-4"
        " --set training.max_steps=" +
        std::to_string(steps) + " --set training.precision=" + precision +
        " --set checkpoint.interval=" + std::to_string(interval) +
        " --set checkpoint.dir=" + dir_.file(name + ".ckpt") +
        " --set logging.metrics=" + dir_.file(name + ".jsonl") + " --set logging.log_interval=50";
    return run_command(cmd);
  }
  std::map<int, std::string> losses(const std::string& name) const {
    return testing::metrics_losses(dir_.file(name + ".jsonl"));
  }
  std::string ckpt(const std::string& name) const { return dir_.file(name + ".ckpt"); }

  testing::ScratchDir dir_;
};

// bf16 against fp32 on one model: the final loss within 2%, no step after warm-up above
// the fp32 one by more than 0.1 nats, and not bitwise equal (bf16 really rounds).
void expect_bf16_tracks_fp32(Precision& t, const std::string& config) {
  SCOPED_TRACE(config);
  constexpr int kSteps = 200, kWarmup = 20;  // warmup_steps of both tiny configs
  auto fp32 = t.train(config, "fp32", config + ".fp32", kSteps);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  auto bf16 = t.train(config, "bf16", config + ".bf16", kSteps);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto a = t.losses(config + ".fp32"), b = t.losses(config + ".bf16");
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
  int differ = 0;
  double worst = -1e9;
  for (int s = 1; s <= kSteps; ++s) {
    const double la = std::stod(a.at(s)), lb = std::stod(b.at(s));
    differ += a.at(s) != b.at(s);
    if (s > kWarmup) {
      worst = std::max(worst, lb - la);
      EXPECT_LE(lb, la + 0.1) << "step " << s << ": bf16 " << lb << ", fp32 " << la;
    }
  }
  const double fa = std::stod(a.at(kSteps)), fb = std::stod(b.at(kSteps));
  EXPECT_LE(std::abs(fb - fa), 0.02 * fa) << "final loss: bf16 " << fb << ", fp32 " << fa;
  EXPECT_GT(differ, kSteps / 2) << "bf16 losses equal the fp32 ones: nothing was rounded";
  std::printf("%s: final loss fp32 %.4f bf16 %.4f (%+.2f%%), worst step excess %.4f, "
              "%d/%d steps differ\n",
              config.c_str(), fa, fb, 100 * (fb - fa) / fa, worst, differ, kSteps);
}

TEST_F(Precision, Bf16TracksFp32OnTinyGpt2) { expect_bf16_tracks_fp32(*this, "tiny.yaml"); }
TEST_F(Precision, Bf16TracksFp32OnTinyLlama) {
  expect_bf16_tracks_fp32(*this, "tiny_llama.yaml");
}

// Stop at step 6 and resume to 12 in bf16: the losses and the checkpointed masters and
// moments equal those of the uninterrupted bf16 run bit for bit.
TEST_F(Precision, Bf16ResumeIsBitwise) {
  auto straight = train("tiny_llama.yaml", "bf16", "straight", 12, 6);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto first = train("tiny_llama.yaml", "bf16", "split", 6, 6);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train("tiny_llama.yaml", "bf16", "split", 12, 6, "auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(losses("straight"), losses("split"));
  std::string error;
  const auto a = testing::read_all_tensors(ckpt("straight") + "/step_12", &error);
  ASSERT_TRUE(error.empty()) << error;
  const auto b = testing::read_all_tensors(ckpt("split") + "/step_12", &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed bf16 run's state differs from the straight run's";
}

// Checkpoints hold fp32 masters and moments in either precision (the manifest says
// f32), so a run continues in the other precision, with a warning that says so.
TEST_F(Precision, CheckpointsCrossPrecisions) {
  auto fp32 = train("tiny.yaml", "fp32", "cross", 4, 4);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  auto opened = open_checkpoint(ckpt("cross") + "/step_4");
  ASSERT_TRUE(opened.is_ok()) << opened.status().message();
  for (const auto& [name, tensor] : opened.value().manifest().tensors) {
    EXPECT_EQ(tensor.dtype, DType::kF32) << name;
  }
  auto bf16 = train("tiny.yaml", "bf16", "cross", 8, 4, "auto");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("training.precision"), std::string::npos) << bf16.output;
  auto back = train("tiny.yaml", "fp32", "cross", 12, 4, "auto");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  const auto l = losses("cross");
  ASSERT_EQ(l.size(), 12u);
  // The bf16 steps continue the fp32 run's trajectory (a loss near step 4's, not a
  // fresh start's ~5.5 nats).
  EXPECT_LT(std::stod(l.at(5)), std::stod(l.at(1)));
}

TEST_F(Precision, BadValueExits2NamingTheKey) {
  auto r = train("tiny.yaml", "fp8", "bad", 1);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("training.precision: expected one of fp32, bf16; got 'fp8'"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace trident
