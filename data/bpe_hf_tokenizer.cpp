#include "data/bpe_hf_tokenizer.h"

#include <array>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident {

namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode, inverted: the code point a byte-level vocabulary writes for a
// byte -> the byte, -1 for the other code points (all below 256 + 68).
const std::array<int, 324>& byte_of_char() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[printable ? b : next++] = b;
    }
    return t;
  }();
  return table;
}

// The bytes of a byte-level string, or false when a character is not one of the 256.
bool byte_level_bytes(const std::string& s, std::string* out) {
  out->clear();
  const auto& table = byte_of_char();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c >> 5) == 0x6 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // three-byte characters and beyond are all above U+0143
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    out->push_back(static_cast<char>(table[cp]));
  }
  return true;
}

// j[key], or null when j is no object or lacks it: never throws, unlike json::value.
json field(const json& j, const char* key) {
  if (!j.is_object()) return json();
  auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  Status bad(const std::string& where, const std::string& why) const {
    return Status::invalid_input(path_ + ": " + where + ": " + why);
  }
  static std::string type_of(const json& j) {
    auto t = j.find("type");
    return t != j.end() && t->is_string() ? t->get<std::string>() : std::string("(none)");
  }
  // `key` of object j is absent, or null, or equal to `allowed`.
  Status expect(const json& j, const std::string& where, const char* key, const json& allowed) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null() || *it == allowed) return Status::ok();
    return bad(where + "." + key, it->dump() + " is not implemented (allowed: " +
                                      (allowed.is_null() ? "null" : allowed.dump()) + ")");
  }

  Result<BpePattern> pre_tokenizer(const json& root) const {
    auto it = root.find("pre_tokenizer");
    if (it == root.end() || it->is_null()) {
      return bad("pre_tokenizer", "null; Trident needs a byte-level pre-tokenizer");
    }
    const json& p = *it;
    const std::string type = type_of(p);
    if (type == "ByteLevel") {
      TRIDENT_RETURN_IF_ERROR(expect(p, "pre_tokenizer", "add_prefix_space", false));
      if (field(p, "use_regex") == false) {
        return bad("pre_tokenizer.use_regex", "false with no Split before it: no pattern");
      }
      return BpePattern::kGpt2;
    }
    if (type != "Sequence") {
      return bad("pre_tokenizer.type", "'" + type +
                                           "' is not implemented (ByteLevel, or a Sequence of Split "
                                           "and ByteLevel)");
    }
    const json seq = field(p, "pretokenizers");
    if (!seq.is_array() || seq.size() != 2 || type_of(seq[0]) != "Split" ||
        type_of(seq[1]) != "ByteLevel") {
      return bad("pre_tokenizer.pretokenizers",
                 "Trident implements the Sequence [Split, ByteLevel] only, not " + seq.dump().substr(0, 200));
    }
    const json& split = seq[0];
    const json& level = seq[1];
    const std::string sf = "pre_tokenizer.pretokenizers[0]";
    if (field(split, "behavior") != "Isolated") {
      return bad(sf + ".behavior", field(split, "behavior").dump() + " is not implemented (Isolated)");
    }
    TRIDENT_RETURN_IF_ERROR(expect(split, sf, "invert", false));
    const json pattern = field(split, "pattern");
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      return bad(sf + ".pattern", pattern.dump().substr(0, 200) + ": Trident needs {\"Regex\": ...}");
    }
    const std::string regex = pattern["Regex"].get<std::string>();
    BpePattern found{};
    bool known = false;
    for (BpePattern k : {BpePattern::kGpt2, BpePattern::kCl100k, BpePattern::kO200k}) {
      if (regex == bpe_pattern_source(k)) {
        found = k;
        known = true;
        break;
      }
    }
    if (!known) {
      return bad(sf + ".pattern.Regex",
                 "'" + regex.substr(0, 300) +
                     "' is none of the patterns Trident implements (gpt2, cl100k = llama3, o200k, "
                     "spelled as tiktoken spells them)");
    }
    const std::string lf = "pre_tokenizer.pretokenizers[1]";
    TRIDENT_RETURN_IF_ERROR(expect(level, lf, "add_prefix_space", false));
    if (field(level, "use_regex") != false) {
      return bad(lf + ".use_regex", "true after a Split would split twice; not implemented");
    }
    return found;
  }

  // The id TemplateProcessing's single template starts with, or -1; refuses the
  // post-processors Trident does not know.
  Result<int64_t> post_processor(const json& p, const std::string& where) const {
    if (p.is_null()) return int64_t{-1};
    const std::string type = type_of(p);
    if (type == "ByteLevel") return int64_t{-1};
    if (type == "Sequence") {
      int64_t first = -1;
      const json list = field(p, "processors");
      if (!list.is_array()) return bad(where + ".processors", "not an array");
      for (size_t i = 0; i < list.size(); ++i) {
        TRIDENT_ASSIGN_OR_RETURN(int64_t id, post_processor(list[i], where + ".processors[" +
                                                                         std::to_string(i) + "]"));
        if (first < 0) first = id;
      }
      return first;
    }
    if (type == "TemplateProcessing") {
      const json single = field(p, "single");
      if (!single.is_array() || single.empty() || field(single[0], "SpecialToken").is_null()) {
        return int64_t{-1};
      }
      const json name = field(field(single[0], "SpecialToken"), "id");
      const json tokens = field(p, "special_tokens");
      if (!name.is_string() || !tokens.is_object() || !tokens.contains(name.get<std::string>())) {
        return bad(where + ".single[0]", "names no entry of " + where + ".special_tokens");
      }
      const json ids = field(tokens[name.get<std::string>()], "ids");
      if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_unsigned()) {
        return bad(where + ".special_tokens." + name.get<std::string>() + ".ids",
                   "expected one id, got " + ids.dump());
      }
      return ids[0].get<int64_t>();
    }
    return bad(where + ".type", "'" + type +
                                    "' is not implemented (null, ByteLevel, TemplateProcessing, "
                                    "Sequence)");
  }

  Result<LoadedTokenizer> load() const {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return Status::invalid_input(path_ + ": cannot open for reading");
    const json root = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) {
      return Status::invalid_input(path_ + ": not a JSON object (a Hugging Face tokenizer.json)");
    }
    auto model_it = root.find("model");
    if (model_it == root.end() || !model_it->is_object()) return bad("model", "missing");
    const json& model = *model_it;
    if (type_of(model) != "BPE") {
      return bad("model.type", "'" + type_of(model) +
                                   "' is not implemented (Trident reads byte-level BPE only)");
    }
    TRIDENT_RETURN_IF_ERROR(expect(model, "model", "dropout", json()));
    TRIDENT_RETURN_IF_ERROR(expect(model, "model", "byte_fallback", false));
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      TRIDENT_RETURN_IF_ERROR(expect(model, "model", affix, ""));
    }
    json ignore = field(model, "ignore_merges");
    if (ignore.is_null()) ignore = false;
    if (!ignore.is_boolean()) return bad("model.ignore_merges", "not a boolean");
    auto norm = root.find("normalizer");
    if (norm != root.end() && !norm->is_null()) {
      return bad("normalizer", "'" + type_of(*norm) + "' is not implemented (null only)");
    }
    auto dec = root.find("decoder");
    if (dec != root.end() && !dec->is_null() && type_of(*dec) != "ByteLevel") {
      return bad("decoder.type", "'" + type_of(*dec) + "' is not implemented (null, ByteLevel)");
    }
    TRIDENT_ASSIGN_OR_RETURN(BpePattern pattern, pre_tokenizer(root));
    TRIDENT_ASSIGN_OR_RETURN(int64_t template_first,
                             post_processor(field(root, "post_processor"), "post_processor"));

    // Added tokens: id -> text.
    std::map<uint64_t, std::string> added;
    std::vector<BpeSpecialToken> specials;
    json list = field(root, "added_tokens");
    if (list.is_null()) list = json::array();
    if (!list.is_array()) return bad("added_tokens", "not an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = "added_tokens[" + std::to_string(i) + "]";
      const json& t = list[i];
      if (!field(t, "id").is_number_unsigned() || !field(t, "content").is_string() ||
          t["content"].get<std::string>().empty()) {
        return bad(f, "needs an id and a non-empty content");
      }
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        TRIDENT_RETURN_IF_ERROR(expect(t, f, flag, false));
      }
      const uint64_t id = t["id"].get<uint64_t>();
      if (id > 0x7FFFFFFFu || !added.emplace(id, t["content"].get<std::string>()).second) {
        return bad(f + ".id", std::to_string(id) + " is out of range or repeats");
      }
      specials.push_back({t["content"].get<std::string>(), static_cast<uint32_t>(id)});
    }

    // The ranks: vocab less the added tokens, ids 0..n-1.
    auto vocab_it = model.find("vocab");
    if (vocab_it == model.end() || !vocab_it->is_object() || vocab_it->empty()) {
      return bad("model.vocab", "missing or empty");
    }
    const json& vocab = *vocab_it;
    std::vector<std::string> tokens;
    std::vector<bool> have;
    std::string bytes;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() > 0x7FFFFFFFu) {
        return bad("model.vocab." + it.key(), "the id is not a non-negative integer");
      }
      const uint64_t id = it->get<uint64_t>();
      if (auto a = added.find(id); a != added.end()) {
        if (a->second != it.key()) {
          return bad("model.vocab." + it.key(), "id " + std::to_string(id) +
                                                    " belongs to the added token '" + a->second + "'");
        }
        continue;
      }
      if (!byte_level_bytes(it.key(), &bytes)) {
        return bad("model.vocab", "'" + it.key() + "' is not a byte-level token (GPT-2's "
                                                   "bytes_to_unicode characters)");
      }
      if (id >= tokens.size()) {
        tokens.resize(id + 1);
        have.resize(id + 1, false);
      }
      if (have[id]) return bad("model.vocab." + it.key(), "id " + std::to_string(id) + " repeats");
      have[id] = true;
      tokens[id] = bytes;
    }
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (!have[r]) {
        return bad("model.vocab", "no token has id " + std::to_string(r) +
                                      " (the ids of the ordinary tokens must be 0..n-1, the added "
                                      "tokens after them)");
      }
    }

    // Merges: pairs of ranks, in order.
    auto merges_it = model.find("merges");
    if (merges_it == model.end() || !merges_it->is_array()) return bad("model.merges", "missing");
    std::vector<std::pair<uint32_t, uint32_t>> merges;
    merges.reserve(merges_it->size());
    auto rank_of = [&](const std::string& s) -> int64_t {
      auto it = vocab.find(s);
      if (it == vocab.end() || added.count(it->get<uint64_t>())) return -1;
      return it->get<int64_t>();
    };
    for (size_t i = 0; i < merges_it->size(); ++i) {
      const json& m = (*merges_it)[i];
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return bad("model.merges[" + std::to_string(i) + "]", "'" + s + "' is not 'a b'");
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return bad("model.merges[" + std::to_string(i) + "]", "not 'a b' or [a, b]");
      }
      const int64_t l = rank_of(left), r = rank_of(right), lr = rank_of(left + right);
      if (l < 0 || r < 0 || lr < 0) {
        return bad("model.merges[" + std::to_string(i) + "]",
                   "'" + (l < 0 ? left : r < 0 ? right : left + right) + "' is not in model.vocab");
      }
      merges.push_back({static_cast<uint32_t>(l), static_cast<uint32_t>(r)});
    }

    const BpeMergeRule rule = ignore.get<bool>() ? BpeMergeRule::kRecordedMergesWholePiece
                                                 : BpeMergeRule::kRecordedMerges;
    TRIDENT_ASSIGN_OR_RETURN(BpeTokenizer bpe, BpeTokenizer::create(path_, std::move(tokens), pattern,
                                                                    rule, merges, std::move(specials)));
    int64_t document = template_first;
    if (document >= 0 && !added.count(static_cast<uint64_t>(document))) {
      return bad("post_processor", "the template starts with id " + std::to_string(document) +
                                       ", which is no added token");
    }
    if (document < 0) document = bpe.special_id("<|endoftext|>");
    if (document < 0) {
      return bad("added_tokens", "no document token: neither a TemplateProcessing post_processor "
                                 "that starts with a special token nor an <|endoftext|> added token");
    }
    return LoadedTokenizer{std::move(bpe), static_cast<uint32_t>(document), {}, {}};
  }

 private:
  std::string path_;
};

}  // namespace

bool is_hf_tokenizer_spec(const std::string& spec) {
  return spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0;
}

Result<LoadedTokenizer> load_hf_tokenizer(const std::string& path) { return Reader(path).load(); }

}  // namespace trident
