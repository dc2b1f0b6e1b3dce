// `prepare` with the tiktoken vocabularies: the token stream is the document token +
// encode(file) per input file (encode itself is checked against tiktoken in
// bpe_tokenizer_test.cpp), independent of threads and read blocks, in llm.c version 7
// (uint32) shards and Megatron int32 files since the ids exceed 65,535; read back through
// TokenDataset, and the Megatron .bin/.idx parsed here from Megatron's layout. Special-token
// text is ordinary text by default and the special id with allow_special, whatever the
// read blocks. The sidecars record the tokenizer (name or path, SHA-256 as sha256sum
// computes it, vocabulary size, document token). Then the errors of a bad --tokenizer or
// --tokenizer-pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe_vocabularies.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/token_meta.h"
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

std::vector<uint32_t> reference_stream(const LoadedTokenizer& tok, const std::vector<std::string>& files,
                                       bool allow_special = false) {
  std::vector<uint32_t> ids;
  for (const std::string& f : files) {
    ids.push_back(tok.document_token);
    std::string text;
    sanitize_utf8(read_bytes(f), &text);
    tok.bpe.encode(text, &ids, allow_special);
  }
  return ids;
}

// What `sha256sum FILE` prints (coreutils: an implementation that is not ours).
std::string sha256sum(const std::string& file) {
  std::string out;
  EXPECT_EQ(testing::run_capture("sha256sum " + file, &out), 0) << out;
  return out.substr(0, 64);
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

// Special-token text, also right after a newline, where a block may be cut when special
// tokens are ordinary text: with them matched, the text before one ends its subject there
// ("\n\n" before <|endoftext|> is one GPT-2 piece, before ordinary text two), so the cut
// must go elsewhere.
TEST(PrepareBpeSpecial, OrdinaryTextByDefaultTheSpecialIdWithAllowSpecial) {
  for (const std::string& spec : {std::string("llama3"), vocab_dir() + "/gpt2.tokenizer.json"}) {
    auto tok = load_vocabulary(spec, vocab_dir(), "");
    ASSERT_TRUE(tok.is_ok()) << testing::vocab_missing_hint() << ": " << tok.status().message();
    testing::ScratchDir dir;
    std::string text;
    for (int i = 0; i < 400; ++i) {
      text += (i % 4 ? "" : "\n<|endoftext|>") + std::string("Line ") + std::to_string(i) +
              ": text <|endoftext|> and <|eot_id|>.\n";
      if (i % 5 == 0) text += "<|begin_of_text|>\n<|start_header_id|>x\n";
    }
    dir.write("a.txt", text);
    dir.write("b.txt", "<|endoftext|>" + text + "\xff<|eot_id|>");
    const std::vector<std::string> files = {dir.file("a.txt"), dir.file("b.txt")};
    const uint32_t special = static_cast<uint32_t>(
        tok->bpe.special_id(spec == "llama3" ? "<|eot_id|>" : "<|endoftext|>"));
    for (bool allow : {false, true}) {
      const std::vector<uint32_t> want = reference_stream(*tok, files, allow);
      const auto specials = std::count(want.begin(), want.end(), special);
      if (allow) {
        EXPECT_GT(specials, 400) << spec;
      } else {
        // Only the document tokens (gpt2's is <|endoftext|>) are special ids.
        EXPECT_EQ(specials, special == tok->document_token ? 2 : 0) << spec;
      }
      for (auto [threads, block] : {std::pair{1, size_t{32} << 20}, std::pair{2, size_t{777}},
                                    std::pair{3, size_t{4096}}}) {
        PrepareOptions options;
        options.inputs = files;
        options.out_dir = dir.file("out");
        options.tokenizer = spec;
        options.vocab_dir = vocab_dir();
        options.val_fraction = 0;
        options.threads = threads;
        options.read_block_bytes = block;
        options.allow_special = allow;
        auto summary = prepare_corpus(options);
        ASSERT_TRUE(summary.is_ok()) << summary.status().message();
        EXPECT_EQ(testing::read_token_stream(dir.file("out/train_*.bin"), tok->bpe.vocab_size()), want)
            << spec << (allow ? " --allow-special, " : ", ") << threads << " threads, blocks of "
            << block;
      }
    }
  }
  PrepareOptions options;
  options.inputs = {"x"};
  options.out_dir = "y";
  options.allow_special = true;
  const Status s = prepare_corpus(options).status();
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_EQ(s.message(), "--allow-special: the byte tokenizer has no special tokens");
}

TEST(PrepareBpeSidecar, RecordsTheTokenizerOfEveryFormat) {
  testing::ScratchDir dir;
  dir.write("a.txt", corpus_text(3));
  struct Case {
    std::string tokenizer, format, shard, name, sha256;
    int64_t vocab, document;
  };
  const std::string json = vocab_dir() + "/gpt2.tokenizer.json";
  for (const Case& c : std::vector<Case>{
           {"llama3", "llmc", "train_000000.bin", "llama3", sha256sum(vocab_dir() + "/llama3.tiktoken"),
            128256, 128000},
           {json, "megatron", "train.bin", fs::absolute(json).lexically_normal().string(),
            sha256sum(json), 50257, 50256},
           {"byte", "llmc", "train_000000.bin", "byte", "", 256, -1},
           {"byte", "megatron", "val.bin", "byte", "", 256, -1}}) {
    PrepareOptions options;
    options.inputs = {dir.file("a.txt")};
    options.out_dir = dir.file("out");
    options.tokenizer = c.tokenizer;
    options.vocab_dir = vocab_dir();
    options.format = c.format;
    auto summary = prepare_corpus(options);
    ASSERT_TRUE(summary.is_ok()) << summary.status().message();
    auto file = c.format == "llmc" ? TokenFile::open(dir.file("out/" + c.shard))
                                   : TokenFile::open_raw(dir.file("out/" + c.shard), c.vocab > 65499 ? 4 : 2);
    ASSERT_TRUE(file.is_ok()) << file.status().message();
    auto meta = read_token_meta(file.value());
    ASSERT_TRUE(meta.has_value()) << c.tokenizer << " " << c.format;
    ASSERT_TRUE(meta->tokenizer.has_value()) << c.tokenizer << " " << c.format;
    EXPECT_EQ(meta->tokenizer->name, c.name);
    EXPECT_EQ(meta->tokenizer->sha256, c.sha256) << c.name;
    EXPECT_EQ(meta->tokenizer->vocab_size, c.vocab) << c.name;
    EXPECT_EQ(meta->tokenizer->document_token, c.document) << c.name;
    EXPECT_EQ(meta->tokens, file->num_tokens());
  }
  EXPECT_EQ(sha256sum(vocab_dir() + "/cl100k_base.tiktoken"),
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7");  // tiktoken's
}

// The SHA-256 of the sidecars: FIPS 180-2's example "abc", and sha256sum on files that
// end at every padding case and span several read buffers, alone and concatenated.
TEST(PrepareBpeSidecar, Sha256MatchesSha256sum) {
  testing::ScratchDir dir;
  dir.write("abc", "abc");
  auto abc = sha256_hex_of_files({dir.file("abc")});
  ASSERT_TRUE(abc.is_ok());
  EXPECT_EQ(*abc, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string big;
  for (int i = 0; big.size() < (size_t{3} << 20) + 17; ++i) big += std::to_string(i * 7919) + ",";
  dir.write("big", big);
  std::vector<std::string> all;
  for (size_t n : {size_t{0}, size_t{55}, size_t{56}, size_t{63}, size_t{64}, size_t{65}, size_t{119}}) {
    const std::string name = "f" + std::to_string(n);
    dir.write(name, big.substr(0, n));
    all.push_back(dir.file(name));
  }
  all.push_back(dir.file("big"));
  for (const std::string& f : all) {
    auto h = sha256_hex_of_files({f});
    ASSERT_TRUE(h.is_ok());
    EXPECT_EQ(*h, sha256sum(f)) << f;
  }
  std::string joined;
  for (const std::string& f : all) joined += read_bytes(f);
  dir.write("joined", joined);
  EXPECT_EQ(sha256_hex_of_files(all).value(), sha256sum(dir.file("joined")));
  EXPECT_EQ(sha256_hex_of_files({dir.file("none")}).status().message(),
            dir.file("none") + ": cannot open for reading");
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
                              "cl100k_base, o200k_base, llama3, or the path of a .tiktoken rank file or "
                              "a tokenizer.json)"},
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
