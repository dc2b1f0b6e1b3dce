// Damage and crash consistency: flipped bytes, truncated files, missing and mangled
// manifests, uncommitted .tmp directories, a dangling `latest`; find_latest_valid's
// fallback with reasons; retention; and the `trident ckpt inspect|verify` command.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "checkpoint/cli.h"
#include "checkpoint/lineage.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "checkpoint/writer.h"
#include "ckpt_test_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

// Saves steps (sync) with split `way` under root.
void save_steps(const std::string& root, std::initializer_list<int64_t> steps, int way = 1,
                int keep_last = 0) {
  SelfCommunicator world;
  CheckpointWriterOptions opts = test::writer_options(root);
  opts.keep_last = keep_last;
  CheckpointWriter writer(opts);
  const auto ts = test::make_tensors();
  const auto boxes = test::split(ts, way);
  for (int64_t step : steps) {
    Status st = writer.save(step, test::refs(boxes), test::train_state(step), world, false);
    ASSERT_TRUE(st.is_ok()) << st.message();
  }
}

int64_t box_offset(const std::string& step_dir, const std::string& tensor, size_t box = 0) {
  auto ckpt = open_checkpoint(step_dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  return ckpt->manifest().tensors.at(tensor).boxes.at(box).offset;
}

TEST(CheckpointIntegrity, FlippedByteNamesFileAndTensorAndFallsBack) {
  test::TempDir dir;
  save_steps(dir.path(), {10, 20});
  const std::string step20 = dir.path() + "/step_20";
  const int64_t offset = box_offset(step20, "param/b", 1);  // the box [3, 7)
  test::flip_byte(step20 + "/rank_0.bin", offset + 5);

  Status st = verify_checkpoint(step20);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  const std::string expected = step20 + "/rank_0.bin: checksum mismatch in tensor 'param/b' box "
                               "start [3] extent [4] at offset " + std::to_string(offset) +
                               " (manifest ";
  EXPECT_EQ(st.message().substr(0, expected.size()), expected) << st.message();

  // A read that needs the damaged box fails the same way; one that does not, succeeds.
  auto ckpt = open_checkpoint(step20);
  ASSERT_TRUE(ckpt.is_ok());
  float out[4];
  EXPECT_TRUE(ckpt->read_box("param/b", std::vector<int64_t>{0}, std::vector<int64_t>{3}, out).is_ok());
  st = ckpt->read_box("param/b", std::vector<int64_t>{2}, std::vector<int64_t>{2}, out);
  EXPECT_EQ(st.message().substr(0, expected.size()), expected);

  std::vector<std::string> skipped;
  Result<std::string> latest = find_latest_valid(dir.path(), &skipped);
  ASSERT_TRUE(latest.is_ok()) << latest.status().message();
  EXPECT_EQ(latest.value(), dir.path() + "/step_10");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].substr(0, step20.size() + 2 + expected.size()), step20 + ": " + expected);
  // The cheap level does not read data, so it accepts step_20.
  EXPECT_EQ(find_latest_valid(dir.path(), nullptr, VerifyLevel::kCheap).value(), step20);
}

TEST(CheckpointIntegrity, FlippedHeaderByteIsDetectedCheaply) {
  test::TempDir dir;
  save_steps(dir.path(), {1});
  test::flip_byte(dir.path() + "/step_1/rank_0.bin", 13);  // inside the rank field
  Status st = verify_checkpoint(dir.path() + "/step_1");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), dir.path() + "/step_1/rank_0.bin: bad header (expected magic TRIDCKPT, "
                                       "version 1, rank 0, step 1)");
  EXPECT_FALSE(find_latest_valid(dir.path(), nullptr, VerifyLevel::kCheap).is_ok());
}

TEST(CheckpointIntegrity, TruncatedRankFile) {
  test::TempDir dir;
  save_steps(dir.path(), {3, 4});
  const std::string file = dir.path() + "/step_4/rank_0.bin";
  const auto size = static_cast<int64_t>(fs::file_size(file));
  test::truncate_by(file, 4);
  const std::string reason = file + ": truncated: " + std::to_string(size - 4) +
                             " bytes, manifest says " + std::to_string(size);
  Status st = verify_checkpoint(dir.path() + "/step_4");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), reason);
  auto ckpt = open_checkpoint(dir.path() + "/step_4");
  ASSERT_TRUE(ckpt.is_ok());
  float out[60];
  st = ckpt->read_tensor("param/w", out);
  EXPECT_EQ(st.message(), "tensor 'param/w': " + reason);
  std::vector<std::string> skipped;
  EXPECT_EQ(find_latest_valid(dir.path(), &skipped, VerifyLevel::kCheap).value(),
            dir.path() + "/step_3");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], dir.path() + "/step_4: " + reason);
}

TEST(CheckpointIntegrity, MissingRankFile) {
  test::TempDir dir;
  save_steps(dir.path(), {3});
  fs::remove(dir.path() + "/step_3/rank_0.bin");
  Status st = verify_checkpoint(dir.path() + "/step_3");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), dir.path() + "/step_3/rank_0.bin: missing");
}

TEST(CheckpointIntegrity, MissingManifestAndUncommittedTmpAreSkipped) {
  test::TempDir dir;
  save_steps(dir.path(), {5, 6});
  // A crash before the commit leaves step_9.tmp with rank files but no manifest; a torn
  // copy leaves step_6 without its manifest.
  fs::copy(dir.path() + "/step_5", dir.path() + "/step_9.tmp");
  fs::remove(dir.path() + "/step_9.tmp/manifest.json");
  fs::remove(dir.path() + "/step_6/manifest.json");

  Result<Checkpoint> ckpt = open_checkpoint(dir.path() + "/step_6");
  EXPECT_EQ(ckpt.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(ckpt.status().message(),
            dir.path() + "/step_6/manifest.json: missing (the checkpoint was never committed)");
  std::vector<std::string> skipped;
  Result<std::string> latest = find_latest_valid(dir.path(), &skipped);
  ASSERT_TRUE(latest.is_ok());
  EXPECT_EQ(latest.value(), dir.path() + "/step_5");
  ASSERT_EQ(skipped.size(), 1u);  // step_9.tmp is not even considered
  EXPECT_EQ(skipped[0], dir.path() + "/step_6: " + dir.path() +
                            "/step_6/manifest.json: missing (the checkpoint was never committed)");
}

TEST(CheckpointIntegrity, CorruptManifest) {
  test::TempDir dir;
  save_steps(dir.path(), {1, 2, 3});
  const std::string m2 = dir.path() + "/step_2/manifest.json";
  const std::string m3 = dir.path() + "/step_3/manifest.json";
  // Torn: half the JSON.
  const std::string text = test::read_text(m3);
  test::write_text(m3, text.substr(0, text.size() / 2));
  auto ckpt = open_checkpoint(dir.path() + "/step_3");
  EXPECT_EQ(ckpt.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(ckpt.status().message(), m3 + ": not valid JSON (torn or damaged manifest)");
  // Still JSON, but one digit of a shape changed.
  std::string text2 = test::read_text(m2);
  const size_t pos = text2.find("\"shape\": [\n    6,");
  ASSERT_NE(pos, std::string::npos) << text2;
  text2[pos + 15] = '5';
  test::write_text(m2, text2);
  ckpt = open_checkpoint(dir.path() + "/step_2");
  EXPECT_EQ(ckpt.status().message(),
            m2 + ": manifest_checksum mismatch (the manifest was damaged or edited)");
  std::vector<std::string> skipped;
  EXPECT_EQ(find_latest_valid(dir.path(), &skipped).value(), dir.path() + "/step_1");
  EXPECT_EQ(skipped.size(), 2u);
}

TEST(CheckpointIntegrity, NoValidCheckpointListsReasons) {
  test::TempDir dir;
  save_steps(dir.path(), {1});
  fs::remove(dir.path() + "/step_1/manifest.json");
  Result<std::string> latest = find_latest_valid(dir.path(), nullptr);
  EXPECT_EQ(latest.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(latest.status().message(),
            dir.path() + ": no valid checkpoint\n  skipped " + dir.path() + "/step_1: " +
                dir.path() + "/step_1/manifest.json: missing (the checkpoint was never committed)");
  test::TempDir empty;
  EXPECT_EQ(find_latest_valid(empty.path(), nullptr).status().message(),
            empty.path() + ": no valid checkpoint");
}

TEST(CheckpointIntegrity, LatestPointingToDeletedDir) {
  test::TempDir dir;
  save_steps(dir.path(), {1, 2});
  fs::remove_all(dir.path() + "/step_2");
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), latest_text(2, "run0", "run0-2"));
  std::string note;
  Result<std::string> resolved = resolve_step_dir(dir.path(), &note);
  ASSERT_TRUE(resolved.is_ok());
  EXPECT_EQ(resolved.value(), dir.path() + "/step_1");
  EXPECT_EQ(note, dir.path() + "/latest names 'step_2', which does not exist; using the newest, " +
                      dir.path() + "/step_1");
  EXPECT_EQ(find_latest_valid(dir.path(), nullptr).value(), dir.path() + "/step_1");
  std::string out, err;
  EXPECT_EQ(run_ckpt_command({"verify", dir.path()}, &out, &err), 0) << err;
  EXPECT_NE(err.find("which does not exist"), std::string::npos);
  EXPECT_EQ(out.rfind("OK " + dir.path() + "/step_1: step 1, 4 tensors, 9 boxes in 1 files", 0), 0u)
      << out;
}

TEST(CheckpointRetention, KeepsLastKAfterEachCommit) {
  test::TempDir dir;
  save_steps(dir.path(), {1, 2, 3, 4, 5}, 1, /*keep_last=*/2);
  std::vector<int64_t> left;
  for (const auto& [step, path] : list_steps(dir.path())) left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), latest_text(5, "run0", "run0-5"));
}

TEST(CheckpointRetention, NeverDeletesNewestValidLatestOrTmp) {
  test::TempDir dir;
  save_steps(dir.path(), {1, 2, 3});
  // A damaged higher step (never committed properly) and an in-flight save's .tmp.
  fs::create_directories(dir.path() + "/step_9");
  fs::create_directories(dir.path() + "/step_4.tmp");
  fs::create_directories(dir.path() + "/step_2.deleting");  // an interrupted deletion
  std::vector<std::string> deleted;
  ASSERT_TRUE(apply_retention(dir.path(), 1, std::nullopt, &deleted).is_ok());
  std::vector<int64_t> left;
  for (const auto& [step, path] : list_steps(dir.path())) left.push_back(step);
  // step_9 is the newest by number (kept: keep_last counts it), step_3 is both `latest`
  // and the newest valid one.
  EXPECT_EQ(left, (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(deleted, (std::vector<std::string>{dir.path() + "/step_1", dir.path() + "/step_2"}));
  EXPECT_TRUE(fs::exists(dir.path() + "/step_4.tmp"));
  EXPECT_FALSE(fs::exists(dir.path() + "/step_2.deleting"));
  // keep_last <= 0 keeps everything.
  ASSERT_TRUE(apply_retention(dir.path(), 0).is_ok());
  EXPECT_EQ(list_steps(dir.path()).size(), 2u);
}

TEST(CheckpointRetention, CrashLeftoversAreRemovedCommittedStepsKept) {
  test::TempDir dir;
  save_steps(dir.path(), {1, 2});
  fs::create_directories(dir.path() + "/step_3.tmp");      // a save that never committed
  fs::create_directories(dir.path() + "/step_1.deleting");  // an interrupted deletion
  { std::ofstream(dir.path() + "/latest.tmp") << "step_3\n"; }  // a torn pointer update
  ASSERT_TRUE(remove_crash_leftovers(dir.path()).is_ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_1", "step_2"}));
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), latest_text(2, "run0", "run0-2"));
  EXPECT_TRUE(verify_checkpoint(dir.path() + "/step_2").is_ok());
  EXPECT_TRUE(remove_crash_leftovers(dir.path() + "/missing").is_ok());
}

TEST(CheckpointCli, InspectAndVerify) {
  test::TempDir dir;
  save_steps(dir.path(), {7, 8}, 2);
  std::string out, err;
  EXPECT_EQ(run_ckpt_command({"inspect", dir.path() + "/step_7"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("step        7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("param/w"), std::string::npos);
  EXPECT_NE(out.find("[6, 10]"), std::string::npos);
  EXPECT_NE(out.find("adam_m/conv"), std::string::npos);
  EXPECT_NE(out.find("tensors (4, 128 elements, 512 bytes):"), std::string::npos) << out;
  EXPECT_NE(out.find("rank_0.bin"), std::string::npos);

  out.clear();
  EXPECT_EQ(run_ckpt_command({"inspect", dir.path()}, &out, &err), 0) << err;
  EXPECT_NE(out.find("step        8\n"), std::string::npos) << out;
  EXPECT_NE(out.find("steps under " + dir.path() + ": step_7 step_8\n"), std::string::npos) << out;

  out.clear();
  EXPECT_EQ(run_ckpt_command({"verify", dir.path() + "/step_7"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "OK " + dir.path() + "/step_7: step 7, 4 tensors, 14 boxes in 1 files, 512 bytes verified\n");

  const int64_t offset = box_offset(dir.path() + "/step_8", "adam_m/conv", 1);
  test::flip_byte(dir.path() + "/step_8/rank_0.bin", offset);
  out.clear();
  err.clear();
  EXPECT_EQ(run_ckpt_command({"verify", dir.path()}, &out, &err), 1);
  EXPECT_EQ(out, "");
  EXPECT_NE(err.find("trident ckpt verify: " + dir.path() +
                     "/step_8/rank_0.bin: checksum mismatch in tensor 'adam_m/conv'"),
            std::string::npos)
      << err;
}

TEST(CheckpointCli, BadUsageExits2) {
  test::TempDir dir;
  std::string out, err;
  EXPECT_EQ(run_ckpt_command({}, &out, &err), 2);
  EXPECT_EQ(run_ckpt_command({"verify"}, &out, &err), 2);
  EXPECT_EQ(run_ckpt_command({"check", dir.path()}, &out, &err), 2);
  EXPECT_NE(err.find("usage: trident ckpt"), std::string::npos);
  err.clear();
  EXPECT_EQ(run_ckpt_command({"verify", dir.path() + "/nope"}, &out, &err), 2);
  EXPECT_EQ(err, "trident ckpt verify: " + dir.path() + "/nope: no such directory\n");
  err.clear();
  EXPECT_EQ(run_ckpt_command({"inspect", dir.path()}, &out, &err), 2);
  EXPECT_EQ(err, "trident ckpt inspect: " + dir.path() +
                     ": not a checkpoint directory (no manifest.json, latest or step_<N>)\n");
  // A step directory without a manifest is a damaged checkpoint: exit 1.
  fs::create_directories(dir.path() + "/step_3");
  err.clear();
  EXPECT_EQ(run_ckpt_command({"verify", dir.path() + "/step_3"}, &out, &err), 1);
  EXPECT_EQ(err, "trident ckpt verify: " + dir.path() +
                     "/step_3/manifest.json: missing (the checkpoint was never committed)\n");
}

}  // namespace
}  // namespace trident
