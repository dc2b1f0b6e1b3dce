// Sharded checkpoints across ranks: every rank saves different boxes (row shards of one
// tensor, column shards of another, one tensor on the last rank only), the commit
// gathers them into one manifest, and every rank reads back a different split
// (resharding). A write failure on one rank commits nothing and reaches every rank.
// EXPECTs only between collectives: an early return would desynchronize the ranks.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "tests/common/mpi_test_util.h"

namespace trident::test {
namespace {

namespace fs = std::filesystem;

// A directory every rank sees: rank 0 creates it and broadcasts the path.
std::string shared_temp_dir(Communicator& w) {
  std::vector<char> buf(512, '\0');
  if (w.rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "trident_ckpt_mpi_XXXXXX").string();
    const char* made = ::mkdtemp(tmpl.data());
    if (made) std::strncpy(buf.data(), made, buf.size() - 1);
  }
  w.broadcast(CommBuf::host(std::as_writable_bytes(std::span<char>(buf))), 0);
  return std::string(buf.data());
}

CheckpointWriterOptions writer_options(const std::string& dir) {
  CheckpointWriterOptions o;
  o.dir = dir;
  return o;
}

// [lo, hi) of part r of n split into p nearly equal parts.
std::pair<int64_t, int64_t> part(int64_t n, int r, int p) { return {n * r / p, n * (r + 1) / p}; }

float value(int tensor, int64_t index) { return seeded_value(77, tensor, static_cast<uint64_t>(index)); }

struct Shard {
  std::string tensor;
  std::vector<int64_t> shape, start, extent;
  std::vector<float> data;
};

Shard make_shard(const std::string& name, int id, std::vector<int64_t> shape,
                 std::vector<int64_t> start, std::vector<int64_t> extent) {
  Shard s{name, shape, start, extent, {}};
  if (shape.size() == 1) {
    for (int64_t i = 0; i < extent[0]; ++i) s.data.push_back(value(id, start[0] + i));
  } else {
    for (int64_t i = 0; i < extent[0]; ++i)
      for (int64_t j = 0; j < extent[1]; ++j)
        s.data.push_back(value(id, (start[0] + i) * shape[1] + start[1] + j));
  }
  return s;
}

// Rank r's boxes: rows of "a" [8, 6], columns of "b" [5, 7], all of "c" [4] on the last.
std::vector<Shard> save_split(int r, int p) {
  std::vector<Shard> out;
  auto [a0, a1] = part(8, r, p);
  out.push_back(make_shard("param/a", 0, {8, 6}, {a0, 0}, {a1 - a0, 6}));
  auto [b0, b1] = part(7, r, p);
  out.push_back(make_shard("adam_m/b", 1, {5, 7}, {0, b0}, {5, b1 - b0}));
  if (r == p - 1) out.push_back(make_shard("adam_v/c", 2, {4}, {0}, {4}));
  return out;
}

// Another split for reading: columns of "a", rows of "b", "c" everywhere.
std::vector<Shard> read_split(int r, int p) {
  std::vector<Shard> out;
  auto [a0, a1] = part(6, (r + 1) % p, p);
  out.push_back(make_shard("param/a", 0, {8, 6}, {0, a0}, {8, a1 - a0}));
  auto [b0, b1] = part(5, p - 1 - r, p);
  out.push_back(make_shard("adam_m/b", 1, {5, 7}, {b0, 0}, {b1 - b0, 7}));
  out.push_back(make_shard("adam_v/c", 2, {4}, {1}, {3}));
  return out;
}

std::vector<BoxRef> refs(const std::vector<Shard>& shards) {
  std::vector<BoxRef> out;
  for (const Shard& s : shards) out.push_back({s.tensor, s.shape, s.start, s.extent, s.data.data()});
  return out;
}

TEST(CheckpointMpi, SaveShardedReadResharded) {
  Communicator& w = world();
  const int r = w.rank(), p = w.size();
  const std::string dir = shared_temp_dir(w);
  CheckpointWriter writer(writer_options(dir));
  const auto shards = save_split(r, p);
  Status st = writer.save(3, refs(shards), {{"consumed_samples", 96}}, w, /*async=*/true);
  EXPECT_TRUE(st.is_ok()) << st.message();
  bool committed = false;
  // "Training steps" until the save commits; poll's answer is agreed, so every rank
  // leaves the loop at the same iteration.
  for (int i = 0; i < 20000 && !committed; ++i) {
    st = writer.poll(&committed);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) break;
    if (!committed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(committed);
  EXPECT_EQ(writer.last_committed_step(), 3);
  w.barrier();

  Result<Checkpoint> ckpt = open_checkpoint(dir + "/step_3");
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  if (ckpt.is_ok()) {
    EXPECT_EQ(ckpt->manifest().world_size, p);
    EXPECT_EQ(ckpt->manifest().files.size(), static_cast<size_t>(p));
    EXPECT_EQ(ckpt->trainer_state()["consumed_samples"], 96);
    for (const Shard& want : read_split(r, p)) {
      std::vector<float> got(want.data.size(), -9.0f);
      st = ckpt->read_box(want.tensor, want.start, want.extent, got.data());
      EXPECT_TRUE(st.is_ok()) << st.message();
      EXPECT_EQ(got, want.data) << want.tensor;
    }
  }
  if (r == 0) {
    st = verify_checkpoint(dir + "/step_3");
    EXPECT_TRUE(st.is_ok()) << st.message();
  }

  // A write failure on the last rank: every rank gets the same error, nothing commits.
  CheckpointWriterOptions opts = writer_options(dir);
  opts.on_chunk = [&](int64_t, int64_t) {
    return r == p - 1 ? Status::io_error("injected failure") : Status::ok();
  };
  CheckpointWriter failing(opts);
  st = failing.save(4, refs(shards), {}, w, /*async=*/false);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message(), "checkpoint " + dir + "/step_4 not committed; rank " +
                              std::to_string(p - 1) + ": injected failure");
  w.barrier();
  EXPECT_FALSE(fs::exists(dir + "/step_4"));
  EXPECT_FALSE(fs::exists(dir + "/step_4.tmp"));
  Result<std::string> latest = find_latest_valid(dir, nullptr);
  EXPECT_TRUE(latest.is_ok());
  if (latest.is_ok()) {
    EXPECT_EQ(latest.value(), dir + "/step_3");
  }
  w.barrier();
  if (r == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace trident::test
