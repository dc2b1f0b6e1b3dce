// Runs and lineage (checkpoint/lineage.h, train_state.h, retention.h, dir_lock.h): the
// typed trainer state and its range checks, `latest`, which checkpoint --resume auto
// continues, what a continuation sets aside, lineage-aware retention, crash-leftover
// cleanup that spares the user's files, and the checkpoint-directory lock.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/cli.h"
#include "checkpoint/dir_lock.h"
#include "checkpoint/durable_io.h"
#include "checkpoint/lineage.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/manifest_edit.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Saves one checkpoint of `step` with trainer state `state` under root (no retention).
void save(const std::string& root, int64_t step, const json& state) {
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(root));
  const auto boxes = test::split(test::make_tensors(static_cast<float>(step)), 1);
  Status st = writer.save(step, test::refs(boxes), state, world, false);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

// A checksum-valid edit of a manifest's trainer state (tests/common/manifest_edit.h).
void rewrite_state(const std::string& step_dir, const std::function<void(json&)>& edit) {
  Status st = testing::rewrite_trainer_state(step_dir, edit);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

void write_latest(const std::string& root, const std::string& text) {
  ASSERT_TRUE(write_file_atomic(root + "/" + kLatestName, text).is_ok());
}

std::string name_of(const std::string& dir) { return fs::path(dir).filename().string(); }

// ---- trainer state ----------------------------------------------------------------------

TEST(TrainState, RoundTripKeepsExtraFields) {
  json j = test::train_state(12, "runA", "uid12", {"uid10", "uid5"});
  j["data"] = {{"tokens", 123}};
  auto s = parse_train_state(j, 12, 1, "m");
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->version, kTrainStateVersion);
  EXPECT_EQ(s->step, 12);
  EXPECT_EQ(s->consumed_samples, 96u);
  EXPECT_EQ(s->run_id, "runA");
  EXPECT_EQ(s->checkpoint_uid, "uid12");
  EXPECT_EQ(s->ancestors, (std::vector<std::string>{"uid10", "uid5"}));
  EXPECT_TRUE(s->descends_from("uid5"));
  EXPECT_TRUE(s->descends_from("uid12"));
  EXPECT_FALSE(s->descends_from("uid11"));
  EXPECT_EQ(s->extra["data"]["tokens"], 123);
  EXPECT_EQ(train_state_to_json(s.value()), j);
}

TEST(TrainState, ReadsVersion1AsARunWithoutLineage) {
  json j = test::train_state(4);
  for (const char* k : {"version", "run_id", "checkpoint_uid", "ancestors"}) j.erase(k);
  auto s = parse_train_state(j, 4, 1, "m");
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->version, 1);
  EXPECT_TRUE(s->run_id.empty());
  EXPECT_TRUE(s->checkpoint_uid.empty());
}

TEST(TrainState, RejectsMissingFieldsWrongTypesAndImpossibleValues) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    int64_t manifest_step;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"missing", [](json& j) { j.erase("consumed_samples"); }, 7,
       "m: trainer state: 'consumed_samples' is missing"},
      {"missing nested", [](json& j) { j["layout"].erase("tp"); }, 7, "'layout.tp' is missing"},
      {"wrong type", [](json& j) { j["step"] = "7"; }, 7,
       "'step' must be an integer in [0, 2147483647], got \"7\""},
      {"negative step", [](json& j) { j["step"] = -7; }, -7, "'step' must be an integer in [0, 2147483647], got -7"},
      {"huge step", [](json& j) { j["step"] = int64_t{1000000000000}; }, 1000000000000,
       "got 1000000000000"},
      {"step vs manifest", [](json& j) { j["step"] = 6; }, 7,
       "'step' is 6 but the manifest is for step 7"},
      {"negative samples", [](json& j) { j["consumed_samples"] = -8; }, 7,
       "'consumed_samples' must be a non-negative integer, got -8"},
      {"too few samples", [](json& j) { j["consumed_samples"] = 3; }, 7,
       "'consumed_samples' 3 is impossible after 7 steps"},
      {"optimizer steps", [](json& j) { j["optimizer_steps"] = 9; }, 7,
       "'optimizer_steps' must be an integer in [0, 7], got 9"},
      {"zero stage", [](json& j) { j["layout"]["zero_stage"] = 4; }, 7, "'layout.zero_stage'"},
      {"world size", [](json& j) { j["layout"]["dp"] = 2; }, 7,
       "layout dp=2 tp=1 pp=1 world_size=1 does not match the manifest's 1 rank files"},
      {"config", [](json& j) { j["config"] = 5; }, 7, "'config' must be a string, got 5"},
      {"future version", [](json& j) { j["version"] = 3; }, 7,
       "trainer state version 3 was written by a newer Trident"},
      {"empty run id", [](json& j) { j["run_id"] = ""; }, 7, "'run_id' must not be empty"},
      {"bad run id", [](json& j) { j["run_id"] = "a/b"; }, 7, "'run_id' must be an id"},
      {"ancestors", [](json& j) { j["ancestors"] = "x"; }, 7, "'ancestors' must be a list"},
      {"not an object", [](json& j) { j = json::array(); }, 7, "trainer state must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json j = test::train_state(7);
    c.edit(j);
    auto s = parse_train_state(j, c.manifest_step, 1, "m");
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(s.status().message().find(c.message), std::string::npos) << s.status().message();
  }
}

TEST(TrainState, VerifyRejectsAChecksumValidManifestWithABadState) {
  test::TempDir dir;
  save(dir.path(), 5, test::train_state(5));
  save(dir.path(), 10, test::train_state(10, "run0", "", {"run0-5"}));
  rewrite_state(dir.path() + "/step_10", [](json& j) { j.erase("consumed_samples"); });
  // The manifest itself is intact...
  EXPECT_TRUE(verify_checkpoint(dir.path() + "/step_10").is_ok());
  // ...but `trident ckpt verify` and resume judge the trainer state too.
  std::string out, err;
  EXPECT_EQ(run_ckpt_command({"verify", dir.path() + "/step_10"}, &out, &err), 1);
  EXPECT_NE(err.find("step_10/manifest.json: trainer state: 'consumed_samples' is missing"),
            std::string::npos)
      << err;
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_5");
  ASSERT_FALSE(choice->warnings.empty());
  EXPECT_NE(choice->warnings[0].find("'consumed_samples' is missing"), std::string::npos)
      << choice->warnings[0];
}

// ---- latest -------------------------------------------------------------------------------

TEST(Latest, TextRoundTripAndLegacyForm) {
  test::TempDir dir;
  std::string problem;
  EXPECT_FALSE(read_latest(dir.path(), &problem).has_value());
  EXPECT_TRUE(problem.empty());
  write_latest(dir.path(), latest_text(26, "runB", "u26"));
  auto p = read_latest(dir.path(), &problem);
  ASSERT_TRUE(p.has_value()) << problem;
  EXPECT_EQ(p->step, 26);
  EXPECT_EQ(p->run_id, "runB");
  EXPECT_EQ(p->uid, "u26");
  write_latest(dir.path(), "step_9\n");
  p = read_latest(dir.path(), &problem);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->step, 9);
  EXPECT_TRUE(p->run_id.empty());
  write_latest(dir.path(), "garbage\n");
  EXPECT_FALSE(read_latest(dir.path(), &problem).has_value());
  EXPECT_NE(problem.find("is not step_<N>"), std::string::npos) << problem;
}

TEST(Latest, WriterNamesRunAndCheckpoint) {
  test::TempDir dir;
  save(dir.path(), 3, test::train_state(3, "runZ", "uid3"));
  std::string text;
  ASSERT_TRUE(read_whole_file(dir.path() + "/latest", &text).is_ok());
  EXPECT_EQ(text, "step_3\nrun runZ\nuid uid3\n");
}

TEST(Latest, FailedUpdateAfterTheRenameStillCommits) {
  test::TempDir dir;
  save(dir.path(), 10, test::train_state(10, "r", "u10"));
  // latest.tmp as a directory: the atomic update of `latest` fails as on a full disk.
  fs::create_directory(dir.path() + "/latest.tmp");
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto boxes = test::split(test::make_tensors(20.0f), 1);
  Status st = writer.save(20, test::refs(boxes), test::train_state(20, "r", "u20", {"u10"}), world,
                          false);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(writer.last_committed_step(), 20);
  EXPECT_NE(writer.last_latest_error().find("latest.tmp"), std::string::npos)
      << writer.last_latest_error();
  EXPECT_TRUE(verify_training_checkpoint(dir.path() + "/step_20").is_ok());
  std::string problem;
  EXPECT_EQ(read_latest(dir.path(), &problem)->step, 10);  // lags behind
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_20");  // descends from what latest names
}

// ---- --resume auto ---------------------------------------------------------------------------

TEST(AutoResume, FollowsLatestNotTheHighestStep) {
  test::TempDir dir;
  // An earlier run A reached step 40; the current run B is at step 26.
  save(dir.path(), 30, test::train_state(30, "runA", "a30"));
  save(dir.path(), 40, test::train_state(40, "runA", "a40", {"a30"}));
  save(dir.path(), 20, test::train_state(20, "runB", "b20"));
  save(dir.path(), 26, test::train_state(26, "runB", "b26", {"b20"}));
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_26");
  std::string warnings;
  for (const auto& w : choice->warnings) warnings += w + "\n";
  EXPECT_NE(warnings.find("step_30 (run runA): newer than"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("step_40 (run runA): newer than"), std::string::npos) << warnings;
}

TEST(AutoResume, FallsBackWithinTheRunOnly) {
  test::TempDir dir;
  save(dir.path(), 10, test::train_state(10, "runA", "a10"));
  save(dir.path(), 15, test::train_state(15, "runB", "b15"));
  save(dir.path(), 20, test::train_state(20, "runA", "a20", {"a10"}));
  test::truncate_by(dir.path() + "/step_20/rank_0.bin", 40);
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_10");  // not run B's step_15
  std::string warnings;
  for (const auto& w : choice->warnings) warnings += w + "\n";
  EXPECT_NE(warnings.find("step_20/rank_0.bin: truncated"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("step_15: a checkpoint of run runB"), std::string::npos) << warnings;
}

TEST(AutoResume, RefusesWhenNoCheckpointIsValid) {
  test::TempDir dir;
  save(dir.path(), 10, test::train_state(10, "r", "u10"));
  save(dir.path(), 20, test::train_state(20, "r", "u20", {"u10"}));
  test::flip_byte(dir.path() + "/step_10/rank_0.bin", 100);
  fs::remove(dir.path() + "/step_20/manifest.json");
  auto choice = choose_auto_resume(dir.path());
  ASSERT_FALSE(choice.is_ok());
  EXPECT_EQ(choice.status().exit_code(), 2);
  const std::string& m = choice.status().message();
  EXPECT_NE(m.find("no valid checkpoint to continue"), std::string::npos) << m;
  EXPECT_NE(m.find("refusing to start from scratch"), std::string::npos) << m;
  EXPECT_NE(m.find("step_20/manifest.json: missing"), std::string::npos) << m;
  EXPECT_NE(m.find("step_10/rank_0.bin: checksum mismatch"), std::string::npos) << m;
}

TEST(AutoResume, WithoutLatestOneRunIsFineTwoAreRefused) {
  test::TempDir dir;
  EXPECT_TRUE(choose_auto_resume(dir.path() + "/missing").value().dir.empty());
  save(dir.path(), 10, test::train_state(10, "runA", "a10"));
  save(dir.path(), 20, test::train_state(20, "runA", "a20", {"a10"}));
  fs::remove(dir.path() + "/latest");
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_20");
  save(dir.path(), 5, test::train_state(5, "runB", "b5"));
  fs::remove(dir.path() + "/latest");
  choice = choose_auto_resume(dir.path());
  ASSERT_FALSE(choice.is_ok());
  EXPECT_NE(choice.status().message().find("2 different runs and no readable `latest`"),
            std::string::npos)
      << choice.status().message();
}

TEST(AutoResume, LatestNamingAReplacedCheckpointIsSkipped) {
  test::TempDir dir;
  save(dir.path(), 10, test::train_state(10, "r", "u10"));
  save(dir.path(), 20, test::train_state(20, "r", "u20", {"u10"}));
  write_latest(dir.path(), latest_text(20, "r", "someone-else"));
  auto choice = choose_auto_resume(dir.path());
  ASSERT_TRUE(choice.is_ok()) << choice.status().message();
  EXPECT_EQ(name_of(choice->dir), "step_10");
}

// ---- --resume none and continuations ------------------------------------------------------------

TEST(FreshStart, RefusedWhileCheckpointsExist) {
  test::TempDir dir;
  EXPECT_TRUE(check_fresh_start(dir.path()).is_ok());
  EXPECT_TRUE(check_fresh_start(dir.path() + "/missing").is_ok());
  fs::create_directory(dir.path() + "/step_3.tmp");  // an uncommitted save is not a run
  EXPECT_TRUE(check_fresh_start(dir.path()).is_ok());
  save(dir.path(), 40, test::train_state(40, "runA", "a40"));
  Status st = check_fresh_start(dir.path());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("already holds checkpoints (run runA): step_40"), std::string::npos)
      << st.message();
}

TEST(Continuation, SetsAsideLaterStepsAndPointsLatestBack) {
  test::TempDir dir;
  save(dir.path(), 20, test::train_state(20, "r", "u20"));
  save(dir.path(), 30, test::train_state(30, "r", "u30", {"u20"}));
  save(dir.path(), 40, test::train_state(40, "r", "u40", {"u30", "u20"}));
  fs::create_directory(dir.path() + "/step_40.abandoned");  // from an earlier rollback
  auto from = verify_training_checkpoint(dir.path() + "/step_20");
  ASSERT_TRUE(from.is_ok()) << from.status().message();
  std::vector<std::string> moved;
  Status st = prepare_continuation(dir.path(), dir.path() + "/step_20", from.value(), &moved);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(name_of(moved[0]), "step_30.abandoned");
  EXPECT_EQ(name_of(moved[1]), "step_40.abandoned.2");
  EXPECT_TRUE(verify_training_checkpoint(moved[1]).is_ok());  // kept whole
  EXPECT_EQ(list_steps(dir.path()).size(), 1u);
  std::string problem;
  EXPECT_EQ(read_latest(dir.path(), &problem)->uid, "u20");
}

TEST(Continuation, FromElsewhereRefusesADirectoryOfAnotherRun) {
  test::TempDir src, dst;
  save(src.path(), 100, test::train_state(100, "runX", "x100"));
  save(dst.path(), 50, test::train_state(50, "runY", "y50"));
  auto from = verify_training_checkpoint(src.path() + "/step_100");
  ASSERT_TRUE(from.is_ok());
  Status st = prepare_continuation(dst.path(), src.path() + "/step_100", from.value(), nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("holds checkpoints of another run"), std::string::npos)
      << st.message();
  test::TempDir empty;
  EXPECT_TRUE(prepare_continuation(empty.path(), src.path() + "/step_100", from.value(), nullptr)
                  .is_ok());
}

// ---- retention and leftovers ----------------------------------------------------------------------

TEST(Retention, DeletesOnlyTheTrainedRunsCheckpoints) {
  test::TempDir dir;
  save(dir.path(), 30, test::train_state(30, "runA", "a30"));
  save(dir.path(), 40, test::train_state(40, "runA", "a40"));
  save(dir.path(), 5, test::train_state(5, "runB", "b5"));
  for (int step : {10, 20, 26}) save(dir.path(), step, test::train_state(step, "runB"));
  RetentionPolicy policy;
  policy.keep_last = 2;
  policy.run_id = "runB";
  policy.protect = {5};  // e.g. the step the run resumed from
  std::vector<std::string> deleted;
  ASSERT_TRUE(apply_retention(dir.path(), policy, &deleted).is_ok());
  ASSERT_EQ(deleted.size(), 1u);
  EXPECT_EQ(name_of(deleted[0]), "step_10");
  std::vector<int64_t> left;
  for (const auto& [step, path] : list_steps(dir.path())) left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{5, 20, 26, 30, 40}));
}

TEST(Leftovers, OnlyTridentsOwnAreRemoved) {
  test::TempDir dir;
  const std::string root = dir.path();
  for (const char* d : {"step_3.tmp", "step_4.deleting", "notes.tmp", "data.deleting", "step_x.tmp",
                        "step_5.abandoned"}) {
    fs::create_directory(root + "/" + d);
  }
  for (const char* f : {"latest.tmp", ".trident-probe-host-12", "results.tmp", "my.deleting"}) {
    std::ofstream(root + "/" + f) << "x";
  }
  std::vector<std::string> removed;
  ASSERT_TRUE(remove_crash_leftovers(root, &removed).is_ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"data.deleting", "my.deleting", "notes.tmp",
                                             "results.tmp", "step_5.abandoned", "step_x.tmp"}));
  EXPECT_EQ(removed.size(), 4u);
}

// ---- the lock ------------------------------------------------------------------------------------------

TEST(DirLock, SecondHolderIsRefusedAndAReleasedLockIsFree) {
  test::TempDir dir;
  const std::string root = dir.path() + "/ckpt";
  // A stale lock file from a killed run: only the flock counts.
  fs::create_directories(root);
  std::ofstream(root + "/" + kLockName) << "host gone, pid 1, since 2026-01-01T00:00:00Z\n";
  auto first = DirLock::acquire(root);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  EXPECT_TRUE(first->held());
  auto second = DirLock::acquire(root);  // another open file description: conflicts
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().exit_code(), 2);
  const std::string& m = second.status().message();
  EXPECT_NE(m.find("checkpoint.dir " + root + " is in use by another Trident run (host "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("pid " + std::to_string(getpid())), std::string::npos) << m;
  { DirLock released = std::move(first).value(); }
  EXPECT_TRUE(DirLock::acquire(root).is_ok());
}

}  // namespace
}  // namespace trident
