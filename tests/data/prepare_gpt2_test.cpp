// `prepare` with the GPT-2 tokenizer and the Megatron format: the token stream is
// <|endoftext|> + encode(file) per input file, independent of threads and read blocks,
// split as the byte path splits; the Megatron .idx is parsed here from the layout of
// Megatron-LM's indexed_dataset.py, not with Trident's writer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/gpt2_tokenizer.h"
#include "data/prepare.h"
#include "data/token_meta.h"
#include "tests/common/gpt2_files.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/tokenizer_test_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::gpt2_dir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

const Gpt2Tokenizer* tokenizer() {
  static Result<Gpt2Tokenizer> loaded = Gpt2Tokenizer::load_dir(gpt2_dir());
  return loaded.is_ok() ? &loaded.value() : nullptr;
}
#define REQUIRE_TOKENIZER() ASSERT_NE(tokenizer(), nullptr) << testing::gpt2_missing_hint()

std::vector<uint32_t> reference_stream(const std::vector<std::string>& files) {
  std::vector<uint32_t> ids;
  for (const std::string& f : files) {
    ids.push_back(kGpt2EndOfText);
    std::string text;
    sanitize_utf8(read_bytes(f), &text);
    tokenizer()->encode(text, &ids);
  }
  return ids;
}

std::vector<uint32_t> read_stream(const std::string& spec) {
  return testing::read_token_stream(spec, kGpt2VocabSize);
}

// Text with many lines, a stretch with no safe split longer than the test's read
// blocks, and ill-formed UTF-8 sitting near block ends.
std::string corpus_text(int seed) {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    text += "Line " + std::to_string(i * seed) + ": it's the " + (i % 3 ? "café" : "中文") +
            " story,   with  spaces\t and 😀.\n";
    if (i % 50 == 7) text += "\xe4\xbd\n\xff";  // truncated CJK, then a stray byte
    if (i % 97 == 3) text += "\n\n   indented\n";
  }
  text += std::string(9000, 'a') + " " + std::string(3000, ' ') + "end\n";
  return text;
}

TEST(PrepareGpt2, EndOfTextBeforeEachFileAndIdsIndependentOfThreadsAndBlocks) {
  REQUIRE_TOKENIZER();
  testing::ScratchDir dir;
  write_bytes(dir.file("a.txt"), corpus_text(1));
  write_bytes(dir.file("b.txt"), corpus_text(7));
  write_bytes(dir.file("c.txt"), "");  // an empty document is just its <|endoftext|>
  const std::vector<std::string> files = {dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")};
  const std::vector<uint32_t> want = reference_stream(files);
  ASSERT_GT(want.size(), 10000u);

  std::string first_train;
  for (auto [threads, block] : {std::pair{1, size_t{32} << 20}, std::pair{2, size_t{4096}},
                                std::pair{3, size_t{777}}}) {
    PrepareOptions options;
    options.inputs = files;
    options.out_dir = dir.file("out");
    options.tokenizer = "gpt2";
    options.vocab_dir = gpt2_dir();
    options.val_fraction = 0.1;
    options.shard_tokens = 5000;
    options.threads = threads;
    options.read_block_bytes = block;
    auto summary = prepare_corpus(options);
    ASSERT_TRUE(summary.is_ok()) << summary.status().message();
    EXPECT_EQ(summary->vocab_size, kGpt2VocabSize);
    EXPECT_EQ(summary->documents, 3u);
    EXPECT_EQ(summary->utf8_replacements, 32u);  // 8 x 2 per file
    EXPECT_EQ(summary->bytes, fs::file_size(files[0]) + fs::file_size(files[1]));
    const uint64_t val = static_cast<uint64_t>(std::llround(want.size() * 0.1));
    EXPECT_EQ(summary->val_tokens, val);
    EXPECT_EQ(summary->train_tokens, want.size() - val);
    EXPECT_EQ(summary->train_shards.size(), (want.size() - val + 4999) / 5000);

    std::vector<uint32_t> got = read_stream(dir.file("out/train_*.bin"));
    const std::vector<uint32_t> valid = read_stream(dir.file("out/val_*.bin"));
    EXPECT_EQ(got.size(), summary->train_tokens);
    got.insert(got.end(), valid.begin(), valid.end());
    ASSERT_EQ(got, want) << threads << " threads, read blocks of " << block;
    if (first_train.empty()) first_train = read_bytes(dir.file("out/train_000000.bin"));
    EXPECT_EQ(read_bytes(dir.file("out/train_000000.bin")), first_train);
    // No temp file left behind.
    for (const auto& e : fs::directory_iterator(dir.file("out"))) {
      EXPECT_EQ(e.path().filename().string().find(".prepare_tokens"), std::string::npos);
    }
    // Every shard keeps the .meta.json sidecar prepare wrote (they used to be removed as
    // stale, so every start rescanned the shards).
    for (const auto* shards : {&summary->train_shards, &summary->val_shards}) {
      for (const std::string& shard : *shards) {
        EXPECT_TRUE(fs::exists(token_meta_path(shard))) << token_meta_path(shard);
      }
    }
  }
}

template <typename T>
T take(const std::string& bytes, size_t* at) {
  T v;
  std::memcpy(&v, bytes.data() + *at, sizeof(T));
  *at += sizeof(T);
  return v;
}

TEST(PrepareGpt2, MegatronIndexedDatasetKeepsDocuments) {
  REQUIRE_TOKENIZER();
  testing::ScratchDir dir;
  const std::vector<std::string> texts = {"First document.\n", "Second one, a bit longer.\n",
                                          "Third.\n", "Fourth and last document here.\n"};
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    files.push_back(dir.file("d" + std::to_string(i) + ".txt"));
    write_bytes(files.back(), texts[i]);
  }
  const std::vector<uint32_t> want = reference_stream(files);
  std::vector<uint64_t> doc_lengths;
  for (const std::string& f : files) doc_lengths.push_back(reference_stream({f}).size());

  // Stale llm.c shards from an earlier run in the same directory go away.
  fs::create_directories(dir.file("out"));
  write_bytes(dir.file("out/train_000000.bin"), "old");
  PrepareOptions options;
  options.inputs = files;
  options.out_dir = dir.file("out");
  options.tokenizer = "gpt2";
  options.vocab_dir = gpt2_dir();
  options.format = "megatron";
  options.val_fraction = 0.3;
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_FALSE(fs::exists(dir.file("out/train_000000.bin")));
  EXPECT_EQ(summary->train_shards, std::vector<std::string>{dir.file("out/train.bin")});
  EXPECT_EQ(summary->val_shards, std::vector<std::string>{dir.file("out/val.bin")});
  const uint64_t train = summary->train_tokens;
  ASSERT_EQ(train + summary->val_tokens, want.size());

  // Expected documents per split: the one that straddles the split is cut there.
  std::vector<uint64_t> train_docs, val_docs;
  uint64_t start = 0;
  for (uint64_t len : doc_lengths) {
    if (start + len <= train) {
      train_docs.push_back(len);
    } else if (start >= train) {
      val_docs.push_back(len);
    } else {
      train_docs.push_back(train - start);
      val_docs.push_back(start + len - train);
    }
    start += len;
  }
  ASSERT_GE(val_docs.size(), 1u);

  for (const auto& [name, begin, docs] : {std::tuple{"train", uint64_t{0}, train_docs},
                                          std::tuple{"val", train, val_docs}}) {
    SCOPED_TRACE(name);
    const std::string idx = read_bytes(dir.file(std::string("out/") + name + ".idx"));
    const std::string bin = read_bytes(dir.file(std::string("out/") + name + ".bin"));
    const uint64_t s = docs.size();
    ASSERT_EQ(idx.size(), 9 + 8 + 1 + 8 + 8 + 4 * s + 8 * s + 8 * (s + 1));
    EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
    size_t at = 9;
    EXPECT_EQ(take<uint64_t>(idx, &at), 1u);  // version
    EXPECT_EQ(take<uint8_t>(idx, &at), 8u);   // DType.uint16
    EXPECT_EQ(take<uint64_t>(idx, &at), s);   // sequences
    EXPECT_EQ(take<uint64_t>(idx, &at), s + 1);  // document_indices entries
    int64_t pointer = 0;
    for (uint64_t i = 0; i < s; ++i) EXPECT_EQ(take<int32_t>(idx, &at), int32_t(docs[i])) << i;
    for (uint64_t i = 0; i < s; ++i) {
      EXPECT_EQ(take<int64_t>(idx, &at), pointer) << i;
      pointer += 2 * static_cast<int64_t>(docs[i]);
    }
    for (uint64_t i = 0; i <= s; ++i) EXPECT_EQ(take<int64_t>(idx, &at), int64_t(i));
    ASSERT_EQ(bin.size(), static_cast<size_t>(pointer));
    for (size_t i = 0; i < bin.size() / 2; ++i) {
      uint16_t id;
      std::memcpy(&id, bin.data() + 2 * i, 2);
      ASSERT_EQ(id, want[begin + i]) << i;
    }
  }
  // Each train document starts with <|endoftext|>.
  EXPECT_EQ(want[0], kGpt2EndOfText);
  EXPECT_EQ(want[doc_lengths[0]], kGpt2EndOfText);

  // The llm.c format afterwards removes the Megatron files.
  options.format = "llmc";
  ASSERT_TRUE(prepare_corpus(options).is_ok());
  EXPECT_FALSE(fs::exists(dir.file("out/train.idx")));
  EXPECT_FALSE(fs::exists(dir.file("out/val.bin")));
  EXPECT_EQ(read_stream(dir.file("out/train_*.bin")).size(), train);
}

TEST(PrepareGpt2, ByteTokensInMegatronFormat) {
  testing::ScratchDir dir;
  write_bytes(dir.file("a.txt"), "abc\xff");
  write_bytes(dir.file("b.txt"), "hello");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt"), dir.file("b.txt")};
  options.out_dir = dir.file("out");
  options.format = "megatron";
  options.val_fraction = 0.0;
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_EQ(summary->vocab_size, 256);
  EXPECT_EQ(summary->train_tokens, 9u);
  EXPECT_TRUE(summary->val_shards.empty());
  EXPECT_FALSE(fs::exists(dir.file("out/val.bin")));
  const std::string bin = read_bytes(dir.file("out/train.bin"));
  ASSERT_EQ(bin.size(), 18u);
  EXPECT_EQ(static_cast<unsigned char>(bin[6]), 0xFF);  // raw byte, no U+FFFD
  EXPECT_EQ(bin[7], 0);
  const std::string idx = read_bytes(dir.file("out/train.idx"));
  size_t at = 34;  // past the header: magic, version, dtype, two counts
  EXPECT_EQ(take<int32_t>(idx, &at), 4);  // documents = files, no separator token
  EXPECT_EQ(take<int32_t>(idx, &at), 5);
}

TEST(PrepareGpt2, MissingTokenizerFilesNameTheFile) {
  testing::ScratchDir dir;
  write_bytes(dir.file("a.txt"), "hello world");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.file("out");
  options.tokenizer = "gpt2";
  options.vocab_dir = dir.file("nowhere");
  auto r = prepare_corpus(options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_EQ(r.status().message(), dir.file("nowhere/encoder.json") + ": cannot open for reading");
  EXPECT_FALSE(fs::exists(dir.file("out")));
}

}  // namespace
}  // namespace trident
