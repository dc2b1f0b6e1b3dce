#include "data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.h"

#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

using TempDir = testing::ScratchDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<int32_t> read_all(const std::string& spec) {
  auto ds = TokenDataset::open(spec, 256);
  EXPECT_TRUE(ds.is_ok()) << ds.status().message();
  std::vector<int32_t> out(ds->num_tokens());
  EXPECT_TRUE(ds->read(0, out.size(), out.data()).is_ok());
  return out;
}

TEST(UnigramEntropy, MatchesClosedForms) {
  EXPECT_DOUBLE_EQ(unigram_entropy({}), 0.0);
  EXPECT_DOUBLE_EQ(unigram_entropy({5, 0, 0}), 0.0);
  EXPECT_NEAR(unigram_entropy({3, 3, 3, 3}), std::log(4.0), 1e-12);
  EXPECT_NEAR(unigram_entropy({1, 3}), -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-12);
}

TEST(Prepare, ByteTokensCountsSplitAndEntropy) {
  TempDir dir;
  const std::string a = "the quick brown fox jumps over the lazy dog.\n";
  const std::string b = "Pack my box with five dozen liquor jugs!\xC3\xA9\n";  // non-ASCII bytes
  write_text(dir.file("a.txt"), a);
  write_text(dir.file("b.txt"), b);
  const std::string text = a + b;  // files concatenated in the given order

  PrepareOptions options;
  options.inputs = {dir.file("a.txt"), dir.file("b.txt")};
  options.out_dir = dir.file("out");
  options.val_fraction = 0.1;
  options.shard_tokens = 16;
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();

  const uint64_t total = text.size();  // 45 + 43 = 88
  const uint64_t val = static_cast<uint64_t>(std::llround(total * 0.1));
  EXPECT_EQ(summary->files, 2u);
  EXPECT_EQ(summary->bytes, total);
  EXPECT_EQ(summary->vocab_size, 256);
  EXPECT_EQ(summary->train_tokens, total - val);
  EXPECT_EQ(summary->val_tokens, val);
  EXPECT_EQ(summary->train_shards.size(), (total - val + 15) / 16);
  EXPECT_EQ(summary->val_shards.size(), 1u);
  EXPECT_TRUE(fs::exists(dir.file("out/train_000000.bin")));
  EXPECT_TRUE(fs::exists(dir.file("out/val_000000.bin")));

  // The shards hold exactly the bytes, train first then val.
  std::vector<int32_t> train = read_all(dir.file("out/train_*.bin"));
  std::vector<int32_t> valid = read_all(dir.file("out/val_*.bin"));
  ASSERT_EQ(train.size() + valid.size(), total);
  for (size_t i = 0; i < total; ++i) {
    const int32_t got = i < train.size() ? train[i] : valid[i - train.size()];
    ASSERT_EQ(got, static_cast<int32_t>(static_cast<unsigned char>(text[i]))) << i;
  }

  // Entropy of the train prefix, counted independently.
  std::map<char, double> freq;
  for (size_t i = 0; i < total - val; ++i) freq[text[i]] += 1;
  double h = 0;
  for (auto& [c, n] : freq) h -= n / (total - val) * std::log(n / (total - val));
  EXPECT_NEAR(summary->unigram_entropy, h, 1e-9);
}

TEST(Prepare, RerunRemovesStaleShards) {
  TempDir dir;
  write_text(dir.file("a.txt"), std::string(100, 'x'));
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.path() + "/out/";
  options.shard_tokens = 10;
  ASSERT_TRUE(prepare_corpus(options).is_ok());
  EXPECT_TRUE(fs::exists(dir.file("out/train_000009.bin")));  // 95 tokens, 10 shards
  write_text(dir.file("out/keep.bin"), "not ours");
  options.shard_tokens = 50;
  auto again = prepare_corpus(options);
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(again->train_shards.size(), 2u);
  EXPECT_TRUE(fs::exists(dir.file("out/train_000001.bin")));
  EXPECT_FALSE(fs::exists(dir.file("out/train_000002.bin")));
  EXPECT_FALSE(fs::exists(dir.file("out/train_000009.bin")));
  EXPECT_TRUE(fs::exists(dir.file("out/keep.bin")));
  EXPECT_EQ(read_all(dir.file("out/train_*.bin")).size(), 95u);
}

// A killed run (kill -9) leaves its staging directory beside --out, or, before staging
// existed, a token spool inside it; the next run removes those of processes that are gone
// (pid 999999999 exceeds any pid_max) and leaves nothing of its own.
TEST(Prepare, RerunRemovesTemporariesOfDeadRuns) {
  TempDir dir;
  write_text(dir.file("a.txt"), std::string(100, 'x'));
  fs::create_directories(dir.file(".out.prepare.999999999"));
  write_text(dir.file(".out.prepare.999999999/train_000000.bin"), "partial");
  fs::create_directories(dir.file("out"));
  write_text(dir.file("out/.prepare_tokens.tmp.999999999"), "spool");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.file("out");
  options.format = "megatron";  // the path that spools its tokens
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_EQ(summary->train_shards, std::vector<std::string>{dir.file("out/train.bin")});
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"a.txt", "out"}));
  names.clear();
  for (const auto& e : fs::directory_iterator(dir.file("out"))) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"train.bin", "train.bin.meta.json", "train.idx",
                                          "val.bin", "val.bin.meta.json", "val.idx"}));
}

TEST(Prepare, ErrorsNameTheCulprit) {
  TempDir dir;
  write_text(dir.file("a.txt"), "hello world");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt"), dir.file("missing.txt")};
  options.out_dir = dir.file("out");
  auto r = prepare_corpus(options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(r.status().message().rfind(dir.file("missing.txt") + ": ", 0), 0u)
      << r.status().message();
  EXPECT_FALSE(fs::exists(dir.file("out")));  // nothing written before inputs are checked

  options.inputs = {dir.file("a.txt")};
  options.tokenizer = "gpt2";  // without the directory of its files
  r = prepare_corpus(options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("--vocab-dir"), std::string::npos);

  options.tokenizer = "byte";
  options.format = "parquet";
  r = prepare_corpus(options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_EQ(r.status().message(), "--format: unknown format 'parquet' (allowed: llmc, megatron)");
  options.format = "llmc";

  options.tokenizer = "byte";
  options.val_fraction = 1.0;
  r = prepare_corpus(options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--val-fraction"), std::string::npos);
}

}  // namespace
}  // namespace trident
