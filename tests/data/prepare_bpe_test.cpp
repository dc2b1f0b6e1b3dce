// `prepare` with the tiktoken vocabularies: the token stream is the document token +
// encode(file) per input file (encode itself is checked against tiktoken in
// bpe_tokenizer_test.cpp), independent of threads and read blocks, in llm.c version 7
// (uint32) shards and Megatron int32 files since the ids exceed 65,535; read back through
// TokenDataset, and the Megatron .bin/.idx parsed here from Megatron's layout. Then the
// errors of a bad --tokenizer or --tokenizer-pattern.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe_vocabularies.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/data/vocab_files.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::read_bytes;
using testing::vocab_dir;

// Lines of prose, code and CJK with ids far above 65,535, '\n/' (no o200k split), a long
// stretch without a safe split, and ill-formed UTF-8.
std::string corpus_text(int seed) {
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += "Line " + std::to_string(i * seed) + ": it's the " + (i % 3 ? "café" : "中文文本") +
            " story,   with  spaces\t and 😀 <|endoftext|>.\n";
    if (i % 40 == 7) text += "x;\n/path/to\n\xe4\xbd\n\xff";
    if (i % 97 == 3) text += "\n\n   indented()\n";
  }
  text += std::string(9000, 'a') + " " + std::string(3000, ' ') + "end\n";
  return text;
}

std::vector<uint32_t> reference_stream(const LoadedTokenizer& tok, const std::vector<std::string>& files) {
  std::vector<uint32_t> ids;
  for (const std::string& f : files) {
    ids.push_back(tok.document_token);
    std::string text;
    sanitize_utf8(read_bytes(f), &text);
    tok.bpe.encode(text, &ids);
  }
  return ids;
}

class PrepareBpe : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Tiktoken, PrepareBpe,
                         ::testing::Values("cl100k_base", "o200k_base", "llama3"));

TEST_P(PrepareBpe, Uint32ShardsWithDocumentTokensIndependentOfThreadsAndBlocks) {
  auto tok = load_vocabulary(GetParam(), vocab_dir(), "");
  ASSERT_TRUE(tok.is_ok()) << testing::vocab_missing_hint() << ": " << tok.status().message();
  testing::ScratchDir dir;
  dir.write("a.txt", corpus_text(1));
  dir.write("b.txt", corpus_text(7));
  dir.write("c.txt", "");
  const std::vector<std::string> files = {dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")};
  const std::vector<uint32_t> want = reference_stream(*tok, files);
  ASSERT_GT(want.size(), 10000u);
  ASSERT_GT(*std::max_element(want.begin(), want.end()), 65535u);  // needs uint32

  for (auto [threads, block] : {std::pair{1, size_t{32} << 20}, std::pair{2, size_t{4096}},
                                std::pair{3, size_t{777}}}) {
    PrepareOptions options;
    options.inputs = files;
    options.out_dir = dir.file("out");
    options.tokenizer = GetParam();
    options.vocab_dir = vocab_dir();
    options.val_fraction = 0.1;
    options.shard_tokens = 5000;
    options.threads = threads;
    options.read_block_bytes = block;
    auto summary = prepare_corpus(options);
    ASSERT_TRUE(summary.is_ok()) << summary.status().message();
    EXPECT_EQ(summary->vocab_size, tok->bpe.vocab_size());
    EXPECT_EQ(summary->documents, 3u);
    EXPECT_EQ(summary->utf8_replacements, 32u);  // 8 x 2 per file
    EXPECT_EQ(summary->train_tokens + summary->val_tokens, want.size());
    auto shard = TokenFile::open(summary->train_shards.at(0));
    ASSERT_TRUE(shard.is_ok()) << shard.status().message();
    EXPECT_EQ(shard->version(), 7);
    EXPECT_EQ(shard->token_width(), 4);
    std::vector<uint32_t> got = testing::read_token_stream(dir.file("out/train_*.bin"), tok->bpe.vocab_size());
    const std::vector<uint32_t> valid = testing::read_token_stream(dir.file("out/val_*.bin"), tok->bpe.vocab_size());
    got.insert(got.end(), valid.begin(), valid.end());
    ASSERT_EQ(got, want) << threads << " threads, read blocks of " << block;
  }
  // A vocabulary bound below the largest id is refused on reading.
  auto small = TokenDataset::open(dir.file("out/train_*.bin"), 65536);
  ASSERT_TRUE(small.is_ok()) << small.status().message();
  std::vector<int32_t> all(small->num_tokens());
  EXPECT_FALSE(small->read(0, all.size(), all.data()).is_ok());

  // Megatron: int32 tokens (dtype code 4), one sequence per document.
  PrepareOptions options;
  options.inputs = files;
  options.out_dir = dir.file("meg");
  options.tokenizer = GetParam();
  options.vocab_dir = vocab_dir();
  options.format = "megatron";
  options.val_fraction = 0;
  auto summary = prepare_corpus(options);
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  const std::string idx = read_bytes(dir.file("meg/train.idx"));
  const std::string bin = read_bytes(dir.file("meg/train.bin"));
  ASSERT_GT(idx.size(), 9u + 8 + 1);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(static_cast<uint8_t>(idx[17]), 4u);  // DType.int32
  ASSERT_EQ(bin.size(), 4 * want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    int32_t id;
    std::memcpy(&id, bin.data() + 4 * i, 4);
    ASSERT_EQ(id, static_cast<int32_t>(want[i])) << i;
  }
  EXPECT_EQ(testing::read_token_stream(dir.file("meg/train"), tok->bpe.vocab_size()), want);
}

TEST(PrepareBpeErrors, TokenizerAndPatternNameTheOption) {
  testing::ScratchDir dir;
  dir.write("a.txt", "Hello world.\n");
  PrepareOptions options;
  options.inputs = {dir.file("a.txt")};
  options.out_dir = dir.file("out");
  auto run = [&](const std::string& tokenizer, const std::string& pattern,
                 const std::string& vocab) {
    options.tokenizer = tokenizer;
    options.tokenizer_pattern = pattern;
    options.vocab_dir = vocab;
    return prepare_corpus(options).status();
  };
  struct Case {
    std::string tokenizer, pattern, vocab, want;
  };
  for (const Case& c : std::vector<Case>{
           {"cl100k", "", "", "--tokenizer: unknown tokenizer 'cl100k' (allowed: byte, gpt2, "
                              "cl100k_base, o200k_base, llama3, or the path of a .tiktoken rank file)"},
           {"o200k_base", "", "", "--tokenizer o200k_base needs the directory of o200k_base.tiktoken "
                                  "(--vocab-dir)"},
           {"cl100k_base", "cl100k", dir.path(), "--tokenizer-pattern: only for a rank file path, "
                                                 "not for --tokenizer cl100k_base"},
           {dir.file("x.tiktoken"), "", "", "--tokenizer " + dir.file("x.tiktoken") +
                                                ": a rank file needs --tokenizer-pattern "
                                                "gpt2|cl100k|o200k|llama3 (the file does not say which)"},
           {dir.file("x.tiktoken"), "o300k", "", "unknown pre-tokenizer pattern 'o300k' (allowed: "
                                                 "gpt2, cl100k, o200k, llama3)"},
           {dir.file("x.tiktoken"), "cl100k", "", dir.file("x.tiktoken") + ": cannot open for reading"},
           {"llama3", "", dir.path(), dir.path() + "/llama3.tiktoken: cannot open for reading"}}) {
    const Status s = run(c.tokenizer, c.pattern, c.vocab);
    EXPECT_EQ(s.exit_code(), 2) << c.tokenizer;
    EXPECT_EQ(s.message(), c.want) << c.tokenizer;
  }
  EXPECT_FALSE(fs::exists(dir.file("out")));
}

}  // namespace
}  // namespace trident
