// End-to-end failure tests of `trident train`:
// - Damaged checkpoints (a flipped byte, a truncated rank file, a missing manifest) are
//   named by `trident ckpt verify` (exit 1), skipped with a warning by --resume auto,
//   which falls back to the older step, and the continued run's losses equal those of
//   an uninterrupted run.
// - A hung rank (TRIDENT_FAULT_HANG) is ended by its peer's watchdog within
//   parallel.comm_timeout_s plus a few seconds, with a message naming call, group, step.
// - Crash consistency: a 2-rank run that checkpoints asynchronously every 2 steps is
//   SIGKILLed on a random rank at a random moment (in half the trials its first relaunch
//   too), then relaunched with --resume auto until it completes; the final checkpoint's parameters are bitwise those of a run
//   that was never interrupted, every committed step verifies, and the losses of every
//   step any launch logged equal the uninterrupted run's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "checkpoint/box.h"
#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::Job;
using testing::run_command;
using testing::ScratchDir;

// A tiny gpt2 over byte tokens: steps take milliseconds, so runs are dominated by start-up
// and checkpoint fsyncs.
std::string tiny_config(const std::string& train_bin, const std::string& extra) {
  return testing::cli_model_yaml() +
         "data: {train: " + train_bin + "}\n" + extra;
}

// ---- 1. Damaged checkpoints ------------------------------------------------------------

// One uninterrupted single-process run with checkpoints at steps 5 and 10, shared by the
// damage cases (each damages its own copy of the checkpoint root).
class DamagedCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    ASSERT_TRUE(write_token_file(dir_->file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_->write("run.yaml",
                tiny_config(dir_->file("train.bin"),
                            "parallel: {micro_batch_size: 2}\n"
                            "training: {global_batch_size: 4, max_steps: 10, lr: 0.003, warmup_steps: 2}\n"
                            "checkpoint: {dir: " + dir_->file("ref_ckpt") + ", interval: 5, keep_last: 5}\n"
                            "logging: {metrics: " + dir_->file("ref.jsonl") + ", log_interval: 1}\n"));
    reference_ = new testing::CommandResult(
        run_command(testing::trident_binary() + " train --config " + dir_->file("run.yaml")));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }

  void SetUp() override {
    ASSERT_EQ(reference_->exit_code, 0) << reference_->output;
    ref_losses_ = testing::losses_by_step(dir_->file("ref.jsonl"));
    ASSERT_EQ(ref_losses_.size(), 10u);
    ASSERT_TRUE(fs::exists(dir_->file("ref_ckpt/step_5/manifest.json")));
    ASSERT_TRUE(fs::exists(dir_->file("ref_ckpt/step_10/manifest.json")));
    // This case's own copy of the checkpoint root.
    root_ = dir_->file(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::copy(dir_->file("ref_ckpt"), root_, fs::copy_options::recursive);
  }

  testing::CommandResult verify(const std::string& path) {
    return run_command(testing::trident_binary() + " ckpt verify " + path);
  }

  // Resumes from root_ with --resume auto and checks the fallback to step_5: a warning
  // naming step_10, steps 6..10 only, with the uninterrupted run's exact losses, and a
  // fresh, valid step_10 with the uninterrupted run's parameters.
  void expect_auto_resume_falls_back() {
    const std::string metrics = root_ + ".jsonl";
    auto r = run_command(testing::trident_binary() + " train --config " + dir_->file("run.yaml") +
                         " --resume auto --set checkpoint.dir=" + root_ +
                         " --set logging.metrics=" + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("skipping checkpoint " + root_ + "/step_10"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("resumed from " + root_ + "/step_5 (step 5"), std::string::npos)
        << r.output;
    const auto losses = testing::losses_by_step(metrics);
    ASSERT_EQ(losses.size(), 5u) << "expected steps 6..10 only";
    for (const auto& [step, loss] : losses) {
      ASSERT_GE(step, 6);
      EXPECT_EQ(loss, ref_losses_.at(step)) << "step " << step;
    }
    // The rerun saved step 10 again, over the damaged one.
    ASSERT_TRUE(verify_checkpoint(root_ + "/step_10").is_ok());
    std::string err;
    const auto want = testing::read_params(dir_->file("ref_ckpt/step_10"), &err);
    ASSERT_FALSE(want.empty()) << err;
    const auto got = testing::read_params(root_ + "/step_10", &err);
    ASSERT_EQ(got.size(), want.size()) << err;
    for (const auto& [name, values] : want) {
      EXPECT_TRUE(testing::bitwise_equal(got.at(name), values)) << name;
    }
  }

  static ScratchDir* dir_;
  static testing::CommandResult* reference_;
  std::map<int, std::string> ref_losses_;
  std::string root_;
};

ScratchDir* DamagedCheckpoint::dir_ = nullptr;
testing::CommandResult* DamagedCheckpoint::reference_ = nullptr;

TEST_F(DamagedCheckpoint, FlippedByteIsNamedAndSkipped) {
  // Flip one byte in the middle of a parameter box of step_10's rank file.
  auto ckpt = open_checkpoint(root_ + "/step_10");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  std::string tensor;
  const ManifestBox* box = nullptr;
  for (const auto& [name, t] : ckpt->manifest().tensors) {
    if (name.rfind("param/", 0) == 0 && volume(t.boxes.at(0).extent) >= 16) {
      tensor = name;
      box = &t.boxes.at(0);
      break;
    }
  }
  ASSERT_NE(box, nullptr);
  const std::string file = root_ + "/step_10/" + box->file;
  const int64_t at = box->offset + volume(box->extent) / 2 * 4 + 1;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x20));
  }
  auto r = verify(root_ + "/step_10");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(file + ": checksum mismatch in tensor '" + tensor + "'"), std::string::npos)
      << r.output;
  EXPECT_EQ(verify(root_ + "/step_5").exit_code, 0);
  expect_auto_resume_falls_back();
}

TEST_F(DamagedCheckpoint, TruncatedRankFileIsNamedAndSkipped) {
  const std::string file = root_ + "/step_10/rank_0.bin";
  const auto size = fs::file_size(file);
  fs::resize_file(file, size - 100);
  auto r = verify(root_ + "/step_10");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(file + ": truncated: " + std::to_string(size - 100) +
                          " bytes, manifest says " + std::to_string(size)),
            std::string::npos)
      << r.output;
  EXPECT_EQ(verify(root_ + "/step_5").exit_code, 0);
  expect_auto_resume_falls_back();
}

TEST_F(DamagedCheckpoint, MissingManifestIsNamedAndSkipped) {
  const std::string manifest = root_ + "/step_10/manifest.json";
  ASSERT_TRUE(fs::remove(manifest));
  auto r = verify(root_ + "/step_10");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(manifest + ": missing"), std::string::npos) << r.output;
  EXPECT_EQ(verify(root_ + "/step_5").exit_code, 0);
  expect_auto_resume_falls_back();
}

// ---- 2. Watchdog -----------------------------------------------------------------------

TEST(Watchdog, HungRankEndsTheJobWithinTheTimeout) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
  dir.write("run.yaml",
            tiny_config(dir.file("train.bin"),
                        "parallel: {micro_batch_size: 2, dp: 2, comm_timeout_s: 3}\n"
                        "training: {global_batch_size: 4, max_steps: 50, lr: 0.003}\n"
                        "logging: {metrics: " + dir.file("m.jsonl") + ", log_interval: 1}\n"));
  constexpr double kTimeout = 3.0;
  Job job("TRIDENT_FAULT_HANG=1:3 " + testing::mpirun_prefix(2) + testing::trident_binary() +
              " train --config " + dir.file("run.yaml"),
          dir.file("log.txt"));
  // The moment rank 1 stops: its fault-injection warning (it then sleeps forever).
  const std::string hang_line = "fault injection: rank 1 hangs at step 3";
  std::optional<testing::Clock::time_point> hung;
  while (job.running() && testing::seconds_since(job.started()) < 60) {
    if (job.log().find(hang_line) != std::string::npos) {
      hung = testing::Clock::now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(hung.has_value()) << "rank 1 never reached the hang:\n" << job.log();
  const std::optional<int> code = job.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the job did not end within 60 s of the hang:\n" << job.log();
  const double after_hang = std::chrono::duration<double>(job.ended() - *hung).count();
  const std::string log = job.log();
  std::printf("[ watchdog ] job exited %d, %.2f s after the hang (timeout %.0f s)\n", *code,
              after_hang, kTimeout);
  EXPECT_NE(*code, 0) << log;
  EXPECT_LT(after_hang, kTimeout + 10.0) << log;
  // It waited for the deadline, not less (the job did not die of something else).
  EXPECT_GT(after_hang, kTimeout - 0.5) << log;
  // Rank 0 names the call (an overlapped reduction's wait: "all_reduce (wait)"), the group
  // and the step it was stuck in.
  const std::regex report(
      R"(\[rank 0 on [^\]]+\] watchdog: (all_reduce|reduce_scatter|all_gather|broadcast|barrier|recv|send|wait_sends)( \(wait\))?( '[^']*')? in group '(dp|world)' \(rank 0/2\) has not completed after [0-9.]+ s \(timeout 3\.0 s\) at step 3;)");
  EXPECT_TRUE(std::regex_search(log, report)) << log;
  EXPECT_EQ(log.find("step 3/50 |"), std::string::npos) << "step 3 must never finish:\n" << log;
}

// ---- 3. Crash consistency --------------------------------------------------------------

constexpr int kCrashSteps = 12;
constexpr int kCrashTrials = 12;

// What the checkpoint root looked like after the killed launch: which part of the
// save/commit cycle the kill interrupted.
std::string crash_phase(const std::string& root, const std::vector<int64_t>& full_bytes) {
  const int ranks = static_cast<int>(full_bytes.size());
  bool tmp = false, tmp_manifest = false, tmp_files_full = false, deleting = false;
  int committed = 0;
  for (const std::string& name : testing::dir_entries(root)) {
    if (name.ends_with(".tmp")) {
      tmp = true;
      tmp_manifest = tmp_manifest || fs::exists(root + "/" + name + "/manifest.json");
      int full = 0;
      for (int r = 0; r < ranks; ++r) {
        std::error_code ec;
        const std::string f = root + "/" + name + "/rank_" + std::to_string(r) + ".bin";
        full += fs::exists(f, ec) && static_cast<int64_t>(fs::file_size(f, ec)) == full_bytes[static_cast<size_t>(r)];
      }
      tmp_files_full = full == ranks;
    } else if (name.ends_with(".deleting")) {
      deleting = true;
    } else if (parse_step_dir_name(name)) {
      ++committed;
    }
  }
  if (tmp_manifest) return "commit: .tmp with manifest (renames pending)";
  if (tmp && tmp_files_full) return "save in flight: rank files written, commit pending";
  if (tmp) return "save in flight: rank files incomplete";
  if (deleting) return "retention: .deleting left";
  if (committed == 0) return "before the first commit";
  return "between saves";
}

// One killed launch of a trial.
// The step of the last progress line ("step N/M | loss ...") in a log; 0 if none.
int last_logged_step(const std::string& log) {
  const size_t bar = log.rfind(" | loss ");
  if (bar == std::string::npos) return 0;
  const size_t step = log.rfind("step ", bar);
  return step == std::string::npos ? 0 : std::atoi(log.c_str() + step + 5);
}

struct CrashKill {
  int trial = 0, launch = 0, rank = 0;
  int after_step = 0;  // the kill came delay_s after this step's progress line
  double delay_s = 0;
  std::string phase;
};

class CrashConsistency : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    records_ = new std::vector<CrashKill>();
    ASSERT_TRUE(write_token_file(dir_->file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    // ZeRO-1 over dp=2: both ranks write optimizer state, so both rank files hold data.
    dir_->write("run.yaml",
                tiny_config(dir_->file("train.bin"),
                            "parallel: {micro_batch_size: 2, dp: 2, zero_stage: 1, comm_timeout_s: 20}\n"
                            "training: {global_batch_size: 4, max_steps: " +
                                std::to_string(kCrashSteps) + ", lr: 0.003, warmup_steps: 2}\n"
                            "checkpoint: {interval: 2, async: true}\n"
                            "logging: {log_interval: 1}\n"));
    // The uninterrupted run; also measures how long training lasts after step 1.
    Job ref(command("ref"), dir_->file("ref.log"));
    std::optional<testing::Clock::time_point> first;
    while (ref.running() && testing::seconds_since(ref.started()) < 120) {
      if (!first && ref.log().find("step 1/") != std::string::npos) first = testing::Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ref_exit_ = ref.wait_for(std::chrono::seconds(1)).value_or(-1);
    if (first) train_span_s_ = std::chrono::duration<double>(ref.ended() - *first).count();
    std::printf("[ crash    ] uninterrupted run: exit %d, %.2f s in all, %.2f s after step 1\n",
                ref_exit_, std::chrono::duration<double>(ref.ended() - ref.started()).count(),
                train_span_s_);
  }

  static void TearDownTestSuite() {
    std::map<std::string, int> by_phase;
    std::printf("[ crash    ] trial launch rank after_step delay_ms phase hit by the SIGKILL\n");
    for (const CrashKill& r : *records_) {
      std::printf("[ crash    ] %5d %6d %4d %10d %8.0f %s\n", r.trial, r.launch, r.rank,
                  r.after_step, 1e3 * r.delay_s, r.phase.c_str());
      ++by_phase[r.phase];
    }
    for (const auto& [phase, n] : by_phase) std::printf("[ crash    ] %2d x %s\n", n, phase.c_str());
    delete records_;
    delete dir_;
  }

  // The train command for a named launch group: its own checkpoint root and metrics.
  static std::string command(const std::string& name) {
    return testing::mpirun_prefix(2) + testing::trident_binary() + " train --config " +
           dir_->file("run.yaml") + " --resume auto --set checkpoint.dir=" + dir_->file(name + "_ckpt") +
           " --set logging.metrics=" + dir_->file(name + ".jsonl");
  }

  static ScratchDir* dir_;
  static std::vector<CrashKill>* records_;
  static int ref_exit_;
  static double train_span_s_;
};

ScratchDir* CrashConsistency::dir_ = nullptr;
std::vector<CrashKill>* CrashConsistency::records_ = nullptr;
int CrashConsistency::ref_exit_ = -1;
double CrashConsistency::train_span_s_ = 0;

TEST_P(CrashConsistency, KillARandomRankThenResumeMatchesTheUninterruptedRun) {
  ASSERT_EQ(ref_exit_, 0) << testing::read_text(dir_->file("ref.log"));
  ASSERT_GT(train_span_s_, 0);
  const std::string ref_final = dir_->file("ref_ckpt/step_" + std::to_string(kCrashSteps));
  ASSERT_TRUE(verify_checkpoint(ref_final).is_ok());
  const auto ref_losses = testing::losses_by_step(dir_->file("ref.jsonl"));
  ASSERT_EQ(ref_losses.size(), static_cast<size_t>(kCrashSteps));
  std::vector<int64_t> rank_file_bytes;  // a complete rank file of each rank
  for (int r = 0; r < 2; ++r) {
    rank_file_bytes.push_back(static_cast<int64_t>(
        fs::file_size(ref_final + "/rank_" + std::to_string(r) + ".bin")));
  }

  const int trial = GetParam();
  std::mt19937 rng(20240601u + static_cast<unsigned>(trial));
  const std::string name = "trial" + std::to_string(trial);
  const std::string root = dir_->file(name + "_ckpt");
  // Launch 0 is always killed, launch 1 in half the trials (a crash after a resume);
  // later launches run to the end. A launch that is not killed must succeed.
  const bool kill_relaunch = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
  int code = -1;
  std::string log;
  for (int launch = 0; launch < 4 && code != 0; ++launch) {
    Job job(command(name), dir_->file(name + "_" + std::to_string(launch) + ".log"));
    if (launch == 0 || (launch == 1 && kill_relaunch)) {
      CrashKill kill;
      kill.trial = trial;
      kill.launch = launch;
      kill.rank = std::uniform_int_distribution<int>(0, 1)(rng);
      // A random step's progress line (or a later one, for a relaunch that resumed
      // past it), then up to two steps' worth of time: the save of an even step starts
      // right after its line and commits during the next step.
      kill.after_step = std::uniform_int_distribution<int>(1, kCrashSteps)(rng);
      kill.delay_s = std::uniform_real_distribution<double>(0, 2.0)(rng) * train_span_s_ /
                     (kCrashSteps - 1);
      while (job.running() && last_logged_step(job.log()) < kill.after_step &&
             testing::seconds_since(job.started()) < 60) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, kill.delay_s)));
      bool killed = false;
      if (job.running()) {
        if (auto pid = job.rank_pid(kill.rank)) killed = ::kill(*pid, SIGKILL) == 0;
      }
      const auto ended = job.wait_for(std::chrono::seconds(30));
      ASSERT_TRUE(ended.has_value()) << "the killed job did not end:\n" << job.log();
      code = killed ? -1 : *ended;
      kill.phase = killed ? crash_phase(root, rank_file_bytes) : "ended before the kill";
      records_->push_back(kill);
      if (!killed) {
        EXPECT_EQ(*ended, 0) << job.log();
      }
    } else {
      code = job.wait_for(std::chrono::seconds(60)).value_or(-1);
    }
    log = job.log();
  }
  ASSERT_EQ(code, 0) << log;

  // Every committed step verifies, and no debris of the crash survives the completed run.
  int committed = 0;
  for (const auto& [step, path] : list_steps(root)) {
    Status st = verify_checkpoint(path);
    EXPECT_TRUE(st.is_ok()) << st.message();
    ++committed;
  }
  EXPECT_GE(committed, 1);
  for (const std::string& entry : testing::dir_entries(root)) {
    EXPECT_FALSE(entry.ends_with(".tmp") || entry.ends_with(".deleting")) << root << "/" << entry;
  }
  // The final parameters, bitwise.
  std::string err;
  const auto want = testing::read_params(ref_final, &err);
  ASSERT_FALSE(want.empty()) << err;
  const auto got = testing::read_params(root + "/step_" + std::to_string(kCrashSteps), &err);
  ASSERT_EQ(got.size(), want.size()) << err;
  for (const auto& [pname, values] : want) {
    EXPECT_TRUE(testing::bitwise_equal(got.at(pname), values)) << pname;
  }
  // Every step any launch logged (replays included) has the uninterrupted run's loss.
  std::ifstream metrics(dir_->file(name + ".jsonl"));
  std::string line;
  int checked = 0;
  while (std::getline(metrics, line)) {
    auto r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.contains("loss")) continue;  // a line cut by the kill
    EXPECT_EQ(r["loss"].dump(), ref_losses.at(r["step"].get<int>())) << "step " << r["step"];
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

INSTANTIATE_TEST_SUITE_P(Trials, CrashConsistency, ::testing::Range(0, kCrashTrials));

}  // namespace
}  // namespace trident
