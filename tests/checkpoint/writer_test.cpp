// CheckpointWriter + reader in one process (SelfCommunicator): round trips through
// different box splits read back with another split (resharding), N-D coverage errors
// at commit, the asynchronous save with a gated writer, and failed saves committing
// nothing.
#include "checkpoint/writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "checkpoint/reader.h"
#include "ckpt_test_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using test::GlobalTensor;
using test::OwnedBox;

// Reads every tensor back with the boxes of `way` and compares with the reference.
void expect_reads_back(const std::string& step_dir, const std::vector<GlobalTensor>& ts, int way) {
  Result<Checkpoint> ckpt = open_checkpoint(step_dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  for (const OwnedBox& want : test::split(ts, way)) {
    std::vector<float> got(want.data.size(), -7.0f);
    Status st = ckpt->read_box(want.tensor, want.start, want.extent, got.data());
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(got, want.data) << want.tensor << " start " << dims_to_string(want.start);
  }
}

TEST(CheckpointWriter, RoundTripReshardsAcrossSplits) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  for (int way = 0; way < 3; ++way) {
    const auto boxes = test::split(ts, way);
    const auto r = test::refs(boxes);
    nlohmann::json state = {{"consumed_samples", 100 * way}, {"layout", "dp1"}};
    ASSERT_TRUE(writer.save(10 + way, r, state, world, /*async=*/false).is_ok());
  }
  EXPECT_EQ(writer.last_committed_step(), 12);
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_12\n");
  for (int way = 0; way < 3; ++way) {
    const std::string step_dir = dir.path() + "/step_" + std::to_string(10 + way);
    EXPECT_TRUE(verify_checkpoint(step_dir).is_ok());
    for (int read_way = 0; read_way < 4; ++read_way) {
      SCOPED_TRACE("saved " + std::to_string(way) + " read " + std::to_string(read_way));
      expect_reads_back(step_dir, ts, read_way);
    }
    Result<Checkpoint> ckpt = open_checkpoint(step_dir);
    ASSERT_TRUE(ckpt.is_ok());
    EXPECT_EQ(ckpt->step(), 10 + way);
    EXPECT_EQ(ckpt->trainer_state()["consumed_samples"], 100 * way);
    std::vector<float> whole(60);
    ASSERT_TRUE(ckpt->read_tensor("param/w", whole.data()).is_ok());
    EXPECT_EQ(whole, ts[0].data);
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/step_12.tmp"));
}

TEST(CheckpointWriter, ReadRejectsUnknownTensorAndOutOfShapeBox) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  const auto boxes = test::split(ts, 1);
  ASSERT_TRUE(writer.save(1, test::refs(boxes), nlohmann::json::object(), world, false).is_ok());
  auto ckpt = open_checkpoint(dir.path() + "/step_1");
  ASSERT_TRUE(ckpt.is_ok());
  float out[8];
  Status st = ckpt->read_box("param/nope", std::vector<int64_t>{0}, std::vector<int64_t>{1}, out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(), dir.path() + "/step_1: checkpoint has no tensor 'param/nope'");
  st = ckpt->read_box("param/b", std::vector<int64_t>{5}, std::vector<int64_t>{3}, out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(),
            dir.path() + "/step_1: tensor 'param/b': box start [5] extent [3] leaves shape [7]");
}

TEST(CheckpointWriter, CommitRejectsGapAndOverlap) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  auto good = test::split(ts, 2);
  ASSERT_TRUE(writer.save(1, test::refs(good), nlohmann::json::object(), world, false).is_ok());

  // Gap: drop the last box of the 3-D tensor of split 3.
  auto gap = test::split(ts, 3);
  ASSERT_EQ(gap[gap.size() - 2].tensor, "adam_m/conv");
  gap.erase(gap.end() - 2);
  Status st = writer.save(2, test::refs(gap), nlohmann::json::object(), world, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(), "checkpoint " + dir.path() + "/step_2 not committed: " + dir.path() +
                              "/step_2.tmp/manifest.json: tensor 'adam_m/conv' shape [3, 4, 5]: "
                              "element [2, 0, 4] is not covered by any box (boxes cover 56 of 60 "
                              "elements)");
  // Overlap: a 2-D box added twice over.
  auto overlap = test::split(ts, 1);
  overlap.push_back(test::cut(ts[0], {1, 3}, {2, 2}));
  st = writer.save(3, test::refs(overlap), nlohmann::json::object(), world, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("tensor 'param/w': boxes in rank_0.bin start [0, 0] extent [2, 10] "
                              "and rank_0.bin start [1, 3] extent [2, 2] overlap at element [1, 3]"),
            std::string::npos)
      << st.message();
  // Inconsistent global shapes for one tensor.
  auto shapes = test::split(ts, 1);
  shapes[0].shape = {6, 11};
  shapes[0].extent = {2, 11};
  shapes[0].data.resize(22);
  st = writer.save(4, test::refs(shapes), nlohmann::json::object(), world, false);
  EXPECT_NE(st.message().find("tensor 'param/w' has global shape [6, 11] on one rank and [6, 10] "
                              "on rank 0"),
            std::string::npos)
      << st.message();

  // Nothing of the failed saves is left; latest still names the good one.
  for (int s : {2, 3, 4}) {
    EXPECT_FALSE(fs::exists(dir.path() + "/step_" + std::to_string(s)));
    EXPECT_FALSE(fs::exists(dir.path() + "/step_" + std::to_string(s) + ".tmp"));
  }
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_1\n");
  EXPECT_EQ(writer.last_committed_step(), 1);
}

TEST(CheckpointWriter, RejectsBadBoxesAndState) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  auto boxes = test::split(ts, 0);
  Status st = writer.save(1, test::refs(boxes), nlohmann::json::array(), world, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("step_1: trainer state must be a JSON object"), std::string::npos);
  boxes[1].start = {2};  // [2, 9) leaves [7]
  st = writer.save(1, test::refs(boxes), nlohmann::json::object(), world, false);
  EXPECT_NE(st.message().find("rank 0: tensor 'param/b': box start [2] extent [7] leaves shape [7]"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(fs::exists(dir.path() + "/latest"));
}

// The writer thread is held at a gate: training steps proceed while the save is in
// flight, poll() does not commit, and wait() commits the snapshot taken in save().
TEST(CheckpointWriter, AsyncSaveCommitsAfterTrainingContinues) {
  test::TempDir dir;
  SelfCommunicator world;
  std::atomic<bool> release{false};
  std::atomic<int> chunks{0};
  CheckpointWriterOptions opts = test::writer_options(dir.path());
  opts.chunk_bytes = 4096;
  opts.on_chunk = [&](int64_t, int64_t) {
    ++chunks;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Status::ok();
  };
  CheckpointWriter writer(opts);
  auto ts = test::make_tensors();
  ts[0].shape = {64, 40};  // 10 KiB: three chunks
  ts[0].data.resize(64 * 40);
  for (size_t i = 0; i < ts[0].data.size(); ++i) ts[0].data[i] = static_cast<float>(i);
  auto boxes = test::split(ts, 0);
  ASSERT_TRUE(writer.save(5, test::refs(boxes), {{"consumed_samples", 40}}, world, true).is_ok());
  EXPECT_TRUE(writer.in_flight());
  while (chunks.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // "Training": mutate the live tensors and poll at each step boundary.
  int steps = 0;
  for (; steps < 20; ++steps) {
    for (auto& b : boxes)
      for (float& x : b.data) x += 1.0f;
    bool committed = true;
    ASSERT_TRUE(writer.poll(&committed).is_ok());
    EXPECT_FALSE(committed);
  }
  EXPECT_EQ(steps, 20);
  EXPECT_TRUE(fs::exists(dir.path() + "/step_5.tmp/rank_0.bin"));
  EXPECT_FALSE(fs::exists(dir.path() + "/step_5"));
  EXPECT_FALSE(fs::exists(dir.path() + "/latest"));
  EXPECT_EQ(chunks.load(), 1);

  release = true;
  ASSERT_TRUE(writer.wait().is_ok());
  EXPECT_FALSE(writer.in_flight());
  EXPECT_EQ(chunks.load(), 3);
  EXPECT_EQ(writer.last_committed_step(), 5);
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_5\n");
  EXPECT_FALSE(fs::exists(dir.path() + "/step_5.tmp"));
  ASSERT_TRUE(verify_checkpoint(dir.path() + "/step_5").is_ok());
  // The checkpoint holds the snapshot from save(), not the mutated tensors.
  expect_reads_back(dir.path() + "/step_5", ts, 3);
  EXPECT_EQ(writer.last_stats().step, 5);
  EXPECT_EQ(writer.last_stats().bytes, 32 + (64 * 40 + 7 + 60 + 1) * 4);
}

TEST(CheckpointWriter, PollCommitsOnceWritten) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  const auto boxes = test::split(ts, 1);
  ASSERT_TRUE(writer.save(1, test::refs(boxes), {}, world, true).is_ok());
  bool committed = false;
  for (int i = 0; i < 5000 && !committed; ++i) {
    ASSERT_TRUE(writer.poll(&committed).is_ok());
    if (!committed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(committed);
  EXPECT_FALSE(writer.in_flight());
  // A second async save while none is in flight, then a third that must first finish it.
  ASSERT_TRUE(writer.save(2, test::refs(boxes), {}, world, true).is_ok());
  ASSERT_TRUE(writer.save(3, test::refs(boxes), {}, world, true).is_ok());
  EXPECT_EQ(writer.last_committed_step(), 2);
  ASSERT_TRUE(writer.wait().is_ok());
  EXPECT_EQ(writer.last_committed_step(), 3);
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_3\n");
  for (int s = 1; s <= 3; ++s) EXPECT_TRUE(verify_checkpoint(dir.path() + "/step_" + std::to_string(s)).is_ok());
}

// A write error on the writer thread: no commit, the error reaches wait(), and the next
// save() reports it instead of starting.
TEST(CheckpointWriter, FailedAsyncWriteCommitsNothing) {
  test::TempDir dir;
  SelfCommunicator world;
  bool fail = false;
  CheckpointWriterOptions opts = test::writer_options(dir.path());
  opts.chunk_bytes = 4096;
  opts.on_chunk = [&](int64_t written, int64_t) {
    return fail && written > 4096 ? Status::io_error("disk full (injected)") : Status::ok();
  };
  CheckpointWriter writer(opts);
  auto ts = test::make_tensors();
  ts[0].shape = {64, 40};
  ts[0].data.assign(64 * 40, 1.0f);
  const auto boxes = test::split(ts, 0);
  ASSERT_TRUE(writer.save(1, test::refs(boxes), {}, world, false).is_ok());
  fail = true;
  ASSERT_TRUE(writer.save(2, test::refs(boxes), {}, world, true).is_ok());
  Status st = writer.wait();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message(), "checkpoint " + dir.path() + "/step_2 not committed; rank 0: disk full (injected)");
  EXPECT_FALSE(fs::exists(dir.path() + "/step_2"));
  EXPECT_FALSE(fs::exists(dir.path() + "/step_2.tmp"));
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_1\n");

  ASSERT_TRUE(writer.save(3, test::refs(boxes), {}, world, true).is_ok());
  st = writer.save(4, test::refs(boxes), {}, world, true);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message(), "step_4 not started: checkpoint " + dir.path() +
                              "/step_3 not committed; rank 0: disk full (injected)");
  EXPECT_FALSE(writer.in_flight());
  fail = false;
  ASSERT_TRUE(writer.save(4, test::refs(boxes), {}, world, false).is_ok());
  EXPECT_EQ(test::read_text(dir.path() + "/latest"), "step_4\n");
}

// A stale step_N.tmp from a crash (with a rank file of a bigger world) is cleared, and
// re-saving an existing step replaces it whole.
TEST(CheckpointWriter, ClearsStaleTmpAndReplacesExistingStep) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const auto ts = test::make_tensors();
  fs::create_directories(dir.path() + "/step_7.tmp");
  test::write_text(dir.path() + "/step_7.tmp/rank_3.bin", "stale");
  const auto a = test::split(ts, 1);
  ASSERT_TRUE(writer.save(7, test::refs(a), {{"run", 1}}, world, false).is_ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/step_7/rank_3.bin"));
  const auto ts2 = test::make_tensors(0.25f);
  const auto b = test::split(ts2, 2);
  ASSERT_TRUE(writer.save(7, test::refs(b), {{"run", 2}}, world, false).is_ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/step_7.deleting"));
  expect_reads_back(dir.path() + "/step_7", ts2, 0);
  EXPECT_EQ(open_checkpoint(dir.path() + "/step_7")->trainer_state()["run"], 2);
}

}  // namespace
}  // namespace trident
