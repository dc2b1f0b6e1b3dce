// The tokenizer.json that `trident export` writes (data/bpe_hf_export.h), for GPT-2,
// cl100k_base, o200k_base and Llama 3, loaded by Hugging Face's own implementations, none
// of them code of ours: the Rust `tokenizers` core (npm tokenizers@0.23.2) and Hugging
// Face's JavaScript one (npm @huggingface/tokenizers@0.2.0), run by
// tests/reference/hf_reference_encode.js. Each must give every id Trident's own encoder
// gives, on generated text that stresses every pattern, random text from every plane, the
// mixed corpus (English, code, numbers, whitespace runs, CJK, emoji, mixed scripts) and
// the invalid-UTF-8 fixture, with special tokens as text and matched, and with the
// document token that its post-processor adds; and decode the ids back to the text. The
// merges derived from Llama 3's ranks must be the list Meta published (llama3-tokenizer-js
// carries it), Trident's reader must read the written file back as the same tokenizer,
// and a tokenizer.json source is exported as its own bytes.
//
// Without the files and packages these tests FAIL, saying to run scripts/fetch_vocabs.sh
// (and scripts/fetch_gpt2_vocab.sh for GPT-2).
#include "data/bpe_hf_export.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_hf_tokenizer.h"
#include "data/bpe_vocabularies.h"
#include "tests/common/gpt2_files.h"
#include "tests/common/scratch_dir.h"
#include "tests/data/bpe_test_util.h"
#include "tests/data/vocab_files.h"

namespace trident {
namespace {

using nlohmann::json;
using testing::assigned_only;
using testing::fixture;
using testing::generated_text;
using testing::have_node;
using testing::read_bytes;
using testing::sanitized;
using testing::vocab_dir;
using testing::without_js_regex_differences;

std::string files_dir(const std::string& name) {
  return name == "gpt2" ? testing::gpt2_dir() : vocab_dir();
}

const LoadedTokenizer* vocabulary(const std::string& name) {
  static std::map<std::string, Result<LoadedTokenizer>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_vocabulary(name, files_dir(name), "")).first;
  return it->second.is_ok() ? &it->second.value() : nullptr;
}

// The written tokenizer.json (and tokenizer_config.json beside it) of a vocabulary, once
// per binary.
std::string written(const std::string& name) {
  static testing::ScratchDir dir;
  static std::map<std::string, std::string> paths;
  auto it = paths.find(name);
  if (it != paths.end()) return it->second;
  const LoadedTokenizer& tok = *vocabulary(name);
  std::filesystem::create_directories(dir.file(name));
  std::ofstream(dir.file(name + "/tokenizer.json"), std::ios::binary) << hf_tokenizer_json(tok.bpe, tok.document_token);
  std::ofstream(dir.file(name + "/tokenizer_config.json"), std::ios::binary)
      << hf_tokenizer_config_json(tok, 1024);
  return paths[name] = dir.file(name + "/tokenizer.json");
}

#define REQUIRE_VOCABULARY(name)                                                          \
  ASSERT_NE(vocabulary(name), nullptr)                                                    \
      << testing::vocab_missing_hint() << "; " << testing::gpt2_missing_hint() << ": "    \
      << load_vocabulary(name, files_dir(name), "").status().message();                   \
  const BpeTokenizer& tok = vocabulary(name)->bpe;                                        \
  const std::string json_file = written(name)

class HfExport : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Vocabularies, HfExport,
                         ::testing::Values("gpt2", "cl100k_base", "o200k_base", "llama3"));

// The texts, as files in `dir`: generated (with the matcher's worst cases), random, the
// mixed corpus and the invalid-UTF-8 fixture; `filter` applied to all but the last.
std::vector<std::string> corpus(const testing::ScratchDir& dir, uint32_t seed,
                                std::string (*filter)(const std::string&), std::string* generated) {
  *generated = filter(generated_text(seed, 60000) + testing::long_runs());
  dir.write("gen.txt", *generated);
  dir.write("random.txt", filter(assigned_only(testing::random_utf8(seed + 1, 20000))));
  dir.write("mixed.txt", filter(read_bytes(fixture("bpe/mixed.txt"))));
  return {dir.file("gen.txt"), dir.file("random.txt"), dir.file("mixed.txt"),
          fixture("gpt2/invalid_utf8.txt")};
}

std::string as_is(const std::string& text) { return text; }

// One run of each reference on the written file (loading it is most of the time), in
// its four modes: the texts (special tokens as text), the generated text with special
// tokens matched, the mixed corpus with add_special_tokens (transformers' default: the
// document token goes first, the ids prepare gives a document), and Trident's ids of all
// of them decoded back (special tokens kept; the JavaScript tokenizer reads the written
// tokenizer_config.json too). The Rust core takes every text as it is (its \s is
// Unicode's White_Space, as Trident's is); the JavaScript implementation the texts
// without the characters where JavaScript's regex differs (without_js_regex_differences).
TEST_P(HfExport, BothReferencesEncodeAndDecodeAsTrident) {
  REQUIRE_VOCABULARY(GetParam());
  ASSERT_TRUE(have_node()) << "node is needed for the Hugging Face references";
  const std::string config = json_file.substr(0, json_file.rfind('/')) + "/tokenizer_config.json";
  for (const auto& [engine, seed, filter] :
       {std::tuple{"rust", 41u, &as_is}, std::tuple{"js", 43u, &without_js_regex_differences}}) {
    SCOPED_TRACE(engine);
    testing::ScratchDir dir;
    std::string text;
    const std::vector<std::string> files = corpus(dir, seed, filter, &text);
    std::vector<std::string> texts;  // what each decode line must give back
    std::vector<std::vector<uint32_t>> want;  // the ids of each encode line
    std::string cmd = "node " + fixture("hf_reference_encode.js") + " --dir " + vocab_dir() +
                      " --engine " + engine + " --json " + json_file + " --config " + config;
    for (const std::string& f : files) {
      cmd += " " + f;
      texts.push_back(sanitized(read_bytes(f)));
      want.emplace_back();
      tok.encode(texts.back(), &want.back());
    }
    cmd += " --allow-special " + dir.file("gen.txt");
    texts.push_back(text);
    want.emplace_back();
    tok.encode(text, &want.back(), /*allow_special=*/true);
    cmd += " --add-special-tokens " + dir.file("mixed.txt");
    want.push_back({vocabulary(GetParam())->document_token});
    tok.encode(sanitized(read_bytes(dir.file("mixed.txt"))), &want.back());
    cmd += " --decode";
    for (size_t i = 0; i < texts.size(); ++i) {
      std::ostringstream line;
      for (uint32_t id : want[i]) line << id << ' ';
      dir.write("ids" + std::to_string(i), line.str());
      cmd += " " + dir.file("ids" + std::to_string(i));
      ASSERT_GT(want[i].size(), 10u);
      EXPECT_TRUE(tok.decode(want[i]) == texts[i]) << "Trident's decode of line " << i;
    }
    ASSERT_GT(want[0].size(), 10000u);

    std::string output;
    ASSERT_EQ(testing::run_capture(cmd, &output), 0) << cmd << "\n" << output.substr(0, 2000);
    std::istringstream lines(output);
    std::string line;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::getline(lines, line)) << output.substr(0, 2000);
      testing::expect_same_ids(tok, testing::parse_ids(line), want[i],
                               i < files.size() ? files[i] : "encode line " + std::to_string(i));
    }
    for (size_t i = 0; i < texts.size(); ++i) {
      ASSERT_TRUE(std::getline(lines, line)) << output.substr(0, 2000);
      const json decoded = json::parse(line, nullptr, false);
      ASSERT_TRUE(decoded.is_string()) << line.substr(0, 200);
      EXPECT_TRUE(decoded.get<std::string>() == texts[i]) << "decode line " << i;
    }
    EXPECT_FALSE(std::getline(lines, line)) << line.substr(0, 200);
  }
}

// Trident's tokenizer.json reader (data/bpe_hf_tokenizer.h) takes the written file as the
// same tokenizer: sizes, special tokens, document token, ids with and without special
// tokens, and the merges it read are the ones written.
TEST_P(HfExport, TridentReadsItBackAsTheSameTokenizer) {
  REQUIRE_VOCABULARY(GetParam());
  auto back = load_hf_tokenizer(json_file);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  const BpeTokenizer& b = back->bpe;
  EXPECT_EQ(b.vocab_size(), tok.vocab_size());
  EXPECT_EQ(b.ranks(), tok.ranks());
  EXPECT_EQ(b.pattern() == BpePattern::kLlama3 ? BpePattern::kCl100k : b.pattern(),
            tok.pattern() == BpePattern::kLlama3 ? BpePattern::kCl100k : tok.pattern());
  ASSERT_EQ(b.specials().size(), tok.specials().size());
  for (size_t i = 0; i < b.specials().size(); ++i) {
    EXPECT_EQ(b.specials()[i].text, tok.specials()[i].text);
    EXPECT_EQ(b.specials()[i].id, tok.specials()[i].id);
  }
  // The reader's document token is the one the TemplateProcessing starts with.
  EXPECT_EQ(back->document_token, vocabulary(GetParam())->document_token);
  EXPECT_EQ(b.merge_rule(), tok.merge_rule() == BpeMergeRule::kTiktoken
                                ? BpeMergeRule::kRecordedMergesWholePiece
                                : tok.merge_rule());
  EXPECT_EQ(b.merges(), tok.merges());
  const std::string text = sanitized(generated_text(53, 100000) + read_bytes(fixture("bpe/mixed.txt")));
  for (bool special : {false, true}) {
    std::vector<uint32_t> want, got;
    tok.encode(text, &want, special);
    b.encode(text, &got, special);
    testing::expect_same_ids(tok, got, want, "read back, special tokens " + std::to_string(special));
  }
}

// The merges derived from Llama 3's ranks are Meta's published merge list, in its order
// (llama3.tokenizer.json: built by tests/reference/make_tokenizer_json.js from
// llama3-tokenizer-js, which carries Meta's file): the derivation is Hugging Face's.
TEST(HfExportMerges, DerivedFromLlama3RanksArePublishedOnes) {
  REQUIRE_VOCABULARY("llama3");
  std::ifstream in(vocab_dir() + "/llama3.tokenizer.json");
  const json published = json::parse(in, nullptr, false);
  ASSERT_TRUE(published.is_object()) << testing::vocab_missing_hint();
  const json written_file = json::parse(read_bytes(json_file), nullptr, false);
  ASSERT_TRUE(written_file.is_object());
  const json& want = published["model"]["merges"];
  const json& got = written_file["model"]["merges"];
  ASSERT_EQ(got.size(), want.size());
  ASSERT_GT(got.size(), 280000u);
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string w = want[i][0].get<std::string>() + " " + want[i][1].get<std::string>();
    ASSERT_EQ(got[i].get<std::string>(), w) << "merge " << i;
  }
  // The vocab is the published one plus the special tokens at their ids.
  const json& vocab = written_file["model"]["vocab"];
  EXPECT_EQ(vocab.size(), published["model"]["vocab"].size() + tok.specials().size());
  size_t same = 0;
  for (const auto& [key, id] : published["model"]["vocab"].items()) {
    same += vocab.contains(key) && vocab[key] == id ? 1 : 0;
  }
  EXPECT_EQ(same, published["model"]["vocab"].size());
  for (const BpeSpecialToken& s : tok.specials()) EXPECT_EQ(vocab.value(s.text, -1), s.id) << s.text;
  EXPECT_EQ(written_file["model"]["ignore_merges"], true);
}

TEST(HfExportConfig, NamesTheDocumentAndEndTokens) {
  for (const auto& [name, bos, eos] :
       {std::tuple{"gpt2", "<|endoftext|>", "<|endoftext|>"},
        std::tuple{"cl100k_base", "<|endoftext|>", "<|endoftext|>"},
        std::tuple{"o200k_base", "<|endoftext|>", "<|endoftext|>"},
        std::tuple{"llama3", "<|begin_of_text|>", "<|end_of_text|>"}}) {
    REQUIRE_VOCABULARY(name);
    (void)tok;
    const json config = json::parse(hf_tokenizer_config_json(*vocabulary(name), 512));
    EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast") << name;
    EXPECT_EQ(config["bos_token"], bos) << name;
    EXPECT_EQ(config["eos_token"], eos) << name;
    EXPECT_EQ(config["model_max_length"], 512) << name;
    EXPECT_EQ(config["clean_up_tokenization_spaces"], false) << name;
  }
}

// A tokenizer.json source is exported as its bytes; changed after loading, it is refused
// naming the file and both hashes.
TEST(HfExportFiles, TokenizerJsonSourceIsCopied) {
  testing::ScratchDir dir;
  const std::string source = read_bytes(vocab_dir() + "/gpt2.tokenizer.json");
  ASSERT_GT(source.size(), 1000u) << testing::vocab_missing_hint();
  dir.write("tokenizer.json", source);
  auto source_tok = load_vocabulary(dir.file("tokenizer.json"), "", "");
  ASSERT_TRUE(source_tok.is_ok()) << source_tok.status().message();
  auto files = hf_tokenizer_files(source_tok.value(), 256);
  ASSERT_TRUE(files.is_ok()) << files.status().message();
  EXPECT_TRUE(files->source_copied);
  EXPECT_TRUE(files->tokenizer_json == source);
  EXPECT_EQ(json::parse(files->tokenizer_config_json)["bos_token"], "<|endoftext|>");

  dir.write("tokenizer.json", source + " ");
  auto changed = hf_tokenizer_files(source_tok.value(), 256);
  ASSERT_FALSE(changed.is_ok());
  EXPECT_NE(changed.status().message().find(dir.file("tokenizer.json")), std::string::npos)
      << changed.status().message();
  EXPECT_NE(changed.status().message().find(source_tok->sha256), std::string::npos)
      << changed.status().message();

  // A rank file's tokenizer is written, not copied.
  REQUIRE_VOCABULARY("cl100k_base");
  auto written_files = hf_tokenizer_files(*vocabulary("cl100k_base"), 256);
  ASSERT_TRUE(written_files.is_ok());
  EXPECT_FALSE(written_files->source_copied);
  EXPECT_TRUE(written_files->tokenizer_json == hf_tokenizer_json(tok, vocabulary("cl100k_base")->document_token));
}

}  // namespace
}  // namespace trident
