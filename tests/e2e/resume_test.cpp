// End-to-end resume through the real binary (docs/CHECKPOINTS.md "Resume"):
//  - exact resume: 20 steps straight vs 10 steps, stop, resume, 10 more gives bitwise
//    identical per-step losses and final parameters and AdamW moments, in one process
//    and at dp=2 tp=2 pp=2 ZeRO-3 on 8 ranks;
//  - resharding: a 2x2x2 ZeRO-3 checkpoint resumed at 1x1x1, 4x1x2 ZeRO-1 and 1x2x4
//    ZeRO-0 continues the original layout's trajectory within fp32 rounding; so do a
//    cp 2 ZeRO-1 checkpoint resumed at cp 1 and a cp 1 one resumed at cp 4;
//  - signals: SIGUSR1 to one rank stops every rank at a step boundary with a committed,
//    verifiable checkpoint and exit code 3; resuming reproduces the uninterrupted run
//    bitwise.
//
// The LR schedule of the stop/resume tests is constant after warmup: a cosine schedule
// is defined by training.max_steps, so a 10-step run is not the first half of a 20-step
// run. The signal tests keep max_steps fixed and use the default cosine schedule.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <thread>

#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;
using testing::TensorMap;

constexpr double kLr = 0.003;

struct RunLayout {
  int dp = 1, tp = 1, pp = 1, zero_stage = 0, cp = 1;
  int ranks() const { return dp * cp * tp * pp; }
  std::string name() const {
    return std::to_string(dp) + "x" + std::to_string(tp) + "x" + std::to_string(pp) + " zero" +
           std::to_string(zero_stage) + (cp > 1 ? " cp" + std::to_string(cp) : "");
  }
};

const RunLayout kSingle{};
const RunLayout k2x2x2Zero3{2, 2, 2, 3};

// One `trident train` invocation. Checkpoints go to <scratch>/<ckpt>, metrics to
// <scratch>/<metrics>.jsonl.
struct TrainRun {
  std::string ckpt;
  std::string metrics;
  RunLayout layout;
  int max_steps = 20;
  int interval = 10;
  std::string resume = "none";
  std::string lr_schedule = "constant";
};

bool have_mpirun() { return run_command("command -v mpirun").exit_code == 0; }

class Resume : public ::testing::Test {
 public:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_.write("base.yaml",
               "model: {arch: gpt2, vocab_size: 256, seq_len: 16, n_layers: 4, n_heads: 4,"
               " d_model: 32}\n"
               "parallel: {micro_batch_size: 1}\n"
               "data: {train: " + dir_.file("train.bin") + "}\n"
               "training: {global_batch_size: 8, lr: 0.003, warmup_steps: 2, weight_decay: 0.1,"
               " grad_clip: 1.0}\n"
               "checkpoint: {keep_last: 10}\n"
               "logging: {log_interval: 1000}\n");
  }

  std::string ckpt(const std::string& name) const { return dir_.file(name); }
  std::string metrics(const std::string& name) const { return dir_.file(name + ".jsonl"); }

  std::string command(const TrainRun& r) const {
    // Passive OpenMP waits: spinning threads make a run several times slower on a
    // machine with more busy processes than cores (the numerics are unaffected).
    std::string cmd = "OMP_WAIT_POLICY=passive ";
    if (r.layout.ranks() > 1) {
      // --timeout: mpirun itself takes down every rank of a job that hangs.
      cmd += "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --timeout 120 -np " +
            std::to_string(r.layout.ranks()) + " ";
    }
    const RunLayout& l = r.layout;
    return cmd + testing::trident_binary() + " train --config " + dir_.file("base.yaml") +
           " --resume " + r.resume + " --set parallel.dp=" + std::to_string(l.dp) +
           " --set parallel.tp=" + std::to_string(l.tp) + " --set parallel.pp=" +
           std::to_string(l.pp) + " --set parallel.cp=" + std::to_string(l.cp) +
           " --set parallel.zero_stage=" + std::to_string(l.zero_stage) +
           " --set training.max_steps=" + std::to_string(r.max_steps) +
           " --set training.lr_schedule=" + r.lr_schedule +
           " --set checkpoint.interval=" + std::to_string(r.interval) +
           " --set checkpoint.dir=" + ckpt(r.ckpt) + " --set logging.metrics=" + metrics(r.metrics);
  }

  CommandResult train(const TrainRun& r) const { return run_command(command(r)); }

  TensorMap tensors(const std::string& step_dir) const {
    std::string error;
    TensorMap t = testing::read_all_tensors(step_dir, &error);
    EXPECT_TRUE(error.empty()) << step_dir << ": " << error;
    return t;
  }

  ScratchDir dir_;  // public: the check_* helpers below drive the fixture
};

// The per-kind counts of a checkpoint's tensors ("param", "adam_m", "adam_v").
std::map<std::string, int> kinds(const TensorMap& t) {
  std::map<std::string, int> out;
  for (const auto& [name, values] : t) ++out[name.substr(0, name.find('/'))];
  return out;
}

// Every tensor of `got` has exactly the bits of the same tensor of `want`.
void expect_bitwise_equal(const TensorMap& got, const TensorMap& want) {
  ASSERT_FALSE(want.empty());
  const std::map<std::string, int> k = kinds(want);
  EXPECT_GT(k.count("param") ? k.at("param") : 0, 10);
  EXPECT_EQ(k.count("param") ? k.at("param") : -1, k.count("adam_m") ? k.at("adam_m") : -2);
  EXPECT_EQ(k.count("param") ? k.at("param") : -1, k.count("adam_v") ? k.at("adam_v") : -2);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(testing::bitwise_equal(it->second, values))
        << name << " differs (relative distance " << testing::relative_distance(it->second, values)
        << ")";
  }
}

// The losses of steps [from, to] in one metrics file (step -> exact text).
std::map<int, std::string> losses(const std::string& path, int from, int to) {
  std::map<int, std::string> out;
  for (const auto& [step, loss] : testing::metrics_losses(path)) {
    if (step >= from && step <= to) out[step] = loss;
  }
  return out;
}

// ---- 1. Exact resume -------------------------------------------------------------

void check_exact_resume(Resume& t, const RunLayout& layout) {
  SCOPED_TRACE(layout.name());
  CommandResult r = t.train({"straight", "straight", layout, 20, 10});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = t.train({"split", "split_first", layout, 10, 5});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(t.ckpt("split") + "/step_5/manifest.json"));
  ASSERT_TRUE(fs::exists(t.ckpt("split") + "/step_10/manifest.json"));
  r = t.train({"split", "split_second", layout, 20, 5, "auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + t.ckpt("split") + "/step_10 (step 10, 80 samples"),
            std::string::npos)
      << r.output;

  // Losses: the first run wrote steps 1-10, the resumed one exactly steps 11-20.
  const auto straight = losses(t.metrics("straight"), 1, 20);
  ASSERT_EQ(straight.size(), 20u);
  const auto first = testing::metrics_losses(t.metrics("split_first"));
  const auto second = testing::metrics_losses(t.metrics("split_second"));
  ASSERT_EQ(first.size(), 10u);
  ASSERT_EQ(second.size(), 10u);
  EXPECT_EQ(second.begin()->first, 11);
  for (int s = 1; s <= 20; ++s) {
    const auto& got = s <= 10 ? first : second;
    ASSERT_TRUE(got.count(s)) << "step " << s;
    EXPECT_EQ(got.at(s), straight.at(s)) << "step " << s;
  }
  EXPECT_NE(straight.at(11), straight.at(20));  // it trained on

  // Final parameters and AdamW moments, every bit.
  const TensorMap want = t.tensors(t.ckpt("straight") + "/step_20");
  const TensorMap got = t.tensors(t.ckpt("split") + "/step_20");
  expect_bitwise_equal(got, want);
  const TensorMap mid = t.tensors(t.ckpt("split") + "/step_10");
  EXPECT_FALSE(testing::bitwise_equal(mid.at("param/wte"), want.at("param/wte")));
  const nlohmann::json state = testing::checkpoint_trainer_state(t.ckpt("split") + "/step_20");
  EXPECT_EQ(state.value("step", -1), 20) << state.dump();
  EXPECT_EQ(state.value("consumed_samples", -1), 160) << state.dump();
  EXPECT_EQ(state.value("optimizer_steps", -1), 20) << state.dump();
}

TEST_F(Resume, ExactSingleProcess) { check_exact_resume(*this, kSingle); }

TEST_F(Resume, Exact2x2x2Zero3On8Ranks) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  check_exact_resume(*this, k2x2x2Zero3);
}

// ---- 2. Resharding -----------------------------------------------------------------

// Continued losses within 1e-5 relative per step; final parameters within 1e-5 in
// norm over the model and 1e-4 per tensor (see tests/trainer/equivalence_mpi_test.cpp: AdamW
// turns summation-order noise in near-zero gradient elements into lr-sized steps, and
// attn.k.bias, whose true gradient is zero, is bounded only by AdamW's largest move).
void expect_close(Resume& t, const std::string& name, const std::string& ref_name) {
  SCOPED_TRACE(name);
  const auto want = losses(t.metrics(ref_name), 11, 20);
  const auto got = testing::metrics_losses(t.metrics(name));
  ASSERT_EQ(want.size(), 10u);
  ASSERT_EQ(got.size(), 10u);
  for (const auto& [step, text] : want) {
    ASSERT_TRUE(got.count(step)) << "step " << step;
    const double w = std::stod(text), g = std::stod(got.at(step));
    EXPECT_NEAR(g, w, 1e-5 * std::fabs(w)) << "step " << step;
  }
  const TensorMap ref = t.tensors(t.ckpt(ref_name) + "/step_20");
  const TensorMap out = t.tensors(t.ckpt(name) + "/step_20");
  ASSERT_EQ(out.size(), ref.size());
  double num = 0, den = 0;
  for (const auto& [tensor, values] : ref) {
    auto it = out.find(tensor);
    ASSERT_NE(it, out.end()) << tensor;
    ASSERT_EQ(it->second.size(), values.size()) << tensor;
    if (tensor.rfind("param/", 0) != 0) continue;
    if (tensor.find("attn.k.bias") != std::string::npos) {
      for (size_t i = 0; i < values.size(); ++i) {
        EXPECT_LE(std::fabs(it->second[i] - values[i]), 2 * kLr * 10) << tensor;
      }
      continue;
    }
    EXPECT_LT(testing::relative_distance(it->second, values), 1e-4) << tensor;
    for (size_t i = 0; i < values.size(); ++i) {
      num += (double(it->second[i]) - values[i]) * (double(it->second[i]) - values[i]);
      den += double(values[i]) * values[i];
    }
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5) << "all parameters";
  // The AdamW moments follow the same trajectory (observed ~1e-7 for this model).
  double max_loss = 0;
  for (const auto& [step, text] : want) {
    const double w = std::stod(text);
    max_loss = std::max(max_loss, std::fabs(std::stod(got.at(step)) - w) / std::fabs(w));
  }
  auto model_distance = [&](const std::string& kind) {
    double n = 0, d = 0;
    for (const auto& [tensor, values] : ref) {
      if (tensor.rfind(kind + "/", 0) != 0) continue;
      const std::vector<float>& o = out.at(tensor);
      for (size_t i = 0; i < values.size(); ++i) {
        n += (double(o[i]) - values[i]) * (double(o[i]) - values[i]);
        d += double(values[i]) * values[i];
      }
    }
    return std::sqrt(n / d);
  };
  EXPECT_LT(model_distance("adam_m"), 1e-5) << "all first moments";
  EXPECT_LT(model_distance("adam_v"), 1e-5) << "all second moments";
  std::printf("[ info ] %s vs %s: max loss rel diff %.2e, params %.2e, adam_m %.2e, adam_v %.2e\n",
              name.c_str(), ref_name.c_str(), max_loss, std::sqrt(num / den),
              model_distance("adam_m"), model_distance("adam_v"));
}

TEST_F(Resume, Reshard2x2x2Zero3To1x1x1And4x1x2And1x2x4) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  CommandResult r = train({"src", "src", k2x2x2Zero3, 10, 10});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string src = ckpt("src");
  ASSERT_TRUE(fs::exists(src + "/step_10/manifest.json"));
  const std::string saved_by = "saved by dp=2 tp=2 pp=2 zero_stage=3";

  // The reference: the original layout continues (auto, on a copy of the checkpoints).
  fs::copy(src, ckpt("ref"), fs::copy_options::recursive);
  r = train({"ref", "ref", k2x2x2Zero3, 20, 10, "auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(saved_by), std::string::npos) << r.output;

  // One process (auto, on a copy of the checkpoints).
  fs::copy(src, ckpt("single"), fs::copy_options::recursive);
  r = train({"single", "single", kSingle, 20, 10, "auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(saved_by), std::string::npos) << r.output;
  expect_close(*this, "single", "ref");

  // dp=4 pp=2 ZeRO-1 (--resume the checkpoint root: its `latest`).
  r = train({"dp4", "dp4", RunLayout{4, 1, 2, 1}, 20, 10, src});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + src + "/step_10"), std::string::npos) << r.output;
  expect_close(*this, "dp4", "ref");

  // tp=2 pp=4 ZeRO-0 (--resume the step directory).
  r = train({"pp4", "pp4", RunLayout{1, 2, 4, 0}, 20, 10, src + "/step_10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(saved_by), std::string::npos) << r.output;
  expect_close(*this, "pp4", "ref");
}

// Context parallelism: the dp x cp store's boxes reshard like dp's. A cp 2 ZeRO-1
// checkpoint continues at cp 1, and a cp 1 checkpoint at cp 4 (ZeRO-0), both along the
// cp 2 run's own continuation.
TEST_F(Resume, ReshardAcrossContextParallelism2To1And1To4) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const RunLayout cp2{1, 1, 1, 1, 2};
  CommandResult r = train({"src", "src", cp2, 10, 10});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string src = ckpt("src");
  ASSERT_TRUE(fs::exists(src + "/step_10/manifest.json"));
  fs::copy(src, ckpt("ref"), fs::copy_options::recursive);
  r = train({"ref", "ref", cp2, 20, 10, "auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  r = train({"cp1", "cp1", kSingle, 20, 10, src + "/step_10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("saved by dp=1 cp=2 tp=1 pp=1 zero_stage=1"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("parallel.cp"), std::string::npos) << r.output;  // the resharding
  expect_close(*this, "cp1", "ref");

  r = train({"one", "one", kSingle, 10, 10});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train({"cp4", "cp4", RunLayout{1, 1, 1, 0, 4}, 20, 10, ckpt("one") + "/step_10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_close(*this, "cp4", "ref");
}

// ---- 3. Signals --------------------------------------------------------------------

void check_signal_stop(Resume& t, const RunLayout& layout) {
  SCOPED_TRACE(layout.name());
  // Enough steps that the run cannot end between the poll below and the signal.
  const int total_steps = layout.ranks() > 1 ? 60 : 150;
  // The uninterrupted run; interval > max_steps saves only the final step.
  CommandResult r = t.train({"full", "full", layout, total_steps, 1000, "none", "cosine"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The stopped run: no scheduled checkpoints at all.
  const TrainRun stopped{"stopped", "stopped", layout, total_steps, 0, "none", "cosine"};
  CommandResult stopped_result;
  std::thread runner([&] { stopped_result = t.train(stopped); });
  // Signal one rank (the last one found) once a few steps are done: by then every rank
  // has installed its handlers (a step is collective over all of them).
  std::vector<int> pids;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (testing::metrics_steps_written(t.metrics("stopped")) >= 3) {
      pids = testing::find_processes("trident", t.ckpt("stopped"));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(static_cast<int>(pids.size()), layout.ranks());
  if (!pids.empty()) kill(pids.back(), SIGUSR1);
  runner.join();
  ASSERT_FALSE(pids.empty()) << stopped_result.output;
  ASSERT_EQ(stopped_result.exit_code, 3) << stopped_result.output;
  EXPECT_NE(stopped_result.output.find("stop requested"), std::string::npos) << stopped_result.output;

  // It saved exactly the step it stopped at, and that checkpoint verifies.
  const int stop_step = testing::metrics_steps_written(t.metrics("stopped"));
  ASSERT_GE(stop_step, 3);
  ASSERT_LT(stop_step, total_steps);
  std::printf("[ info ] %s: SIGUSR1 to pid %d of %zu; stopped at step %d of %d\n",
              layout.name().c_str(), pids.back(), pids.size(), stop_step, total_steps);
  const auto steps = list_steps(t.ckpt("stopped"));
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].first, stop_step);
  const std::string step_dir = t.ckpt("stopped") + "/step_" + std::to_string(stop_step);
  CommandResult verify = run_command(testing::trident_binary() + " ckpt verify " + step_dir);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_EQ(testing::checkpoint_trainer_state(step_dir).value("step", -1), stop_step);

  // Resume to the end (interval > max_steps: only the final step is saved).
  r = t.train({"stopped", "resumed", layout, total_steps, 1000, "auto", "cosine"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + step_dir), std::string::npos) << r.output;

  const auto want = testing::metrics_losses(t.metrics("full"));
  const auto before = testing::metrics_losses(t.metrics("stopped"));
  const auto after = testing::metrics_losses(t.metrics("resumed"));
  ASSERT_EQ(want.size(), static_cast<size_t>(total_steps));
  ASSERT_EQ(before.size() + after.size(), static_cast<size_t>(total_steps));
  for (int s = 1; s <= total_steps; ++s) {
    const auto& got = s <= stop_step ? before : after;
    ASSERT_TRUE(got.count(s)) << "step " << s;
    EXPECT_EQ(got.at(s), want.at(s)) << "step " << s;
  }
  const std::string last = "/step_" + std::to_string(total_steps);
  expect_bitwise_equal(t.tensors(t.ckpt("stopped") + last), t.tensors(t.ckpt("full") + last));
}

TEST_F(Resume, Sigusr1StopsAndResumesBitwiseSingleProcess) { check_signal_stop(*this, kSingle); }

TEST_F(Resume, Sigusr1ToOneRankStopsAllAndResumesBitwise2x2x2Zero3) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  check_signal_stop(*this, k2x2x2Zero3);
}

}  // namespace
}  // namespace trident
