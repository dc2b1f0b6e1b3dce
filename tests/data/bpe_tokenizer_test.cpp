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
//     node tests/reference/bpe_reference_encode.js --encoding $e tests/reference/bpe/mixed.txt \
//       > tests/reference/bpe/mixed.$e.ids
//     node tests/reference/bpe_reference_encode.js --encoding $e \
//       tests/reference/gpt2/invalid_utf8.txt > tests/reference/bpe/invalid_utf8.$e.ids; done
#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/bpe_vocabularies.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/data/vocab_files.h"

namespace trident {
namespace {

using testing::parse_ids;
using testing::read_bytes;
using testing::vocab_dir;

std::string fixture(const std::string& path) {
  return std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/" + path;
}

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

std::string sanitized(const std::string& bytes) {
  std::string text;
  sanitize_utf8(bytes, &text);
  return text;
}

// Fragments that stress every alternative of the three patterns: contractions in every
// case (and the long s, which a case-insensitive match may take for 's'), o200k's
// case-sensitive words (camelCase, titlecase and modifier letters, combining marks),
// digit runs of every length, punctuation runs before newlines and '/', every kind of
// whitespace run (U+0085 and U+FEFF included: the oracle is Unicode's White_Space, as
// Trident is), code, scripts without spaces, emoji sequences and special-token text.
const std::vector<std::string>& fragments() {
  static const std::vector<std::string> f = {
      "the", "The", " of", "and", " a", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T",
      "'RE", "'Ve", "'lL", "'D", "'", "'\xC5\xBF", "\xE2\x84\xAA", "\"", ",", ".", "!", "?", ";",
      ":", "(", ")", "[", "]", "{", "}", "-", "--", "_", "/", "//", "/*", "*/", "\\", "#", "@",
      "&", "*", "+", "=", "<|endoftext|>", "<|fim_prefix|>", "<|begin_of_text|>", "<|eot_id|>",
      "0", "7", "42", "1999", "12345", "3.14", "1,000,000", "½", "٣", "४२", "é", "naïve",
      "Straße", "Ωμέγα", "Привет", "שלום", "مرحبا", "हिन्दी", "ไทย", "中文", "日本語", "한국어",
      "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "HelloWorld", "camelCase", "XMLHttp", "iPhone", "ǅa",
      "ʰx", "a\xCC\x81", "ÉCOLE", "McD", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \t",
      "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2003", "\x0b", "\x0c", "\u0085", "\ufeff",
      "\n/", ";\n/", "\n;", "  \n", "for (int i = 0; i < n; ++i) {\n", "    return x;\n",
      "}\n", "supercalifragilisticexpialidocious", "antidisestablishmentarianism",
      "http://x.y/z?a=b"};
  return f;
}

std::string generated_text(uint32_t seed, size_t bytes) {
  const std::vector<std::string>& f = fragments();
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) text += f[rng() % f.size()];
  return text;
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
  std::string output;
  const int rc = testing::run_capture(cmd, &output);
  EXPECT_EQ(rc, 0) << cmd << "\n" << output.substr(0, 2000);
  std::vector<std::vector<uint32_t>> ids;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) ids.push_back(parse_ids(line));
  EXPECT_EQ(ids.size(), files.size()) << output.substr(0, 2000);
  return ids;
}

// On a difference, shows the first one with the text of the ids around it.
void expect_same_ids(const BpeTokenizer& tok, const std::vector<uint32_t>& got,
                     const std::vector<uint32_t>& want, const std::string& what) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return;
  auto around = [&](const std::vector<uint32_t>& ids) {
    std::string s;
    for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(ids.size(), i + 4); ++k) {
      s += std::to_string(ids[k]) + ::testing::PrintToString(tok.decode({ids[k]})) + " ";
    }
    return s;
  };
  ADD_FAILURE() << what << ": " << got.size() << " ids, reference " << want.size()
                << "; first difference at id " << i << "\n  got:       " << around(got)
                << "\n  reference: " << around(want);
}

// `text` with every code point that is unassigned (\p{Cn}) in this PCRE2's Unicode
// replaced by '.'. Some of them are letters in the newer Unicode of the oracle's Rust
// regex (tiktoken 1.0.22; PCRE2 10.42 has Unicode 14), so they may split differently
// there: a known limit (docs/DATA.md), kept out of the parity corpus on purpose.
std::string assigned_only(const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{Cn}"), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr),
      &pcre2_code_free);
  EXPECT_NE(code, nullptr);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  std::string out;
  size_t pos = 0;
  while (pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0,
                     match.get(), nullptr) > 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    out.append(text, pos, ov[0] - pos);
    out += '.';
    pos = ov[1];
  }
  out.append(text, pos, std::string::npos);
  return out;
}

bool have_node() { return std::system("command -v node >/dev/null 2>&1") == 0; }

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
  std::string text = generated_text(7, 60000);
  text += std::string(3000, ' ') + "x" + std::string(2000, 'z') + "\n" + std::string(500, '\n') +
          std::string(700, '!') + "\n" + std::string(999, '9');
  dir.write("gen.txt", text);
  dir.write("random.txt", assigned_only(testing::random_utf8(5, 20000)));
  const std::vector<std::string> files = {dir.file("gen.txt"), dir.file("random.txt"),
                                          fixture("bpe/mixed.txt"), fixture("gpt2/invalid_utf8.txt")};
  // The last one again with special tokens allowed: tiktoken's encode(text, "all").
  const auto want = reference_ids(GetParam(), files, "", {dir.file("gen.txt")});
  ASSERT_EQ(want.size(), files.size() + 1);
  ASSERT_GT(want[0].size(), 10000u);
  for (size_t i = 0; i < files.size(); ++i) {
    expect_same_ids(tok, encode(tok, sanitized(read_bytes(files[i]))), want[i], files[i]);
  }
  expect_same_ids(tok, encode(tok, text, true), want.back(), "gen.txt, special tokens allowed");
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
    for (size_t i = 0; i < piece.size(); ++i) {
      if (piece.compare(i, 2, "\u0085") == 0 || piece.compare(i, 3, "\ufeff") == 0 ||
          piece.compare(i, 2, "\xC5\xBF") == 0 || piece.compare(i, 3, "\xE2\x84\xAA") == 0) {
        text += '.';
        i += (static_cast<unsigned char>(piece[i]) >= 0xE0 ? 2 : 1);
        continue;
      }
      text += piece[i];
    }
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
