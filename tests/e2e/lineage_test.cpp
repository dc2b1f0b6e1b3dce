// End-to-end: a run never continues someone else's checkpoints, never loses its own, and
// never crashes on a bad trainer state (docs/CHECKPOINTS.md, "Runs and lineage"):
// - a rollback (--resume DIR/step_N) sets the later steps aside instead of letting
//   retention delete the rollback source, and --resume auto then follows `latest`;
// - --resume none refuses a directory that holds checkpoints;
// - a second run on a locked checkpoint.dir exits 2 naming the holder, and a killed
//   holder's lock does not block the next launch;
// - start-up cleanup removes only Trident's own leftovers;
// - a checksum-valid manifest with a missing, mistyped or impossible trainer-state field
//   is named by `ckpt verify` and skipped by --resume auto;
// - step directories that are all invalid make --resume auto refuse rather than restart;
// - every launch writes a segment header to the metrics file.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/lineage.h"
#include "checkpoint/reader.h"
#include "tests/common/manifest_edit.h"
#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

class Lineage : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_.write("run.yaml",
               testing::cli_model_yaml() +
               "parallel: {micro_batch_size: 2}\n"
               "data: {train: " + dir_.file("train.bin") + "}\n"
               "training: {global_batch_size: 4, max_steps: 40, lr: 0.003, warmup_steps: 2}\n"
               "checkpoint: {dir: " + ckpt() + ", interval: 10, keep_last: 2}\n"
               "logging: {metrics: " + dir_.file("metrics.jsonl") + ", log_interval: 1000}\n");
  }

  std::string ckpt() const { return dir_.file("ckpt"); }

  std::string command(const std::string& flags) const {
    return "OMP_WAIT_POLICY=passive " + testing::trident_binary() + " train --config " +
           dir_.file("run.yaml") + " " + flags;
  }
  CommandResult train(const std::string& flags) const { return run_command(command(flags)); }

  std::vector<std::string> entries() const { return testing::dir_entries(ckpt()); }

  // A checksum-valid edit of step_dir's trainer state (tests/common/manifest_edit.h).
  static void edit_state(const std::string& step_dir, const std::function<void(json&)>& edit) {
    Status st = testing::rewrite_trainer_state(step_dir, edit);
    ASSERT_TRUE(st.is_ok()) << st.message();
  }

  ScratchDir dir_;
};

// Step records written so far to a metrics file.
int steps_written(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("\"loss\"") != std::string::npos;
  return n;
}

std::vector<std::string> without_lock(std::vector<std::string> names) {
  std::erase(names, std::string(".trident.lock"));
  return names;
}

TEST_F(Lineage, RollbackKeepsItsSourceAndAutoFollowsLatest) {
  CommandResult r = train("--resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(without_lock(entries()), (std::vector<std::string>{"latest", "step_30", "step_40"}));

  // A new run in the same directory is refused: it would mix two runs.
  r = train("--resume none");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--resume none: checkpoint.dir " + ckpt() +
                          " already holds checkpoints (run "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step_30 step_40"), std::string::npos) << r.output;

  // Roll back to step 30 and train to 35 (checkpoints every 5): step_40 is set aside,
  // not deleted; the rollback source survives retention (keep_last 2).
  r = train("--resume " + ckpt() + "/step_30 --set training.max_steps=35 --set checkpoint.interval=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("set aside " + ckpt() + "/step_40.abandoned"), std::string::npos)
      << r.output;
  EXPECT_EQ(without_lock(entries()),
            (std::vector<std::string>{"latest", "step_30", "step_35", "step_40.abandoned"}));
  EXPECT_TRUE(verify_training_checkpoint(ckpt() + "/step_40.abandoned").is_ok());
  std::string problem;
  ASSERT_TRUE(read_latest(ckpt(), &problem).has_value()) << problem;
  EXPECT_EQ(read_latest(ckpt(), &problem)->step, 35);

  // Every later launch (a Slurm requeue) continues the rolled-back run, not step_40.
  r = train("--resume auto --set training.max_steps=45 --set checkpoint.interval=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt() + "/step_35 (step 35"), std::string::npos)
      << r.output;
  auto s35 = verify_training_checkpoint(ckpt() + "/step_45");
  ASSERT_TRUE(s35.is_ok()) << s35.status().message();
  auto s40 = verify_training_checkpoint(ckpt() + "/step_40.abandoned");
  ASSERT_TRUE(s40.is_ok());
  EXPECT_EQ(s35->run_id, s40->run_id);  // one run, rolled back
  EXPECT_FALSE(s35->descends_from(s40->checkpoint_uid));
}

TEST_F(Lineage, SecondRunOnALockedDirectoryIsRefusedAndAKilledHolderFreesIt) {
  // A long first run, watched through its metrics file.
  testing::Job first(command("--resume auto --set training.max_steps=100000"),
                     dir_.file("first.log"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (steps_written(dir_.file("metrics.jsonl")) < 1 &&
         std::chrono::steady_clock::now() < deadline && first.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(first.running()) << first.log();
  const auto pids = testing::pids_with_env({"TRIDENT_TEST_TAG=" + first.tag()});
  ASSERT_FALSE(pids.empty());

  CommandResult r = train("--resume auto");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint.dir " + ckpt() + " is in use by another Trident run (host "),
            std::string::npos)
      << r.output;
  bool names_pid = false;
  for (pid_t p : pids) names_pid = names_pid || r.output.find("pid " + std::to_string(p)) != std::string::npos;
  EXPECT_TRUE(names_pid) << r.output;
  EXPECT_TRUE(first.running());  // the refused run touched nothing of the first one

  first.kill_all(SIGKILL);
  first.wait_for(std::chrono::seconds(10));
  r = train("--resume auto --set training.max_steps=3");
  EXPECT_EQ(r.exit_code, 0) << r.output;  // a dead holder's lock is no lock
}

TEST_F(Lineage, StartUpCleanupSparesTheUsersFiles) {
  fs::create_directories(ckpt() + "/scratch.deleting");
  fs::create_directories(ckpt() + "/step_7.tmp");  // Trident's own: an interrupted save
  std::ofstream(ckpt() + "/notes.tmp") << "mine";
  std::ofstream(ckpt() + "/latest.tmp") << "step_7\n";
  // interval 0 and no final save: no checkpoint is saved, so the directory holds only what
  // was there.
  CommandResult r = train("--resume none --set training.max_steps=2 --set checkpoint.interval=0"
                          " --set checkpoint.save_final=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(without_lock(entries()),
            (std::vector<std::string>{"notes.tmp", "scratch.deleting"}));
}

TEST_F(Lineage, BadTrainerStateIsNamedAndSkipped) {
  CommandResult r = train("--resume auto --set training.max_steps=20 --set checkpoint.interval=5"
                          " --set checkpoint.keep_last=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string pristine = dir_.file("pristine");
  fs::copy(ckpt(), pristine, fs::copy_options::recursive);
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"missing field", [](json& j) { j.erase("optimizer_steps"); }, "'optimizer_steps' is missing"},
      {"wrong type", [](json& j) { j["layout"]["dp"] = "1"; }, "'layout.dp' must be an integer"},
      {"negative step", [](json& j) { j["step"] = -7; }, "'step' must be an integer in [0, "},
      {"huge step", [](json& j) { j["step"] = int64_t{1000000000000}; }, "got 1000000000000"},
      {"negative samples", [](json& j) { j["consumed_samples"] = -8; },
       "'consumed_samples' must be a non-negative integer, got -8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(ckpt());
    fs::copy(pristine, ckpt(), fs::copy_options::recursive);
    edit_state(ckpt() + "/step_20", c.edit);
    r = run_command(testing::trident_binary() + " ckpt verify " + ckpt() + "/step_20");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("step_20/manifest.json: trainer state: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    r = train("--resume auto --set training.max_steps=20 --set checkpoint.interval=5"
              " --set checkpoint.keep_last=5");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("skipping checkpoint " + ckpt() + "/step_20"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resumed from " + ckpt() + "/step_15 (step 15"), std::string::npos)
        << r.output;
    // No step directory with a negative or wrapped number ever appears.
    for (const std::string& e : entries()) EXPECT_EQ(e.find("step_-"), std::string::npos) << e;
  }
}

TEST_F(Lineage, AllCheckpointsInvalidIsRefusedNotRestarted) {
  CommandResult r = train("--resume auto --set training.max_steps=20");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::remove(ckpt() + "/step_20/manifest.json");
  fs::resize_file(ckpt() + "/step_10/rank_0.bin", 100);
  r = train("--resume auto --set training.max_steps=20");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(ckpt() + ": no valid checkpoint to continue"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(ckpt() + "/step_20/manifest.json: missing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(ckpt() + "/step_10/rank_0.bin: truncated"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(ckpt() + "/step_10/rank_0.bin"));  // nothing was overwritten
}

TEST_F(Lineage, MetricsFileMarksEachLaunch) {
  CommandResult r = train("--resume auto --set training.max_steps=10 --set checkpoint.interval=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train("--resume " + ckpt() + "/step_5 --set training.max_steps=10 --set checkpoint.interval=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> segments;
  std::ifstream in(dir_.file("metrics.jsonl"));
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j.contains("segment")) segments.push_back(j["segment"]);
    if (j.contains("loss")) ++steps;
  }
  EXPECT_EQ(steps, 15);  // steps 6..10 twice
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0]["start_step"], 0);
  EXPECT_TRUE(segments[0]["resumed_from"].is_null());
  EXPECT_EQ(segments[1]["start_step"], 5);
  EXPECT_EQ(segments[1]["resumed_from"], ckpt() + "/step_5");
  EXPECT_EQ(segments[0]["run_id"], segments[1]["run_id"]);
  EXPECT_EQ(segments[0]["run_id"].get<std::string>().size(), 16u);
}

}  // namespace
}  // namespace trident
