// End-to-end tests of `trident train`'s stop signals (trainer/signals.h):
// - SIGINT (Ctrl-C) and SIGHUP (a closed terminal) mid-training are a graceful stop like
//   SIGTERM: a checkpoint of the step it stopped at is saved and verifies, exit 3.
// - A stop signal during start-up ends a process blocked there (opening a FIFO given as
//   data.train or as --config) at once: exit 3 and a message saying nothing was trained.
// - A second SIGTERM while a stop is pending ends a process blocked inside the training
//   loop (TRIDENT_FAULT_HANG: rank 0 sleeps forever at the start of step 2) at once:
//   exit 143 and a message saying nothing was saved.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <string>
#include <thread>

#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"

namespace trident {
namespace {

using namespace std::chrono_literals;
using testing::Job;
using testing::ScratchDir;

class Signals : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
  }

  // A tiny model whose steps take milliseconds; max_steps far beyond what a test waits for.
  std::string write_config(const std::string& name, const std::string& train,
                           const std::string& extra = "") {
    dir_.write(name + ".yaml",
               testing::cli_model_yaml() +
               "parallel: {micro_batch_size: 2}\n"
               "data: {train: " + train + "}\n"
               "training: {global_batch_size: 4, max_steps: 1000000, lr: 0.003, warmup_steps: 2}\n"
               "checkpoint: {dir: " + dir_.file(name + "_ckpt") + ", interval: 0}\n"
               "logging: {metrics: " + dir_.file(name + ".jsonl") + ", log_interval: 1000}\n" +
                   extra);
    return dir_.file(name + ".yaml");
  }

  std::unique_ptr<Job> start(const std::string& name, const std::string& args,
                             const std::string& env = "") {
    return std::make_unique<Job>(env + " " + testing::trident_binary() + " train " + args,
                                 dir_.file(name + ".log"));
  }

  // The trident process of `job` (the shell execs env, which execs trident), once it runs.
  static pid_t trident_pid(Job& job) {
    const auto deadline = testing::Clock::now() + 60s;
    while (testing::Clock::now() < deadline && job.running()) {
      auto pids = testing::pids_with_env({"TRIDENT_TEST_TAG=" + job.tag()});
      for (pid_t p : pids) {
        if (testing::read_text("/proc/" + std::to_string(p) + "/cmdline").find("trident") !=
            std::string::npos) {
          return p;
        }
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

  // Waits until `log` of `job` contains `text`; false on timeout or when the job ended.
  static bool wait_for_log(Job& job, const std::string& text, std::chrono::seconds limit) {
    const auto deadline = testing::Clock::now() + limit;
    while (testing::Clock::now() < deadline) {
      if (job.log().find(text) != std::string::npos) return true;
      if (!job.running()) return job.log().find(text) != std::string::npos;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // Waits until the main thread of `pid` sits in open() of a FIFO without a writer.
  static bool wait_blocked_in_open(pid_t pid, std::chrono::seconds limit) {
    const std::string proc = "/proc/" + std::to_string(pid);
    const std::string openat = std::to_string(SYS_openat) + " ";
    int in_open = 0;  // consecutive samples in openat: a blocked open, not a passing one
    const auto deadline = testing::Clock::now() + limit;
    while (testing::Clock::now() < deadline) {
      const std::string wchan = testing::read_text(proc + "/wchan");
      if (wchan == "wait_for_partner" || wchan == "fifo_open") return true;
      in_open = testing::read_text(proc + "/syscall").rfind(openat, 0) == 0 ? in_open + 1 : 0;
      if (in_open >= 30) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  void expect_graceful_stop(int signo, const std::string& name);

  ScratchDir dir_;
};

// Sends `signo` to a run a few steps into training; it must save the step it stopped at
// (a checkpoint that verifies) and exit 3.
void Signals::expect_graceful_stop(int signo, const std::string& name) {
  const std::string config = write_config(name, dir_.file("train.bin"));
  auto job = start(name, "--config " + config);
  const pid_t pid = trident_pid(*job);
  ASSERT_GT(pid, 0) << job->log();
  // A few steps done: the loop runs, so the handler is in training mode.
  const auto deadline = testing::Clock::now() + 60s;
  while (testing::Clock::now() < deadline && job->running() &&
         testing::losses_by_step(dir_.file(name + ".jsonl")).size() < 3) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(job->running()) << job->log();
  ASSERT_GE(testing::losses_by_step(dir_.file(name + ".jsonl")).size(), 3u) << job->log();
  ASSERT_EQ(::kill(pid, signo), 0);
  const auto code = job->wait_for(60s);
  ASSERT_TRUE(code.has_value()) << "still running 60 s after signal " << signo << "\n" << job->log();
  ASSERT_EQ(*code, 3) << job->log();
  const std::string log = job->log();
  EXPECT_NE(log.find("stop requested (SIGTERM/SIGINT/SIGHUP/SIGUSR1): saved step"),
            std::string::npos)
      << log;

  // It saved the step it stopped at, and that checkpoint verifies.
  const int stop_step =
      static_cast<int>(testing::losses_by_step(dir_.file(name + ".jsonl")).size());
  const std::string step_dir = dir_.file(name + "_ckpt/step_" + std::to_string(stop_step));
  auto verify = testing::run_command(testing::trident_binary() + " ckpt verify " + step_dir);
  EXPECT_EQ(verify.exit_code, 0) << verify.output << "\n" << log;
  EXPECT_NE(verify.output.find("OK " + step_dir + ": step " + std::to_string(stop_step)),
            std::string::npos)
      << verify.output;
}

TEST_F(Signals, SigintMidTrainingSavesAndExits3) { expect_graceful_stop(SIGINT, "int"); }

// A closed terminal or a dropped ssh session (SIGHUP) is a stop like SIGTERM, not death
// without a save.
TEST_F(Signals, SighupMidTrainingSavesAndExits3) { expect_graceful_stop(SIGHUP, "hup"); }

TEST_F(Signals, StopSignalDuringStartUpExits3AtOnce) {
  // open() of a FIFO without a writer blocks forever: first as data.train (after MPI init
  // and the config), then as --config itself (before anything is read).
  ASSERT_EQ(::mkfifo(dir_.file("fifo").c_str(), 0644), 0);
  const std::string data_fifo = write_config("fifo_data", dir_.file("fifo"));
  for (const std::string& args : {"--config " + data_fifo, "--config " + dir_.file("fifo")}) {
    SCOPED_TRACE(args);
    auto job = start("startup", args);
    const pid_t pid = trident_pid(*job);
    ASSERT_GT(pid, 0) << job->log();
    ASSERT_TRUE(wait_blocked_in_open(pid, 60s)) << "not blocked opening the FIFO\n" << job->log();
    const auto signalled = testing::Clock::now();
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    // Generous for a loaded machine; without the fix it blocks forever (or dies of the
    // signal with 143 when the handler is not installed yet).
    const auto code = job->wait_for(10s);
    ASSERT_TRUE(code.has_value()) << "still blocked 10 s after SIGTERM\n" << job->log();
    const double secs = std::chrono::duration<double>(job->ended() - signalled).count();
    EXPECT_EQ(*code, 3) << job->log();
    EXPECT_LT(secs, 5.0);
    EXPECT_NE(job->log().find("trident: SIGTERM during start-up: exiting now (nothing trained "
                              "yet; the newest checkpoint is unchanged)"),
              std::string::npos)
        << job->log();
    std::printf("[ info ] exited %.2f s after SIGTERM\n", secs);
  }
}

TEST_F(Signals, SecondSigtermWhileStopPendingExitsAtOnce) {
  // Rank 0 sleeps forever at the start of step 2: inside the loop, never at a boundary.
  const std::string config = write_config("hang", dir_.file("train.bin"));
  auto job = start("hang", "--config " + config, "TRIDENT_FAULT_HANG=0:2");
  const pid_t pid = trident_pid(*job);
  ASSERT_GT(pid, 0) << job->log();
  ASSERT_TRUE(wait_for_log(*job, "fault injection: rank 0 hangs at step 2", 60s)) << job->log();

  // The first SIGTERM only asks for a stop at the next step boundary, which never comes.
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(job->running()) << "the first SIGTERM did not wait for a step boundary\n"
                              << job->log();

  const auto signalled = testing::Clock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto code = job->wait_for(10s);
  ASSERT_TRUE(code.has_value()) << "still running 10 s after the second SIGTERM\n" << job->log();
  const double secs = std::chrono::duration<double>(job->ended() - signalled).count();
  EXPECT_EQ(*code, 128 + SIGTERM) << job->log();
  EXPECT_LT(secs, 5.0);
  EXPECT_NE(job->log().find("trident: second SIGTERM while a stop was pending: exiting now "
                            "without saving (the newest committed checkpoint is unchanged)"),
            std::string::npos)
      << job->log();
  // Nothing was saved: interval 0 and no step boundary after the request.
  EXPECT_FALSE(std::filesystem::exists(dir_.file("hang_ckpt/latest"))) << job->log();
  std::printf("[ info ] exited %.2f s after the second SIGTERM\n", secs);
}

}  // namespace
}  // namespace trident
