// The byte-level BPE engine with tiktoken's vocabularies against references we did not
// write: ids committed from the npm tiktoken package (OpenAI's Rust core as WebAssembly;
// tests/reference/bpe/*.ids, made by tests/reference/bpe_reference_encode.js), the same
// oracle run live on generated text, and for llama3 also llama3-tokenizer-js's own
// JavaScript encoder. Then the engine's own contracts: the safe splits of every pattern,
// parallel = serial, decode(encode(x)) = x, special tokens only when allowed, and the
// errors of a bad rank file.
//
// The rank files and oracle packages come from scripts/fetch_vocabs.sh (setup.sh runs it).
// Without them these tests FAIL, saying so. Regenerate the committed ids:
//   for e in cl100k_base o200k_base llama3; do
//     node tests/reference/bpe_reference_encode.js --encoding $e tests/reference/bpe/mixed.txt
//       > tests/reference/bpe/mixed.$e.ids
//     node tests/reference/bpe_reference_encode.js --encoding $e
//       tests/reference/gpt2/invalid_utf8.txt > tests/reference/bpe/invalid_utf8.$e.ids; done
// (each node command on one line).
#include "data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/bpe_vocabularies.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/bpe_test_util.h"
#include "tests/data/vocab_files.h"

namespace trident {
namespace {

using testing::assigned_only;
using testing::expect_same_ids;
using testing::fixture;
using testing::generated_text;
using testing::have_node;
using testing::parse_ids;
using testing::read_bytes;
using testing::reference_lines;
using testing::sanitized;
using testing::vocab_dir;

// Loaded once per name for the whole binary (o200k's file has 200k lines).
const LoadedTokenizer* vocabulary(const std::string& name) {
  static std::map<std::string, Result<LoadedTokenizer>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_vocabulary(name, vocab_dir(), "")).first;
  return it->second.is_ok() ? &it->second.value() : nullptr;
}

#define REQUIRE_VOCABULARY(name)                                                  \
  ASSERT_NE(vocabulary(name), nullptr)                                            \
      << testing::vocab_missing_hint() << ": "                                    \
      << load_vocabulary(name, vocab_dir(), "").status().message();               \
  const BpeTokenizer& tok = vocabulary(name)->bpe

std::vector<uint32_t> encode(const BpeTokenizer& tok, const std::string& text,
                             bool allow_special = false) {
  std::vector<uint32_t> ids;
  tok.encode(text, &ids, allow_special);
  return ids;
}

// The live oracle's ids for each file: encode_ordinary, then encode(..., "all") for the
// special_files. One node process: loading the package takes a second or two.
std::vector<std::vector<uint32_t>> reference_ids(const std::string& encoding,
                                                 std::vector<std::string> files,
                                                 const std::string& extra = "",
                                                 const std::vector<std::string>& special_files = {}) {
  std::string cmd = "node " + fixture("bpe_reference_encode.js") + " --dir " + vocab_dir() +
                    " --encoding " + encoding + " " + extra;
  for (const std::string& f : files) cmd += " " + f;
  if (!special_files.empty()) cmd += " --allow-special";
  for (const std::string& f : special_files) cmd += " " + f;
  files.insert(files.end(), special_files.begin(), special_files.end());
  return reference_lines(cmd, files.size());
}

class Vocabulary : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Tiktoken, Vocabulary,
                         ::testing::Values("cl100k_base", "o200k_base", "llama3"));

TEST_P(Vocabulary, MatchesCommittedReferenceIds) {
  REQUIRE_VOCABULARY(GetParam());
  for (const auto& [text_file, ids_file] :
       {std::pair{fixture("bpe/mixed.txt"), "bpe/mixed." + GetParam() + ".ids"},
        std::pair{fixture("gpt2/invalid_utf8.txt"), "bpe/invalid_utf8." + GetParam() + ".ids"}}) {
    const std::vector<uint32_t> want = parse_ids(read_bytes(fixture(ids_file)));
    ASSERT_GT(want.size(), 20u) << ids_file;
    expect_same_ids(tok, encode(tok, sanitized(read_bytes(text_file))), want, ids_file);
  }
}

TEST_P(Vocabulary, MatchesTiktokenLive) {
  REQUIRE_VOCABULARY(GetParam());
  if (!have_node()) GTEST_SKIP() << "node not installed; the committed reference ids still cover the encoder";
  testing::ScratchDir dir;
  const std::string text = generated_text(7, 60000) + testing::long_runs();
  dir.write("gen.txt", text);
  dir.write("random.txt", assigned_only(testing::random_utf8(5, 20000)));
  const std::vector<std::string> files = {dir.file("gen.txt"), dir.file("random.txt"),
                                          fixture("bpe/mixed.txt"), fixture("gpt2/invalid_utf8.txt")};
  // The last one again with special tokens allowed: tiktoken's encode(text, "all").
  const auto want = reference_ids(GetParam(), files, "", {dir.file("gen.txt")});
  testing::expect_oracle_ids(tok, files, text, want);
}

// A second oracle for Llama 3, with a different algorithm: llama3-tokenizer-js runs Hugging
// Face's merge list (not ranks) and matches special tokens always. Its regex is
// JavaScript's, whose \s has U+FEFF and lacks U+0085, and whose (?i:) is spelled as ASCII
// case pairs: the text avoids exactly those characters.
TEST(Llama3, MatchesLlama3TokenizerJs) {
  REQUIRE_VOCABULARY("llama3");
  if (!have_node()) GTEST_SKIP() << "node not installed; the committed reference ids still cover the encoder";
  testing::ScratchDir dir;
  std::string text;
  for (const std::string& piece : {generated_text(3, 40000), assigned_only(testing::random_utf8(9, 10000))}) {
    text += testing::without_js_regex_differences(piece);
  }
  dir.write("gen.txt", text);
  const auto want = reference_ids("llama3", {dir.file("gen.txt")}, "--engine llama3-tokenizer-js");
  ASSERT_EQ(want.size(), 1u);
  ASSERT_GT(want[0].size(), 10000u);
  expect_same_ids(tok, encode(tok, sanitized(text), true), want[0], "llama3-tokenizer-js");
}

TEST_P(Vocabulary, DecodeInvertsEncode) {
  REQUIRE_VOCABULARY(GetParam());
  for (const std::string& text : {read_bytes(fixture("bpe/mixed.txt")), generated_text(3, 100000),
                                  testing::random_utf8(5, 20000)}) {
    ASSERT_EQ(sanitized(text), text);  // valid UTF-8 to begin with
    EXPECT_EQ(tok.decode(encode(tok, text)), text);
    EXPECT_EQ(tok.decode(encode(tok, text, true)), text);
  }
}

TEST_P(Vocabulary, ParallelEqualsSerialAndBlocksCutAtSafeSplits) {
  REQUIRE_VOCABULARY(GetParam());
  const std::string text = generated_text(11, 1 << 20);  // 4 pieces of 256 KiB
  const std::vector<uint32_t> serial = encode(tok, text);
  for (int threads : {2, 3, 8}) {
    std::vector<uint32_t> parallel;
    tok.encode_parallel(text, threads, &parallel);
    ASSERT_EQ(parallel, serial) << threads << " threads";
  }
  size_t cut = text.size() / 2;
  while (!tok.safe_split(text, cut)) ++cut;
  std::vector<uint32_t> head, tail;
  tok.encode_parallel(std::string_view(text).substr(0, cut + 1), 2, &head, cut);
  tok.encode_parallel(std::string_view(text).substr(cut), 2, &tail);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, serial);
}

// The claim behind safe_split, checked at every safe split of many short texts dense in
// newlines, punctuation and '/': the text cut there (with one byte of look-ahead) encodes
// as the whole does. The pattern's own rule is tested, and o200k's tighter one is shown
// necessary: "\n/" after punctuation is one o200k match.
TEST_P(Vocabulary, EverySafeSplitIsAMatchBoundary) {
  REQUIRE_VOCABULARY(GetParam());
  size_t checked = 0;
  for (uint32_t seed = 0; seed < 500; ++seed) {
    const std::string text = generated_text(100 + seed, 200);
    const std::vector<uint32_t> whole = encode(tok, text);
    for (size_t p = 1; p < text.size(); ++p) {
      if (!tok.safe_split(text, p)) continue;
      std::vector<uint32_t> ids;
      tok.encode_parallel(std::string_view(text).substr(0, p + 1), 1, &ids, p);
      tok.encode(std::string_view(text).substr(p), &ids);
      ASSERT_EQ(ids, whole) << "split at " << p << " of " << ::testing::PrintToString(text);
      ++checked;
    }
  }
  EXPECT_GT(checked, 800u);
  if (tok.pattern() == BpePattern::kO200k) {
    EXPECT_FALSE(tok.safe_split(";\n/x", 2));
    EXPECT_EQ(encode(tok, ";\n/").size(), 1u) << "one match, so '/' after '\\n' is no split";
  }
}

TEST(BpeVocabularies, SizesSpecialTokensAndDocumentTokens) {
  struct Want {
    const char* name;
    int64_t vocab;
    uint32_t document;
    const char* document_text;
  };
  for (const Want& w : {Want{"cl100k_base", 100277, 100257, "<|endoftext|>"},
                        Want{"o200k_base", 200019, 199999, "<|endoftext|>"},
                        Want{"llama3", 128256, 128000, "<|begin_of_text|>"}}) {
    REQUIRE_VOCABULARY(w.name);
    EXPECT_EQ(tok.vocab_size(), w.vocab) << w.name;
    EXPECT_EQ(vocabulary(w.name)->document_token, w.document) << w.name;
    EXPECT_EQ(tok.decode({w.document}), w.document_text) << w.name;
    // Special text is ordinary text unless allowed.
    const std::string text = std::string("a") + w.document_text + "b";
    const std::vector<uint32_t> ordinary = encode(tok, text);
    EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), w.document), 0) << w.name;
    EXPECT_EQ(tok.decode(ordinary), text);
    EXPECT_EQ(encode(tok, text, true),
              (std::vector<uint32_t>{encode(tok, "a")[0], w.document, encode(tok, "b")[0]}))
        << w.name;
  }
  {
    REQUIRE_VOCABULARY("llama3");
    EXPECT_EQ(tok.special_id("<|eot_id|>"), 128009);
    EXPECT_EQ(tok.special_id("<|reserved_special_token_247|>"), 128255);
  }
}

// A rank file given by path: the pattern is required, and a file with a named
// vocabulary's rank count gets that vocabulary's special tokens.
TEST(BpeVocabularies, RankFilePathNeedsAPattern) {
  REQUIRE_VOCABULARY("cl100k_base");
  const std::string path = vocab_dir() + "/cl100k_base.tiktoken";
  auto no_pattern = load_vocabulary(path, "", "");
  ASSERT_FALSE(no_pattern.is_ok());
  EXPECT_EQ(no_pattern.status().exit_code(), 2);
  EXPECT_NE(no_pattern.status().message().find("--tokenizer-pattern"), std::string::npos);
  auto bad_pattern = load_vocabulary(path, "", "cl100");
  ASSERT_FALSE(bad_pattern.is_ok());
  EXPECT_NE(bad_pattern.status().message().find("allowed: gpt2, cl100k, o200k, llama3"),
            std::string::npos);
  auto named_with_pattern = load_vocabulary("cl100k_base", vocab_dir(), "cl100k");
  ASSERT_FALSE(named_with_pattern.is_ok());
  EXPECT_EQ(named_with_pattern.status().exit_code(), 2);

  auto by_path = load_vocabulary(path, "", "cl100k");
  ASSERT_TRUE(by_path.is_ok()) << by_path.status().message();
  EXPECT_EQ(by_path->document_token, 100257u);
  const std::string text = read_bytes(fixture("bpe/mixed.txt"));
  EXPECT_EQ(encode(by_path->bpe, text), encode(tok, text));

  // Another rank count: <|endoftext|> right after the ranks.
  testing::ScratchDir dir;
  std::string small;
  for (int b = 0; b < 256; ++b) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    small += std::string{k[b >> 2], k[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  small += "IGE= 256\n";  // " a"
  dir.write("small.tiktoken", small);
  auto tiny = load_vocabulary(dir.file("small.tiktoken"), "", "gpt2");
  ASSERT_TRUE(tiny.is_ok()) << tiny.status().message();
  EXPECT_EQ(tiny->bpe.vocab_size(), 258);
  EXPECT_EQ(tiny->document_token, 257u);
  EXPECT_EQ(encode(tiny->bpe, "b a"), (std::vector<uint32_t>{'b', 256}));
}

TEST(TiktokenRanks, BadFilesNameTheFileAndLine) {
  testing::ScratchDir dir;
  auto missing = read_tiktoken_ranks(dir.file("none.tiktoken"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().exit_code(), 2);
  EXPECT_EQ(missing.status().message(), dir.file("none.tiktoken") + ": cannot open for reading");
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"IQ== 0\nIg= 1\n", "line 2: bad base64 'Ig='"},
           {"IQ== 0\nI*== 1\n", "line 2: bad base64 'I*=='"},
           {"IQ== 0\nIR== 1\n", "line 2: bad base64 'IR=='"},  // stray bits: not canonical
           {"IQ== 0\n== 1\n", "line 2: bad base64 '=='"},
           {"IQ== 0\nIg== 0\n", "line 2: duplicate rank 0"},
           {"IQ== 0\nIg== 2\n", "line 2: rank 2 where 1 comes next (ranks must be contiguous "
                                "from 0, in order)"},
           {"IQ== 0\nIg== 1\nIQ== 2\n", "line 3: duplicate token 'IQ==' (also on line 1)"},
           {"IQ== 0\nIg==  1\n", "line 2: expected '<base64 token> <rank>'"},
           {"IQ== 0\nIg==\n", "line 2: expected '<base64 token> <rank>'"},
           {"IQ== 0\nIg== -1\n", "line 2: rank '-1' is not a non-negative integer"},
           {"IQ== 0\nIg== 1x\n", "line 2: rank '1x' is not a non-negative integer"}}) {
    dir.write("bad.tiktoken", c.text);
    auto r = read_tiktoken_ranks(dir.file("bad.tiktoken"));
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_EQ(r.status().exit_code(), 2);
    EXPECT_EQ(r.status().message(), dir.file("bad.tiktoken") + ": " + c.want);
  }
  dir.write("ok.tiktoken", "IQ== 0\n\nIg== 1\n");  // blank lines are skipped, as tiktoken does
  auto ok = read_tiktoken_ranks(dir.file("ok.tiktoken"));
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(*ok, (std::vector<std::string>{"!", "\""}));
  // A rank file without every single byte cannot encode all text.
  auto no_bytes = BpeTokenizer::load_tiktoken(dir.file("ok.tiktoken"), BpePattern::kCl100k, {});
  ASSERT_FALSE(no_bytes.is_ok());
  EXPECT_EQ(no_bytes.status().message(), dir.file("ok.tiktoken") + ": no token for byte 0");
}

}  // namespace
}  // namespace trident
