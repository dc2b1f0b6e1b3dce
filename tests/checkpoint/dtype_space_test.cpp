// Checkpoint boxes carry their dtype and memory space (docs/ARCHITECTURE.md "Memory, dtypes
// and streams"): bf16 and i32 tensors round-trip with a truthful manifest dtype, a reader
// refuses a destination of another dtype, and device boxes reach the host only through
// Ops: one download per box when saving, one upload per box when restoring.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "ckpt_test_util.h"
#include "comm/communicator.h"
#include "kernels/ops.h"

namespace trident {
namespace {

std::vector<bf16_t> bf16_values(int64_t n) {
  std::vector<bf16_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(float_to_bf16(0.25f * static_cast<float>(i) - 3.0f));
  return v;
}

TEST(CheckpointDtype, Bf16AndI32BoxesRoundTripWithTheirDtypeInTheManifest) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  // A [4, 6] bf16 tensor in two row boxes, an i32 vector and an f32 one, back to back in
  // one file (so the offsets mix 2- and 4-byte elements).
  const std::vector<bf16_t> h = bf16_values(24);
  const std::vector<int32_t> ids = {7, -1, 40000, 3, 12};
  const std::vector<float> f = {1.5f, -2.0f, 3.25f};
  std::vector<BoxRef> boxes = {{"param/h", {4, 6}, {0, 0}, {1, 6}, h.data()},
                               {"state/ids", {5}, {0}, {5}, ids.data()},
                               {"param/h", {4, 6}, {1, 0}, {3, 6}, h.data() + 6},
                               {"param/f", {3}, {0}, {3}, f.data()}};
  ASSERT_TRUE(writer.save(1, boxes, {}, world, /*async=*/true).is_ok());
  ASSERT_TRUE(writer.wait().is_ok());

  const std::string step_dir = dir.path() + "/step_1";
  const nlohmann::json m = nlohmann::json::parse(test::read_text(step_dir + "/manifest.json"));
  EXPECT_EQ(m["tensors"]["param/h"]["dtype"], "bf16");
  EXPECT_EQ(m["tensors"]["state/ids"]["dtype"], "i32");
  EXPECT_EQ(m["tensors"]["param/f"]["dtype"], "f32");
  EXPECT_FALSE(m.contains("dtype_bytes"));  // element widths come from each tensor's dtype
  EXPECT_EQ(m["files"][0]["bytes"], kRankFileHeaderBytes + 24 * 2 + 5 * 4 + 3 * 4);

  ASSERT_TRUE(verify_checkpoint(step_dir).is_ok());
  auto ckpt = open_checkpoint(step_dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->dtype("param/h").value(), DType::kBF16);
  // Resharded: rows 1..2, columns 2..5 cut across both boxes.
  std::vector<bf16_t> part(2 * 4);
  ASSERT_TRUE(ckpt->read_box("param/h", std::vector<int64_t>{1, 2}, std::vector<int64_t>{2, 4},
                             part.data()).is_ok());
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(part[r * 4 + c], h[(r + 1) * 6 + c + 2]) << r << "," << c;
  std::vector<int32_t> ids_back(5);
  ASSERT_TRUE(ckpt->read_box("state/ids", std::vector<int64_t>{0}, std::vector<int64_t>{5},
                             ids_back.data()).is_ok());
  EXPECT_EQ(ids_back, ids);
  std::vector<float> f_back(3);
  ASSERT_TRUE(ckpt->read_tensor("param/f", f_back.data()).is_ok());
  EXPECT_EQ(f_back, f);
  EXPECT_NE(inspect_checkpoint(ckpt.value()).find("bf16"), std::string::npos);
}

TEST(CheckpointDtype, ReaderRefusesADestinationOfAnotherDtype) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const std::vector<bf16_t> h = bf16_values(8);
  const std::vector<BoxRef> boxes = {{"adam_m/w", {8}, {0}, {8}, h.data()}};
  ASSERT_TRUE(writer.save(2, boxes, {}, world, false).is_ok());
  auto ckpt = open_checkpoint(dir.path() + "/step_2");
  ASSERT_TRUE(ckpt.is_ok());
  std::vector<float> out(8, -7.0f);
  Status st = ckpt->read_tensor("adam_m/w", out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("tensor 'adam_m/w' is bf16 in the checkpoint, but the destination "
                              "is f32"), std::string::npos) << st.message();
  EXPECT_EQ(out[0], -7.0f);  // nothing written

  // A device destination of the wrong dtype: refused before any upload.
  auto ops = make_cpu_ops(1);
  DeviceBuffer dst(*ops, 8 * sizeof(float));
  st = ckpt->read_box("adam_m/w", std::vector<int64_t>{0}, std::vector<int64_t>{8},
                      dst.as(DType::kF32), *ops);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("'adam_m/w' is bf16 in the checkpoint, but the destination is f32"),
            std::string::npos) << st.message();
  EXPECT_EQ(ops->transfer_counts().uploads, 0u);
}

TEST(CheckpointDtype, BoxesOfOneTensorMustAgreeOnTheDtype) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const std::vector<bf16_t> h = bf16_values(2);
  const std::vector<float> f = {1.0f, 2.0f};
  const std::vector<BoxRef> boxes = {{"param/w", {4}, {0}, {2}, h.data()},
                                     {"param/w", {4}, {2}, {2}, f.data()}};
  Status st = writer.save(3, boxes, {}, world, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("tensor 'param/w' has dtype bf16 in one box and f32"),
            std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step_3"));
}

TEST(CheckpointDevice, SnapshotDownloadsEachDeviceBoxOnceAndRestoreUploadsOnce) {
  test::TempDir dir;
  SelfCommunicator world;
  auto ops = make_cpu_ops(1);
  CheckpointWriterOptions options = test::writer_options(dir.path());
  options.ops = ops.get();
  CheckpointWriter writer(options);
  // Two f32 device boxes of one tensor, one bf16 device tensor, one empty box, one host box.
  std::vector<float> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i) + 1.0f;
  const std::vector<bf16_t> h = bf16_values(5);
  const std::vector<float> host = {9.0f};
  DeviceBuffer dw(*ops, w.size() * sizeof(float)), dh(*ops, h.size() * sizeof(bf16_t));
  ops->upload(dw.get(), w.data(), w.size() * sizeof(float));
  ops->upload(dh.get(), h.data(), h.size() * sizeof(bf16_t));
  const DevPtr pw = dw.as(DType::kF32);
  const std::vector<BoxRef> boxes = {{"param/w", {3, 4}, {0, 0}, {1, 4}, pw},
                                     {"param/w", {3, 4}, {1, 0}, {2, 4}, pw + 4},
                                     {"param/w", {3, 4}, {3, 0}, {0, 4}, pw + 12},
                                     {"param/h", {5}, {0}, {5}, dh.as(DType::kBF16)},
                                     {"param/s", {1}, {0}, {1}, host.data()}};
  for (int64_t step = 1; step <= 2; ++step) {  // the second save reuses the staging buffer
    const TransferCounts before = ops->transfer_counts();
    ASSERT_TRUE(writer.save(step, boxes, {}, world, /*async=*/true).is_ok());
    const TransferCounts after = ops->transfer_counts();
    EXPECT_EQ(after.downloads - before.downloads, 3u) << "one download per non-empty device box";
    EXPECT_EQ(after.download_bytes - before.download_bytes, 12 * 4u + 5 * 2u);
    EXPECT_EQ(after.uploads, before.uploads);
    ASSERT_TRUE(writer.wait().is_ok());
  }
  // Missing Ops: a device box is refused, naming the tensor.
  CheckpointWriter no_ops(test::writer_options(dir.path()));
  Status st = no_ops.save(3, boxes, {}, world, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("tensor 'param/w': box is in device memory and the checkpoint "
                              "writer has no Ops"), std::string::npos) << st.message();

  // Restore into device memory: one upload per box read, the bytes as saved.
  auto ckpt = open_checkpoint(dir.path() + "/step_2");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  DeviceBuffer back(*ops, 8 * sizeof(float));
  const TransferCounts before = ops->transfer_counts();
  ASSERT_TRUE(ckpt->read_box("param/w", std::vector<int64_t>{1, 0}, std::vector<int64_t>{2, 4},
                             back.as(DType::kF32), *ops).is_ok());
  EXPECT_EQ(ops->transfer_counts().uploads - before.uploads, 1u);
  EXPECT_EQ(ops->transfer_counts().upload_bytes - before.upload_bytes, 8 * 4u);
  std::vector<float> got(8);
  ops->download(got.data(), back.get(), got.size() * sizeof(float));
  EXPECT_EQ(got, std::vector<float>(w.begin() + 4, w.end()));
}

TEST(CheckpointDtype, DtypeBytesIsWrittenForAllF32AndChecked) {
  test::TempDir dir;
  SelfCommunicator world;
  CheckpointWriter writer(test::writer_options(dir.path()));
  const std::vector<float> f = {1.0f, 2.0f};
  ASSERT_TRUE(writer.save(4, std::vector<BoxRef>{{"param/f", {2}, {0}, {2}, f.data()}}, {}, world,
                          false).is_ok());
  const std::string path = dir.path() + "/step_4/manifest.json";
  // All f32: the field readers from before bf16 support require is still written.
  EXPECT_EQ(nlohmann::json::parse(test::read_text(path))["dtype_bytes"], 4);
  auto rewrite = [&](int dtype_bytes) {  // with a valid manifest checksum
    nlohmann::json j = nlohmann::json::parse(test::read_text(path));
    j.erase("manifest_checksum");
    j["dtype_bytes"] = dtype_bytes;
    const std::string body = j.dump();
    j["manifest_checksum"] = checksum_to_hex(checksum_bytes(body.data(), body.size()));
    test::write_text(path, j.dump(1));
  };
  EXPECT_TRUE(verify_checkpoint(dir.path() + "/step_4").is_ok());
  rewrite(2);
  Status st = open_checkpoint(dir.path() + "/step_4").status();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("unsupported dtype_bytes 2"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trident
