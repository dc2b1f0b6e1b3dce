// The start-up vocabulary check (data/token_check.h) and the shard sidecars it trusts
// (data/token_meta.h), including those `trident prepare` writes, and the tokenizer they
// record: its vocabulary must fit model.vocab_size, one per dataset, and sidecars from
// before the record still count.
#include "data/token_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/token_file.h"
#include "data/token_meta.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

std::vector<uint32_t> ramp(size_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i % mod);
  return v;
}

TokenDataset open_dataset(const std::string& spec) {
  auto ds = TokenDataset::open(spec, 1 << 30);  // the reader's own check never fires here
  EXPECT_TRUE(ds.is_ok()) << ds.status().message();
  return std::move(ds).value();
}

TEST(CheckTokenIds, FindsTheLargestIdOfEveryWidthAcrossThreads) {
  ScratchDir dir;
  // 300k tokens: several OpenMP chunks; the maximum sits in the last, partial chunk.
  std::vector<uint32_t> a = ramp(300'001, 200);
  a[300'000] = 250;
  ASSERT_TRUE(write_token_file(dir.file("a.bin"), a, 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("b.bin"), {7, 70'000, 3}, 7).is_ok());
  auto check = check_token_ids(open_dataset(dir.path()), 60'000);
  ASSERT_FALSE(check.is_ok());  // b.bin's 70000
  check = check_token_ids(open_dataset(dir.file("a.bin")), 251);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->max_id, 250u);
  EXPECT_EQ(check->tokens, 300'001u);
  EXPECT_EQ(check->files_scanned, 1);
  EXPECT_EQ(check->scanned_bytes, 300'001u * 2);
  EXPECT_FALSE(check_token_ids(open_dataset(dir.file("a.bin")), 250).is_ok());
  // Above 65535 the uint16 shard needs no scan; the uint32 one still does.
  check = check_token_ids(open_dataset(dir.path()), 70'001);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->max_id, 70'000u);
  EXPECT_EQ(check->tokens, 300'004u);
  EXPECT_EQ(check->files_scanned, 1);
  EXPECT_EQ(check->files_skipped, 1);
  EXPECT_EQ(check->scanned_bytes, 3u * 4);
}

TEST(CheckTokenIds, NamesFileIdAndPositionOfTheFirstOffendingToken) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("train_000000.bin"), ramp(1000, 256), 1).is_ok());
  std::vector<uint32_t> bad = ramp(200'000, 256);
  bad[123'456] = 50'300;
  bad[150'000] = 50'310;  // larger, but later
  ASSERT_TRUE(write_token_file(dir.file("train_000001.bin"), bad, 1).is_ok());
  auto check = check_token_ids(open_dataset(dir.file("train_*.bin")), 50'257);
  ASSERT_FALSE(check.is_ok());
  EXPECT_EQ(check.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(check.status().message(),
            dir.file("train_000001.bin") +
                ": token id 50300 at position 123456 is >= model.vocab_size 50257 (largest id "
                "in this file: 50310)");

  Status st = check_token_ids_at_startup("data.train", open_dataset(dir.file("train_*.bin")), 50'257);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message().rfind("data.train " + dir.file("train_000001.bin") + ": token id 50300",
                               0),
            0u)
      << st.message();
}

TEST(CheckTokenIds, Uint16ShardsUnderALargeVocabularyNeedNoScan) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("a.bin"), {65'535, 1}, 1).is_ok());
  auto check = check_token_ids(open_dataset(dir.file("a.bin")), 65'536);
  ASSERT_TRUE(check.is_ok());
  EXPECT_EQ(check->files_skipped, 1);
  EXPECT_EQ(check->files_scanned, 0);
  EXPECT_EQ(check->scanned_bytes, 0u);
  // One id smaller and the same file needs its scan, and fails it.
  EXPECT_FALSE(check_token_ids(open_dataset(dir.file("a.bin")), 65'535).is_ok());
}

TEST(CheckTokenIds, TrustsAMatchingSidecarInsteadOfScanning) {
  ScratchDir dir;
  const std::string shard = dir.file("s.bin");
  ASSERT_TRUE(write_token_file(shard, {1, 2, 300}, 1).is_ok());
  // A sidecar that matches the shard's size is believed: the claimed max 9 hides the
  // real 300 (the reader's own per-batch check remains the backstop for such a lie).
  ASSERT_TRUE(write_token_meta(shard, {3, 9, kTokenFileHeaderBytes + 6, {}}).is_ok());
  auto check = check_token_ids(open_dataset(shard), 256);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->files_from_sidecar, 1);
  EXPECT_EQ(check->files_scanned, 0);
  EXPECT_EQ(check->max_id, 9u);
}

TEST(CheckTokenIds, IgnoresSidecarsThatDoNotMatchTheShard) {
  ScratchDir dir;
  const std::string shard = dir.file("s.bin");
  ASSERT_TRUE(write_token_file(shard, {1, 2, 300}, 1).is_ok());
  auto expect_scanned = [&](const std::string& why) {
    auto check = check_token_ids(open_dataset(shard), 256);
    ASSERT_FALSE(check.is_ok()) << why;
    EXPECT_NE(check.status().message().find("token id 300 at position 2"), std::string::npos)
        << why << ": " << check.status().message();
  };
  ASSERT_TRUE(write_token_meta(shard, {3, 9, kTokenFileHeaderBytes + 8, {}}).is_ok());
  expect_scanned("wrong byte count");
  ASSERT_TRUE(write_token_meta(shard, {4, 9, kTokenFileHeaderBytes + 6, {}}).is_ok());
  expect_scanned("wrong token count");
  std::ofstream(token_meta_path(shard)) << "{\"tokens\": 3, \"max_id\": 9";
  expect_scanned("torn sidecar");
  std::ofstream(token_meta_path(shard)) << "{\"tokens\": 3, \"max_id\": -1, \"bytes\": 1030}";
  expect_scanned("negative max_id");
  // Right sizes but older than the shard: the shard was rewritten after it.
  ASSERT_TRUE(write_token_meta(shard, {3, 9, kTokenFileHeaderBytes + 6, {}}).is_ok());
  fs::last_write_time(token_meta_path(shard),
                      fs::last_write_time(shard) - std::chrono::seconds(10));
  expect_scanned("stale sidecar");
}

TEST(CheckTokenIds, SidecarClaimingABadIdThatIsNotThereFallsBackToTheScan) {
  ScratchDir dir;
  const std::string shard = dir.file("s.bin");
  ASSERT_TRUE(write_token_file(shard, {1, 2, 3}, 1).is_ok());
  ASSERT_TRUE(write_token_meta(shard, {3, 5000, kTokenFileHeaderBytes + 6, {}}).is_ok());
  auto check = check_token_ids(open_dataset(shard), 256);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->max_id, 3u);
  EXPECT_EQ(check->files_scanned, 1);
}

TEST(Prepare, WritesASidecarPerShardThatTheCheckTrusts) {
  ScratchDir dir;
  std::ofstream(dir.file("a.txt"), std::ios::binary) << std::string(90, 'a') << "z"
                                                     << std::string(9, 'b');
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.file("out");
  options.shard_tokens = 50;
  options.val_fraction = 0.1;  // train = 90 'a' (2 shards), val = "z" + 9 'b'
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  for (const auto& [shard, max_id] : std::vector<std::pair<std::string, uint32_t>>{
           {"train_000000.bin", 'a'}, {"train_000001.bin", 'a'}, {"val_000000.bin", 'z'}}) {
    auto file = TokenFile::open(dir.file("out/" + shard));
    ASSERT_TRUE(file.is_ok()) << shard;
    auto meta = read_token_meta(file.value());
    ASSERT_TRUE(meta.has_value()) << shard;
    EXPECT_EQ(meta->max_id, max_id) << shard;
    EXPECT_EQ(meta->tokens, file->num_tokens()) << shard;
    EXPECT_EQ(meta->bytes, fs::file_size(dir.file("out/" + shard))) << shard;
  }
  // The sidecars are not shards: a glob over everything still opens.
  auto ds = TokenDataset::open(dir.file("out/train_*"), 256);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->files().size(), 2u);
  auto check = check_token_ids(ds.value(), 256);
  ASSERT_TRUE(check.is_ok());
  EXPECT_EQ(check->files_from_sidecar, 2);
  EXPECT_EQ(check->files_scanned, 0);
  // A vocabulary that excludes 'z' (122) fails on the val shard at the 'z'.
  auto val = check_token_ids(open_dataset(dir.file("out/val_*.bin")), 'z');
  ASSERT_FALSE(val.is_ok());
  EXPECT_NE(val.status().message().find("val_000000.bin: token id 122 at position 0 is >= "
                                        "model.vocab_size 122"),
            std::string::npos)
      << val.status().message();

  // A rerun into fewer shards removes the stale sidecars with the stale shards.
  options.shard_tokens = 100;
  ASSERT_TRUE(prepare_corpus(options).is_ok());
  EXPECT_FALSE(fs::exists(dir.file("out/train_000001.bin")));
  EXPECT_FALSE(fs::exists(dir.file("out/train_000001.bin.meta.json")));
  EXPECT_TRUE(fs::exists(dir.file("out/train_000000.bin.meta.json")));
}

// A shard whose ids fit but whose tokenizer has more ids than the model: the special
// tokens of the vocabulary may occur later (in other data, in generation), so the data's
// tokenizer decides, before any scan, and the message names the file and both sizes.
TEST(CheckTokenIds, TheDataTokenizerVocabularyMustFitTheModel) {
  ScratchDir dir;
  const std::string shard = dir.file("train_000000.bin");
  ASSERT_TRUE(write_token_file(shard, {100257, 5, 42}, 7).is_ok());
  const TokenizerRecord cl100k{"cl100k_base", "2239", 100277, 100257, ""};
  ASSERT_TRUE(write_token_meta(shard, {3, 100257, kTokenFileHeaderBytes + 12, cl100k}).is_ok());
  auto check = check_token_ids(open_dataset(shard), 100260);
  ASSERT_FALSE(check.is_ok());
  EXPECT_EQ(check.status().message(),
            shard + ": its tokenizer cl100k_base has 100277 ids, more than model.vocab_size 100260");
  Status st = check_token_ids_at_startup("data.train", open_dataset(shard), 100260);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message(), "data.train " + shard +
                              ": its tokenizer cl100k_base has 100277 ids, more than "
                              "model.vocab_size 100260");
  check = check_token_ids(open_dataset(shard), 100277);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  ASSERT_TRUE(check->tokenizer.has_value());
  EXPECT_EQ(check->tokenizer->name, "cl100k_base");
  EXPECT_EQ(check->tokenizer->document_token, 100257);
  EXPECT_EQ(check->files_from_sidecar, 1);

  // A second shard of another tokenizer in the same dataset.
  const std::string other = dir.file("train_000001.bin");
  ASSERT_TRUE(write_token_file(other, {1, 2}, 7).is_ok());
  ASSERT_TRUE(write_token_meta(other, {2, 2, kTokenFileHeaderBytes + 8,
                                       TokenizerRecord{"o200k_base", "446a", 200019, 199999, ""}})
                  .is_ok());
  check = check_token_ids(open_dataset(dir.file("train_*.bin")), 300000);
  ASSERT_FALSE(check.is_ok());
  EXPECT_EQ(check.status().message(),
            other + ": its tokenizer o200k_base (200019 ids) is not the one of " + shard +
                " (cl100k_base, 100277 ids)");
  // The same tokenizer named by another path is the same tokenizer.
  ASSERT_TRUE(write_token_meta(other, {2, 2, kTokenFileHeaderBytes + 8,
                                       TokenizerRecord{"/x/cl100k_base.tiktoken", "2239", 100277,
                                                       100257, ""}})
                  .is_ok());
  EXPECT_TRUE(check_token_ids(open_dataset(dir.file("train_*.bin")), 100277).is_ok());
}

// The byte tokenizer's record does not ask for 256 ids: ASCII data trains under 128.
TEST(CheckTokenIds, ByteDataNeedsOnlyItsIds) {
  ScratchDir dir;
  const std::string shard = dir.file("s.bin");
  ASSERT_TRUE(write_token_file(shard, {'a', 'z'}, 1).is_ok());
  ASSERT_TRUE(write_token_meta(shard, {2, 'z', kTokenFileHeaderBytes + 4,
                                       TokenizerRecord{"byte", "", 256, -1, ""}})
                  .is_ok());
  auto check = check_token_ids(open_dataset(shard), 128);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->files_from_sidecar, 1);
  EXPECT_FALSE(check_token_ids(open_dataset(shard), 'z').is_ok());
}

// Sidecars written before the tokenizer was recorded are still trusted for their max_id
// and say nothing about the tokenizer; a malformed record makes the sidecar untrusted.
TEST(CheckTokenIds, SidecarsWithoutATokenizerRecordKeepWorking) {
  ScratchDir dir;
  const std::string shard = dir.file("s.bin");
  ASSERT_TRUE(write_token_file(shard, {1, 2, 300}, 1).is_ok());
  std::ofstream(token_meta_path(shard)) << "{\"tokens\": 3, \"max_id\": 9, \"bytes\": "
                                        << kTokenFileHeaderBytes + 6 << "}\n";
  auto check = check_token_ids(open_dataset(shard), 10);
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  EXPECT_EQ(check->files_from_sidecar, 1);
  EXPECT_FALSE(check->tokenizer.has_value());
  for (const char* bad : {"\"tokenizer\": 5", "\"tokenizer\": {\"name\": \"x\"}",
                          "\"tokenizer\": {\"name\": 1, \"vocab_size\": 5}",
                          "\"tokenizer\": {\"name\": \"x\", \"vocab_size\": -5}"}) {
    std::ofstream(token_meta_path(shard)) << "{\"tokens\": 3, \"max_id\": 9, \"bytes\": "
                                          << kTokenFileHeaderBytes + 6 << ", " << bad << "}\n";
    check = check_token_ids(open_dataset(shard), 10);
    ASSERT_FALSE(check.is_ok()) << bad;  // scanned: the 300 is found
    EXPECT_NE(check.status().message().find("token id 300 at position 2"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace trident
