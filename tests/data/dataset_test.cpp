#include "data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "data/token_file.h"

#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

using TempDir = testing::ScratchDir;

std::vector<uint32_t> iota_tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(ResolveTokenFiles, DirectoryTakesBinFilesSortedByName) {
  TempDir dir;
  // Created out of order; a non-.bin file and a subdirectory are ignored.
  ASSERT_TRUE(write_token_file(dir.file("b_001.bin"), {1}, 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("a_010.bin"), {1}, 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("b_000.bin"), {1}, 7).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("notes.txt"), {1}, 1).is_ok());
  fs::create_directory(dir.file("sub.bin"));
  auto files = resolve_token_files(dir.path());
  ASSERT_TRUE(files.is_ok()) << files.status().message();
  EXPECT_EQ(files.value(), (std::vector<std::string>{dir.file("a_010.bin"), dir.file("b_000.bin"),
                                                     dir.file("b_001.bin")}));
}

TEST(ResolveTokenFiles, GlobMatchesSorted) {
  TempDir dir;
  for (const char* name : {"train_000002.bin", "train_000000.bin", "val_000000.bin",
                           "train_000001.bin"}) {
    ASSERT_TRUE(write_token_file(dir.file(name), {1}, 1).is_ok());
  }
  auto files = resolve_token_files(dir.file("train_*.bin"));
  ASSERT_TRUE(files.is_ok()) << files.status().message();
  EXPECT_EQ(files.value(),
            (std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin"),
                                      dir.file("train_000002.bin")}));
  files = resolve_token_files(dir.file("train_00000[02].bin"));
  ASSERT_TRUE(files.is_ok());
  EXPECT_EQ(files->size(), 2u);
  files = resolve_token_files(dir.file("?al_000000.bin"));
  ASSERT_TRUE(files.is_ok());
  EXPECT_EQ(files.value(), std::vector<std::string>{dir.file("val_000000.bin")});
}

TEST(ResolveTokenFiles, NoMatchNamesTheSpec) {
  TempDir dir;
  const std::string pattern = dir.file("shard_*.bin");
  auto files = resolve_token_files(pattern);
  ASSERT_FALSE(files.is_ok());
  EXPECT_EQ(files.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(files.status().message().rfind(pattern + ": ", 0), 0u) << files.status().message();

  files = resolve_token_files(dir.path());  // empty directory
  ASSERT_FALSE(files.is_ok());
  EXPECT_EQ(files.status().message().rfind(dir.path() + ": ", 0), 0u);

  auto ds = TokenDataset::open(dir.file("missing.bin"), 256);
  ASSERT_FALSE(ds.is_ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(ds.status().message().find(dir.file("missing.bin")), std::string::npos);
}

TEST(TokenDataset, ReadsSpanShardBoundaries) {
  TempDir dir;
  // Stream 0..(10+1+0+7+20-1) over shards of sizes 10, 1, 0, 7, 20 in mixed versions.
  const std::vector<size_t> sizes = {10, 1, 0, 7, 20};
  uint32_t next = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "s_%02zu.bin", i);
    ASSERT_TRUE(write_token_file(dir.file(name), iota_tokens(next, sizes[i]), i % 2 ? 7 : 1)
                    .is_ok());
    next += static_cast<uint32_t>(sizes[i]);
  }
  auto ds = TokenDataset::open(dir.path(), 1000);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  ASSERT_EQ(ds->num_tokens(), 38u);
  ASSERT_EQ(ds->files().size(), 5u);

  // Every (start, count) against the reference stream 0, 1, 2, ...
  for (uint64_t start = 0; start <= 38; ++start) {
    for (size_t count = 0; start + count <= 38; ++count) {
      std::vector<int32_t> out(count + 1, -7);
      Status st = ds->read(start, count, out.data());
      ASSERT_TRUE(st.is_ok()) << st.message();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], static_cast<int32_t>(start + i)) << start << "+" << i;
      }
      ASSERT_EQ(out[count], -7);  // nothing written past count
    }
  }
  std::vector<int32_t> out(5);
  Status st = ds->read(35, 5, out.data());
  EXPECT_FALSE(st.is_ok());
}

TEST(TokenDataset, OutOfVocabIdNamesFileAndPosition) {
  TempDir dir;
  ASSERT_TRUE(write_token_file(dir.file("a.bin"), iota_tokens(0, 50), 1).is_ok());
  std::vector<uint32_t> second = iota_tokens(0, 30);
  second[17] = 300;  // vocab is 256
  ASSERT_TRUE(write_token_file(dir.file("b.bin"), second, 1).is_ok());
  auto ds = TokenDataset::open(dir.file("*.bin"), 256);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();

  std::vector<int32_t> out(80);
  EXPECT_TRUE(ds->read(0, 67, out.data()).is_ok());  // stops just before the bad id
  Status st = ds->read(40, 40, out.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(), dir.file("b.bin") + ": token at position 17 has id 300 >= vocab size 256");
}

TEST(TokenDataset, BadShardNamesTheShard) {
  TempDir dir;
  ASSERT_TRUE(write_token_file(dir.file("a.bin"), {1, 2}, 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("b.bin"), {1, 2}, 1).is_ok());
  fs::resize_file(dir.file("b.bin"), 1025);
  auto ds = TokenDataset::open(dir.path(), 256);
  ASSERT_FALSE(ds.is_ok());
  EXPECT_EQ(ds.status().message().rfind(dir.file("b.bin") + ": truncated", 0), 0u)
      << ds.status().message();
}

}  // namespace
}  // namespace trident
