// Hugging Face tokenizer.json files (data/bpe_hf_tokenizer.h) against Hugging Face's own
// implementations, none of them code of ours: ids committed from the Rust `tokenizers`
// core (npm tokenizers@0.23.2; tests/reference/bpe/*_json*.ids), the same core and Hugging
// Face's JavaScript implementation (npm @huggingface/tokenizers@0.2.0) run live, both by
// tests/reference/hf_reference_encode.js. The files are GPT-2's and Llama 3's, built by
// tests/reference/make_tokenizer_json.js (scripts/fetch_vocabs.sh) from OpenAI's and Meta's
// vocabularies; each must also encode exactly as the same vocabulary read from its other
// source (encoder.json + vocab.bpe; llama3.tiktoken under tiktoken's rule). Then tiny
// files for ignore_merges and the two merge spellings (also against the Rust core), and
// the refusals, each naming the file and the JSON field.
//
// Without the files and packages these tests FAIL, saying to run scripts/fetch_vocabs.sh.
// Regenerate the committed ids, for j in gpt2 and llama3: the three lines of
//   node tests/reference/hf_reference_encode.js --engine rust
//     --json .cache/vocab/$j.tokenizer.json tests/reference/bpe/mixed.txt
//     tests/reference/gpt2/invalid_utf8.txt --allow-special tests/reference/bpe/mixed.txt
// (one command) are mixed.${j}_json.ids, invalid_utf8.${j}_json.ids and
// mixed.${j}_json.special.ids.
#include "data/bpe_hf_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_vocabularies.h"
#include "data/gpt2_tokenizer.h"
#include "tests/common/gpt2_files.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/bpe_test_util.h"
#include "tests/data/vocab_files.h"

namespace trident {
namespace {

using nlohmann::json;
using testing::assigned_only;
using testing::expect_same_ids;
using testing::fixture;
using testing::generated_text;
using testing::have_node;
using testing::parse_ids;
using testing::read_bytes;
using testing::sanitized;
using testing::vocab_dir;

std::string json_path(const std::string& name) { return vocab_dir() + "/" + name + ".tokenizer.json"; }

// Loaded once per file for the whole binary.
const LoadedTokenizer* hf(const std::string& name) {
  static std::map<std::string, Result<LoadedTokenizer>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_vocabulary(json_path(name), "", "")).first;
  return it->second.is_ok() ? &it->second.value() : nullptr;
}

#define REQUIRE_HF(name)                                                                    \
  ASSERT_NE(hf(name), nullptr) << testing::vocab_missing_hint() << ": "                     \
                               << load_vocabulary(json_path(name), "", "").status().message(); \
  const BpeTokenizer& tok = hf(name)->bpe

std::vector<uint32_t> encode(const BpeTokenizer& tok, const std::string& text,
                             bool allow_special = false) {
  std::vector<uint32_t> ids;
  tok.encode(text, &ids, allow_special);
  return ids;
}

// The oracle's ids: files, then special_files with the added tokens matched.
std::vector<std::vector<uint32_t>> hf_ids(const std::string& engine, const std::string& json_file,
                                          std::vector<std::string> files,
                                          const std::vector<std::string>& special_files = {}) {
  const std::string package = vocab_dir() + (engine == "js" ? "/huggingface-tokenizers" : "/hf-tokenizers");
  EXPECT_TRUE(std::filesystem::exists(package + "/package.json")) << testing::vocab_missing_hint();
  std::string cmd = "node " + fixture("hf_reference_encode.js") + " --dir " + vocab_dir() +
                    " --engine " + engine + " --json " + json_file;
  for (const std::string& f : files) cmd += " " + f;
  if (!special_files.empty()) cmd += " --allow-special";
  for (const std::string& f : special_files) cmd += " " + f;
  return testing::reference_lines(cmd, files.size() + special_files.size());
}

class HfJson : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Files, HfJson, ::testing::Values("gpt2", "llama3"));

TEST_P(HfJson, MatchesCommittedHuggingFaceIds) {
  REQUIRE_HF(GetParam());
  const std::string j = GetParam() + "_json";
  for (const auto& [text_file, ids_file, special] :
       {std::tuple{fixture("bpe/mixed.txt"), "bpe/mixed." + j + ".ids", false},
        std::tuple{fixture("gpt2/invalid_utf8.txt"), "bpe/invalid_utf8." + j + ".ids", false},
        std::tuple{fixture("bpe/mixed.txt"), "bpe/mixed." + j + ".special.ids", true}}) {
    const std::vector<uint32_t> want = parse_ids(read_bytes(fixture(ids_file)));
    ASSERT_GT(want.size(), 20u) << ids_file;
    expect_same_ids(tok, encode(tok, sanitized(read_bytes(text_file)), special), want, ids_file);
  }
}

// Hugging Face's Rust core: every text as it is (its \s is White_Space, as Trident's).
TEST_P(HfJson, MatchesHuggingFaceRustLive) {
  REQUIRE_HF(GetParam());
  if (!have_node()) GTEST_SKIP() << "node not installed; the committed reference ids still cover the reader";
  testing::ScratchDir dir;
  const std::string text = generated_text(11, 60000) + testing::long_runs();
  dir.write("gen.txt", text);
  dir.write("random.txt", assigned_only(testing::random_utf8(13, 20000)));
  const std::vector<std::string> files = {dir.file("gen.txt"), dir.file("random.txt"),
                                          fixture("bpe/mixed.txt"), fixture("gpt2/invalid_utf8.txt")};
  const auto want = hf_ids("rust", json_path(GetParam()), files, {dir.file("gen.txt")});
  testing::expect_oracle_ids(tok, files, text, want);
}

// Hugging Face's JavaScript implementation. Its regex is JavaScript's: the generated and
// random text avoid the characters where that differs (without_js_regex_differences).
// mixed.txt goes in as it is for Llama 3 (equal there), and without U+0085 for GPT-2, whose
// ' ?[^\s\p{L}\p{N}]+' takes U+0085 in JavaScript only.
TEST_P(HfJson, MatchesHuggingFaceJavaScriptLive) {
  REQUIRE_HF(GetParam());
  if (!have_node()) GTEST_SKIP() << "node not installed; the committed reference ids still cover the reader";
  testing::ScratchDir dir;
  const std::string text = testing::without_js_regex_differences(generated_text(17, 40000));
  dir.write("gen.txt", text);
  dir.write("random.txt",
            testing::without_js_regex_differences(assigned_only(testing::random_utf8(19, 10000))));
  const std::string mixed = read_bytes(fixture("bpe/mixed.txt"));
  dir.write("mixed.txt", GetParam() == "llama3" ? mixed : testing::without_js_regex_differences(mixed));
  const std::vector<std::string> files = {dir.file("gen.txt"), dir.file("random.txt"),
                                          dir.file("mixed.txt"), fixture("gpt2/invalid_utf8.txt")};
  const auto want = hf_ids("js", json_path(GetParam()), files, {dir.file("gen.txt")});
  testing::expect_oracle_ids(tok, files, text, want);
}

// The same vocabulary from its other source encodes the same: GPT-2's encoder.json +
// vocab.bpe, and Llama 3's rank file under tiktoken's rule (Hugging Face's merge list with
// ignore_merges gives tiktoken's ids).
TEST(HfJson, EqualsTheOtherSourceOfTheVocabulary) {
  const std::string text = generated_text(23, 80000) + read_bytes(fixture("bpe/mixed.txt"));
  {
    REQUIRE_HF("gpt2");
    auto gpt2 = Gpt2Tokenizer::load_dir(testing::gpt2_dir());
    ASSERT_TRUE(gpt2.is_ok()) << gpt2.status().message();
    EXPECT_EQ(tok.vocab_size(), kGpt2VocabSize);
    EXPECT_EQ(hf("gpt2")->document_token, kGpt2EndOfText);
    EXPECT_EQ(encode(tok, sanitized(text)), encode(gpt2->bpe(), sanitized(text)));
  }
  {
    REQUIRE_HF("llama3");
    auto llama3 = load_vocabulary("llama3", vocab_dir(), "");
    ASSERT_TRUE(llama3.is_ok()) << llama3.status().message();
    EXPECT_EQ(tok.vocab_size(), 128256);
    EXPECT_EQ(hf("llama3")->document_token, 128000u);  // from the TemplateProcessing
    EXPECT_EQ(tok.specials().size(), 256u);
    for (bool special : {false, true}) {
      EXPECT_EQ(encode(tok, sanitized(text), special), encode(llama3->bpe, sanitized(text), special));
    }
  }
}

// With special tokens matched, encode_parallel and blocks cut where safe_split(.., true)
// holds give the serial ids, also when special tokens follow a newline (where a cut
// without special tokens could fall) and when one spans a newline.
TEST(HfJson, ParallelWithSpecialTokensEqualsSerial) {
  REQUIRE_HF("llama3");
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    text += i % 3 ? "line " + std::to_string(i) + " <|eot_id|>x\n" : "<|begin_of_text|>Hi.\n";
  }
  const std::vector<uint32_t> want = encode(tok, text, true);
  ASSERT_GT(std::count(want.begin(), want.end(), 128000u), 900);
  std::vector<uint32_t> got;
  tok.encode_parallel(text, 3, &got, std::string::npos, true);
  EXPECT_EQ(got, want);
  // Blocks of about 1000 bytes cut at the last safe split, as prepare cuts them.
  got.clear();
  int cuts_before_special = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t cut = std::min(text.size(), begin + 1000);
    if (cut < text.size()) {
      while (cut > begin && !tok.safe_split(text, cut, true)) {
        cuts_before_special += tok.safe_split(text, cut) ? 1 : 0;
        --cut;
      }
      ASSERT_GT(cut, begin);
    }
    const std::string block = text.substr(begin, cut - begin + (cut < text.size() ? 1 : 0));
    tok.encode_parallel(block, 2, &got, cut - begin, true);
    begin = cut;
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(cuts_before_special, 0);  // the special-token rule did move cuts
}

// ---- tiny files: the rules and the refusals ----------------------------------------------

// GPT-2's bytes_to_unicode, written here from its definition (encoder.py).
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174 ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// 256 bytes, "ab" (256), "abc" (257) and "Ġab" (258); merges "a b", "Ġ ab"; <|endoftext|> 259.
json tiny(bool sequence, bool ignore_merges, bool pair_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[byte_char(' ') + "ab"] = 258;
  json merges = pair_merges ? json::array({json::array({"a", "b"}), json::array({byte_char(' '), "ab"})})
                            : json::array({"a b", byte_char(' ') + " ab"});
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                     {"use_regex", !sequence}};
  json pre = byte_level;
  if (sequence) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array({{{"type", "Split"},
                          {"pattern", {{"Regex", bpe_pattern_source(BpePattern::kCl100k)}}},
                          {"behavior", "Isolated"},
                          {"invert", false}},
                         byte_level})}};
  }
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 259}, {"content", "<|endoftext|>"},
                                         {"single_word", false}, {"lstrip", false},
                                         {"rstrip", false}, {"normalized", false},
                                         {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                       {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                     {"byte_fallback", false}, {"ignore_merges", ignore_merges},
                     {"vocab", vocab}, {"merges", merges}}}};
}

TEST(HfJsonTiny, IgnoreMergesAndBothMergeSpellings) {
  testing::ScratchDir dir;
  const std::string text = "abc ab abcab xabc <|endoftext|>abc";
  std::vector<std::string> files;
  std::vector<std::vector<uint32_t>> got;
  for (bool sequence : {false, true}) {
    for (bool ignore : {false, true}) {
      std::vector<uint32_t> first;
      for (bool pairs : {false, true}) {
        const std::string name = std::string("t") + (sequence ? "s" : "b") + (ignore ? "i" : "m") +
                                 (pairs ? "p" : "s") + ".json";
        dir.write(name, tiny(sequence, ignore, pairs).dump());
        auto t = load_vocabulary(dir.file(name), "", "");
        ASSERT_TRUE(t.is_ok()) << t.status().message();
        EXPECT_EQ(t->bpe.vocab_size(), 260);
        EXPECT_EQ(t->document_token, 259u);
        const std::vector<uint32_t> ids = encode(t->bpe, text);
        if (pairs) {
          EXPECT_EQ(ids, first) << "[a, b] and \"a b\" merges differ: " << name;
        }
        first = ids;
        files.push_back(dir.file(name));
        got.push_back(ids);
      }
    }
  }
  // "abc" is reachable only as a whole piece (no merge makes it): ignore_merges.
  const uint32_t c = 'c';
  EXPECT_EQ(std::vector<uint32_t>(got[0].begin(), got[0].begin() + 3), (std::vector<uint32_t>{256, c, 258}));
  EXPECT_EQ(std::vector<uint32_t>(got[2].begin(), got[2].begin() + 2), (std::vector<uint32_t>{257, 258}));
  if (!have_node()) GTEST_SKIP() << "node not installed; the Rust core cannot check the tiny files";
  dir.write("text.txt", text);
  for (size_t i = 0; i < files.size(); ++i) {
    const auto want = hf_ids("rust", files[i], {dir.file("text.txt")});
    ASSERT_EQ(want.size(), 1u);
    EXPECT_EQ(got[i], want[0]) << files[i];
  }
}

TEST(HfJsonTiny, RefusalsNameTheFileAndTheField) {
  testing::ScratchDir dir;
  struct Case {
    const char* what;
    void (*edit)(json*);
    const char* want;  // after "<path>: "
  };
  const std::vector<Case> cases = {
      {"unigram", [](json* j) { (*j)["model"]["type"] = "Unigram"; },
       "model.type: 'Unigram' is not implemented (Trident reads byte-level BPE only)"},
      {"wordpiece", [](json* j) { (*j)["model"]["type"] = "WordPiece"; }, "model.type: 'WordPiece'"},
      {"normalizer", [](json* j) { (*j)["normalizer"] = {{"type", "NFC"}}; },
       "normalizer: 'NFC' is not implemented (null only)"},
      {"byte_fallback", [](json* j) { (*j)["model"]["byte_fallback"] = true; },
       "model.byte_fallback: true is not implemented (allowed: false)"},
      {"dropout", [](json* j) { (*j)["model"]["dropout"] = 0.1; }, "model.dropout: 0.1 is not implemented"},
      {"prefix", [](json* j) { (*j)["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix: \"##\" is not implemented"},
      {"ignore", [](json* j) { (*j)["model"]["ignore_merges"] = "yes"; },
       "model.ignore_merges: not a boolean"},
      {"pre", [](json* j) { (*j)["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       "pre_tokenizer.type: 'Whitespace' is not implemented"},
      {"pre_null", [](json* j) { (*j)["pre_tokenizer"] = nullptr; }, "pre_tokenizer: null"},
      {"prefix_space", [](json* j) { (*j)["pre_tokenizer"]["add_prefix_space"] = true; },
       "pre_tokenizer.add_prefix_space: true is not implemented"},
      {"regex", [](json* j) {
         (*j)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
       }, "pre_tokenizer.pretokenizers[0].pattern.Regex: '\\w+|\\s+' is none of the patterns"},
      {"string_pattern", [](json* j) {
         (*j)["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
       }, "pre_tokenizer.pretokenizers[0].pattern: {\"String\":\" \"}: Trident needs {\"Regex\": ...}"},
      {"behavior", [](json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior: \"Removed\" is not implemented (Isolated)"},
      {"invert", [](json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert: true is not implemented"},
      {"double_regex", [](json* j) { (*j)["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
       "pre_tokenizer.pretokenizers[1].use_regex: true after a Split"},
      {"sequence", [](json* j) { (*j)["pre_tokenizer"]["pretokenizers"].erase(1); },
       "pre_tokenizer.pretokenizers: Trident implements the Sequence [Split, ByteLevel] only"},
      {"decoder", [](json* j) { (*j)["decoder"] = {{"type", "WordPiece"}}; },
       "decoder.type: 'WordPiece' is not implemented (null, ByteLevel)"},
      {"post", [](json* j) { (*j)["post_processor"] = {{"type", "BertProcessing"}}; },
       "post_processor.type: 'BertProcessing' is not implemented"},
      {"lstrip", [](json* j) { (*j)["added_tokens"][0]["lstrip"] = true; },
       "added_tokens[0].lstrip: true is not implemented (allowed: false)"},
      {"merge", [](json* j) { (*j)["model"]["merges"].push_back("a zz"); },
       "model.merges[2]: 'zz' is not in model.vocab"},
      {"merge_result", [](json* j) { (*j)["model"]["merges"].push_back("b c"); },
       "model.merges[2]: 'bc' is not in model.vocab"},
      {"merge_form", [](json* j) { (*j)["model"]["merges"].push_back("a b c"); },
       "model.merges[2]: 'a b c' is not 'a b'"},
      {"gap", [](json* j) { (*j)["model"]["vocab"].erase("abc"); },
       "model.vocab: no token has id 257 (the ids of the ordinary tokens must be 0..n-1"},
      {"not_byte_level", [](json* j) { (*j)["model"]["vocab"]["中"] = 260; },
       "model.vocab: '中' is not a byte-level token"},
      {"added_id", [](json* j) { (*j)["model"]["vocab"]["<|x|>"] = 259; },
       "model.vocab.<|x|>: id 259 belongs to the added token '<|endoftext|>'"},
      {"no_document", [](json* j) { (*j)["added_tokens"][0]["content"] = "<|eot|>"; },
       "added_tokens: no document token"},
  };
  for (const Case& c : cases) {
    json j = tiny(/*sequence=*/std::string(c.what).find("regex") != std::string::npos ||
                      std::string(c.what) == "string_pattern" || std::string(c.what) == "behavior" ||
                      std::string(c.what) == "invert" || std::string(c.what) == "sequence",
                  false, false);
    c.edit(&j);
    const std::string path = dir.file(std::string(c.what) + ".tokenizer.json");
    dir.write(std::string(c.what) + ".tokenizer.json", j.dump());
    auto t = load_vocabulary(path, "", "");
    ASSERT_FALSE(t.is_ok()) << c.what;
    EXPECT_EQ(t.status().exit_code(), 2) << c.what;
    EXPECT_EQ(t.status().message().rfind(path + ": " + c.want, 0), 0u)
        << c.what << ": " << t.status().message();
  }
  dir.write("bad.json", "{\"model\": ");
  auto t = load_vocabulary(dir.file("bad.json"), "", "");
  EXPECT_EQ(t.status().message(), dir.file("bad.json") + ": not a JSON object (a Hugging Face tokenizer.json)");
  t = load_vocabulary(dir.file("none.json"), "", "");
  EXPECT_EQ(t.status().message(), dir.file("none.json") + ": cannot open for reading");
  EXPECT_EQ(t.status().exit_code(), 2);
  dir.write("ok.json", tiny(false, false, false).dump());
  t = load_vocabulary(dir.file("ok.json"), "", "gpt2");
  EXPECT_EQ(t.status().exit_code(), 2);
  EXPECT_EQ(t.status().message(), "--tokenizer-pattern: only for a rank file; " + dir.file("ok.json") +
                                      " declares its pre-tokenizer");
}

}  // namespace
}  // namespace trident
