// The Megatron indexed-dataset reader (data/megatron_file.h) against the writer beside
// it, and its place among the specs of TokenDataset (data/dataset.h).
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "data/dataset.h"
#include "data/megatron_file.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

using testing::ScratchDir;

std::vector<uint32_t> read_all(const TokenDataset& d) {
  std::vector<int32_t> out(d.num_tokens());
  EXPECT_TRUE(d.read(0, out.size(), out.data()).is_ok());
  return std::vector<uint32_t>(out.begin(), out.end());
}

TEST(MegatronReader, RoundTripUint16) {
  ScratchDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7919) % 65536));
  ASSERT_TRUE(write_megatron_dataset(dir.file("m"), tokens.data(), tokens.size(), {1, 0, 499, 500})
                  .is_ok());
  auto index = read_megatron_index(dir.file("m.idx"), dir.file("m.bin"), 2000);
  ASSERT_TRUE(index.is_ok()) << index.status().message();
  EXPECT_EQ(index->dtype_code, kMegatronDtypeUint16);
  EXPECT_EQ(index->token_width, 2);
  EXPECT_EQ(index->sequences, 4u);
  EXPECT_EQ(index->doc_indices, 5u);
  EXPECT_EQ(index->tokens, 1000u);
  auto file = open_megatron_dataset(dir.file("m"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file->path(), dir.file("m.bin"));
  ASSERT_EQ(file->num_tokens(), 1000u);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(file->token(i), tokens[i]) << i;
}

TEST(MegatronReader, RoundTripInt32) {
  ScratchDir dir;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(100000 + i);
  ASSERT_TRUE(write_megatron_dataset(dir.file("m"), tokens.data(), tokens.size(), {100, 200}).is_ok());
  auto file = open_megatron_dataset(dir.file("m"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file->token_width(), 4);
  ASSERT_EQ(file->num_tokens(), 300u);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(file->token(i), uint32_t(tokens[i])) << i;
  auto ds = TokenDataset::open(dir.file("m"), 200000);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(read_all(*ds), std::vector<uint32_t>(tokens.begin(), tokens.end()));
}

TEST(MegatronReader, EmptyDatasetHoldsNoTokens) {
  ScratchDir dir;
  ASSERT_TRUE(write_megatron_dataset(dir.file("e"), static_cast<const uint16_t*>(nullptr), 0, {})
                  .is_ok());
  auto file = open_megatron_dataset(dir.file("e"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file->num_tokens(), 0u);
}

// Moves sequence 1 one token early (an overlap, within the .bin).
TEST(MegatronReader, NonContiguousPointersAreRefused) {
  ScratchDir dir;
  std::vector<uint16_t> tokens(10, 1);
  ASSERT_TRUE(write_megatron_dataset(dir.file("g"), tokens.data(), 10, {4, 6}).is_ok());
  {
    std::fstream f(dir.file("g.idx"), std::ios::in | std::ios::out | std::ios::binary);
    const int64_t pointer = 6;  // expected 8
    f.seekp(static_cast<std::streamoff>(kMegatronIndexHeaderBytes + 2 * 4 + 8));
    f.write(reinterpret_cast<const char*>(&pointer), 8);
  }
  auto file = open_megatron_dataset(dir.file("g"));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(file.status().message().find(dir.file("g.idx") +
                                         ": sequence_pointers[1] = 6, expected 8"),
            std::string::npos)
      << file.status().message();
}

TEST(MegatronReader, BinSizeMustMatchTheIndex) {
  ScratchDir dir;
  std::vector<uint16_t> tokens(10, 1);
  ASSERT_TRUE(write_megatron_dataset(dir.file("s"), tokens.data(), 10, {10}).is_ok());
  std::ofstream(dir.file("s.bin"), std::ios::app | std::ios::binary) << "xx";  // 2 more bytes
  auto file = open_megatron_dataset(dir.file("s"));
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().message().find(dir.file("s.bin") + ": 22 bytes, but the 1 sequences of " +
                                         dir.file("s.idx") + " cover 20 bytes"),
            std::string::npos)
      << file.status().message();
}

TEST(MegatronSpecs, PrefixBinIdxAndGlobsNameTheDatasetOnce) {
  ScratchDir dir;
  std::vector<uint16_t> tokens(50, 3);
  ASSERT_TRUE(write_megatron_dataset(dir.file("m"), tokens.data(), 50, {50}).is_ok());
  for (const std::string& spec : {dir.file("m"), dir.file("m.bin"), dir.file("m.idx"), dir.file("m*"),
                                 dir.path()}) {
    SCOPED_TRACE(spec);
    auto files = resolve_token_files(spec);
    ASSERT_TRUE(files.is_ok()) << files.status().message();
    EXPECT_EQ(*files, std::vector<std::string>{dir.file("m.bin")});
    auto ds = TokenDataset::open(spec, 256);
    ASSERT_TRUE(ds.is_ok()) << ds.status().message();
    EXPECT_EQ(ds->num_tokens(), 50u);
  }
  auto missing = resolve_token_files(dir.file("nope"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no such token file, directory or Megatron prefix"),
            std::string::npos);
}

}  // namespace
}  // namespace trident
