#include "data/token_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

using TempDir = testing::ScratchDir;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t header_word(const std::vector<char>& bytes, int i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

void set_header_word(std::vector<char>* bytes, int i, int32_t v) {
  std::memcpy(bytes->data() + 4 * i, &v, 4);
}

TEST(TokenFile, WritesTheLlmcLayoutVersion1) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  ASSERT_TRUE(write_token_file(path, {1, 2, 65535, 7}, 1).is_ok());
  std::vector<char> bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * 2);
  EXPECT_EQ(header_word(bytes, 0), 20240520);
  EXPECT_EQ(header_word(bytes, 1), 1);
  EXPECT_EQ(header_word(bytes, 2), 4);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_word(bytes, i), 0);
  uint16_t third;
  std::memcpy(&third, bytes.data() + 1024 + 4, 2);
  EXPECT_EQ(third, 65535);
  // No temp file left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(fs::path(path).parent_path()),
                          fs::directory_iterator()),
            1);
}

TEST(TokenFile, RoundTripsBothVersions) {
  TempDir dir;
  std::vector<uint32_t> small;
  for (uint32_t i = 0; i < 3000; ++i) small.push_back((i * 7919u) % 65536u);
  std::vector<uint32_t> large = small;
  large.push_back(128255u);
  large.push_back(4000000000u);

  ASSERT_TRUE(write_token_file(dir.file("v1.bin"), small, 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("v7.bin"), large, 7).is_ok());
  EXPECT_EQ(read_bytes(dir.file("v7.bin")).size(), 1024u + 4 * large.size());

  auto v1 = TokenFile::open(dir.file("v1.bin"));
  ASSERT_TRUE(v1.is_ok()) << v1.status().message();
  EXPECT_EQ(v1->version(), 1);
  EXPECT_EQ(v1->token_width(), 2);
  ASSERT_EQ(v1->num_tokens(), small.size());
  std::vector<uint32_t> got(small.size());
  v1->copy(0, got.size(), got.data());
  EXPECT_EQ(got, small);
  EXPECT_EQ(v1->token(2999), small[2999]);

  auto v7 = TokenFile::open(dir.file("v7.bin"));
  ASSERT_TRUE(v7.is_ok()) << v7.status().message();
  EXPECT_EQ(v7->version(), 7);
  EXPECT_EQ(v7->token_width(), 4);
  ASSERT_EQ(v7->num_tokens(), large.size());
  std::vector<uint32_t> part(5);
  v7->copy(large.size() - 5, 5, part.data());
  EXPECT_EQ(part, std::vector<uint32_t>(large.end() - 5, large.end()));

  // Move-only ownership: the moved-to object reads, the moved-from one is empty.
  TokenFile moved = std::move(v7.value());
  EXPECT_EQ(moved.token(large.size() - 1), 4000000000u);
  EXPECT_EQ(v7->num_tokens(), 0u);
}

TEST(TokenFile, EmptyShardIsValid) {
  TempDir dir;
  ASSERT_TRUE(write_token_file(dir.file("e.bin"), {}, 1).is_ok());
  auto f = TokenFile::open(dir.file("e.bin"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->num_tokens(), 0u);
}

TEST(TokenFile, WriterRejectsIdsTooLargeForVersion1AndUnknownVersions) {
  TempDir dir;
  Status st = write_token_file(dir.file("x.bin"), {1, 70000}, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("70000"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(dir.file("x.bin")));
  st = write_token_file(dir.file("x.bin"), {1}, 3);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
}

TEST(TokenFile, TruncatedFileNamesTheFileAndSizes) {
  TempDir dir;
  const std::string path = dir.file("cut.bin");
  ASSERT_TRUE(write_token_file(path, std::vector<uint32_t>(100, 5), 1).is_ok());
  std::vector<char> bytes = read_bytes(path);
  bytes.resize(bytes.size() - 3);  // 1221 bytes instead of 1224
  write_bytes(path, bytes);
  auto f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(f.status().message().rfind(path + ": truncated: expected 1224 bytes, found 1221", 0),
            0u)
      << f.status().message();
}

TEST(TokenFile, ShorterThanHeaderIsTruncated) {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  write_bytes(path, std::vector<char>(100, 0));
  auto f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().message().rfind(path + ": truncated", 0), 0u) << f.status().message();
}

TEST(TokenFile, TrailingBytesAreAnError) {
  TempDir dir;
  const std::string path = dir.file("long.bin");
  ASSERT_TRUE(write_token_file(path, {1, 2, 3}, 7).is_ok());
  std::vector<char> bytes = read_bytes(path);
  bytes.push_back(0);
  write_bytes(path, bytes);
  auto f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().message().rfind(path + ": trailing bytes: expected 1036 bytes, found 1037",
                                       0),
            0u)
      << f.status().message();
}

TEST(TokenFile, WrongMagicAndWrongVersion) {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  ASSERT_TRUE(write_token_file(path, {1, 2, 3}, 1).is_ok());
  std::vector<char> good = read_bytes(path);

  std::vector<char> bytes = good;
  set_header_word(&bytes, 0, 12345);
  write_bytes(path, bytes);
  auto f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(f.status().message().rfind(path + ": bad magic 12345", 0), 0u)
      << f.status().message();

  bytes = good;
  set_header_word(&bytes, 1, 7);  // uint16 magic with the uint32 version
  write_bytes(path, bytes);
  f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().message().rfind(path + ": unsupported version 7", 0), 0u)
      << f.status().message();
}

TEST(TokenFile, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  auto f = TokenFile::open(path);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(f.status().message().rfind(path + ": cannot open", 0), 0u) << f.status().message();
}

}  // namespace
}  // namespace trident
