#include "data/bpe_hf_export.h"

#include <array>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_hf_tokenizer.h"

namespace trident {

namespace {

using nlohmann::ordered_json;

// GPT-2's bytes_to_unicode: byte -> the UTF-8 of the character a byte-level vocabulary
// writes for it (the printable bytes stand for themselves, the others for 256, 257, ...
// in byte order).
const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      if (cp < 0x80) {
        t[b] = std::string(1, static_cast<char>(cp));
      } else {
        t[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return t;
  }();
  return table;
}

std::string byte_level(std::string_view bytes) {
  const auto& chars = byte_chars();
  std::string s;
  for (char c : bytes) s += chars[static_cast<unsigned char>(c)];
  return s;
}

ordered_json byte_level_step(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

}  // namespace

std::string hf_tokenizer_json(const BpeTokenizer& tok, uint32_t document_token) {
  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  ordered_json added = ordered_json::array();
  for (const BpeSpecialToken& s : tok.specials()) {
    added.push_back({{"id", s.id},
                     {"content", s.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", bpe_pattern_source(tok.pattern())}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        byte_level_step(false, true, false)}}};
  // Meta's Llama 3 post-processor, with the document token: ByteLevel (offsets only),
  // then a template that starts the text with the document token, as prepare starts a
  // document. The decoder maps the characters back to bytes.
  const std::string doc(tok.decode({document_token}));
  auto piece = [](const char* kind, const std::string& id, int type_id) {
    return ordered_json{{kind, {{"id", id}, {"type_id", type_id}}}};
  };
  root["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {byte_level_step(true, false, true),
        {{"type", "TemplateProcessing"},
         {"single", {piece("SpecialToken", doc, 0), piece("Sequence", "A", 0)}},
         {"pair",
          {piece("SpecialToken", doc, 0), piece("Sequence", "A", 0), piece("SpecialToken", doc, 1),
           piece("Sequence", "B", 1)}},
         {"special_tokens",
          {{doc, {{"id", doc}, {"ids", {document_token}}, {"tokens", {doc}}}}}}}}}};
  root["decoder"] = byte_level_step(true, true, true);
  ordered_json model = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", tok.merge_rule() != BpeMergeRule::kRecordedMerges}};

  // vocab and merges are written by hand: 200k keys in an ordered_json object would be
  // inserted in quadratic time, and a std::map one would lose the id order. The special
  // tokens are in vocab too, at their ids: the Rust core gives an added token that the
  // model's vocab lacks the next free id instead of the one written, which would shift
  // cl100k's and o200k's (they follow a gap).
  std::string out = root.dump();
  out.pop_back();  // the closing brace; "model" goes last
  std::string m = model.dump();
  m.pop_back();
  out += ",\"model\":" + m + ",\"vocab\":{";
  const int64_t ranks = tok.ranks();
  std::vector<std::string> strings(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    strings[r] = ordered_json(byte_level(tok.token(static_cast<uint32_t>(r)))).dump();
    if (r > 0) out += ',';
    out += strings[r] + ':' + std::to_string(r);
  }
  for (const BpeSpecialToken& sp : tok.specials()) {
    out += ',' + ordered_json(sp.text).dump() + ':' + std::to_string(sp.id);
  }
  out += "},\"merges\":[";
  bool first = true;
  for (const auto& [l, r] : tok.merges()) {
    // A byte-level string has no U+0020 (the space byte is written as U+0120), so "a b"
    // is unambiguous; every tokenizers version reads this spelling.
    const std::string& a = strings[l];
    const std::string& b = strings[r];
    if (!first) out += ',';
    first = false;
    out.append(a, 0, a.size() - 1);
    out += ' ';
    out.append(b, 1, std::string::npos);
  }
  out += "]}}";
  return out;
}

namespace {

// The token tokenizer_config.json names as eos_token: Llama 3's <|end_of_text|> where the
// vocabulary has it, else <|endoftext|>; nullptr when it has neither.
const char* eos_token_text(const BpeTokenizer& bpe) {
  for (const char* eos : {"<|end_of_text|>", "<|endoftext|>"}) {
    if (bpe.special_id(eos) >= 0) return eos;
  }
  return nullptr;
}

// The special token that is the document token (bos_token), or nullptr.
const BpeSpecialToken* bos_token_of(const LoadedTokenizer& tok) {
  for (const BpeSpecialToken& s : tok.bpe.specials()) {
    if (s.id == tok.document_token) return &s;
  }
  return nullptr;
}

}  // namespace

std::string hf_tokenizer_config_json(const LoadedTokenizer& tok, int64_t model_max_length) {
  ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (const BpeSpecialToken* bos = bos_token_of(tok)) config["bos_token"] = bos->text;
  if (const char* eos = eos_token_text(tok.bpe)) config["eos_token"] = eos;
  config["model_max_length"] = model_max_length;
  config["clean_up_tokenization_spaces"] = false;
  return config.dump(2) + "\n";
}

Result<HfTokenizerFiles> hf_tokenizer_files(const LoadedTokenizer& tok, int64_t model_max_length) {
  HfTokenizerFiles files;
  files.tokenizer_config_json = hf_tokenizer_config_json(tok, model_max_length);
  if (const BpeSpecialToken* bos = bos_token_of(tok)) files.bos_token_id = bos->id;
  if (const char* eos = eos_token_text(tok.bpe)) files.eos_token_id = tok.bpe.special_id(eos);
  if (!is_hf_tokenizer_spec(tok.spec)) {
    files.tokenizer_json = hf_tokenizer_json(tok.bpe, tok.document_token);
    return files;
  }
  std::ifstream in(tok.spec, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) return Status::io_error(tok.spec + ": cannot read the tokenizer.json to export");
  TRIDENT_ASSIGN_OR_RETURN(std::string sha256, sha256_hex_of_files({tok.spec}));
  if (sha256 != tok.sha256) {
    return Status::invalid_input(tok.spec + ": has SHA-256 " + sha256 + ", the tokenizer loaded " +
                                 "from it " + tok.sha256 + ": the file changed");
  }
  files.tokenizer_json = bytes.str();
  files.source_copied = true;
  return files;
}

}  // namespace trident
