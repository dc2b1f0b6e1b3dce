#include "data/gpt2_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace trident {

namespace {

constexpr size_t kExpectedMerges = 50000;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes map to U+0100.. in byte order, so every byte has a visible code point.
std::vector<uint32_t> byte_to_code_point() {
  std::vector<uint32_t> cp(256, 0);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// Decodes the code points of a (valid) UTF-8 string; false on a malformed sequence.
bool utf8_code_points(std::string_view s, std::vector<uint32_t>* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out->push_back(cp);
    i += len;
  }
  return true;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid_input(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read error");
  return ss.str();
}

}  // namespace

Result<Gpt2Tokenizer> Gpt2Tokenizer::load_dir(const std::string& dir) {
  return load(dir + "/encoder.json", dir + "/vocab.bpe");
}

Result<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& encoder_json,
                                          const std::string& vocab_bpe) {
  const std::vector<uint32_t> byte_cp = byte_to_code_point();
  std::vector<int> cp_byte(512, -1);
  for (int b = 0; b < 256; ++b) cp_byte[byte_cp[b]] = b;
  std::vector<uint32_t> cps;
  // A vocabulary string (code points standing for bytes) -> the bytes.
  auto to_bytes = [&](std::string_view s, std::string* bytes) {
    if (!utf8_code_points(s, &cps)) return false;
    bytes->clear();
    for (uint32_t cp : cps) {
      if (cp >= cp_byte.size() || cp_byte[cp] < 0) return false;
      bytes->push_back(static_cast<char>(cp_byte[cp]));
    }
    return true;
  };

  // ---- encoder.json: {"token string": id, ...}; the ids are the ranks.
  TRIDENT_ASSIGN_OR_RETURN(std::string json_text, read_file(encoder_json));
  nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return Status::invalid_input(encoder_json + ": not a JSON object");
  if (json.size() != static_cast<size_t>(kGpt2VocabSize)) {
    return Status::invalid_input(encoder_json + ": " + std::to_string(json.size()) +
                                 " entries, expected " + std::to_string(kGpt2VocabSize));
  }
  std::vector<std::string> tokens(kGpt2EndOfText);  // ranks 0..50255; 50256 is special
  std::vector<bool> seen(kGpt2VocabSize, false);
  std::unordered_map<std::string, uint32_t> bytes_id;
  bytes_id.reserve(2 * kGpt2VocabSize);
  std::string bytes;
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    if (!it->is_number_integer() || *it < 0 || *it >= kGpt2VocabSize || seen[*it]) {
      return Status::invalid_input(encoder_json + ": entry '" + key + "' has id " + it->dump() +
                                   " (ids must be distinct, in [0, " +
                                   std::to_string(kGpt2VocabSize) + "))");
    }
    const uint32_t id = it->get<uint32_t>();
    seen[id] = true;
    if (id == kGpt2EndOfText) {
      if (key != "<|endoftext|>") {
        return Status::invalid_input(encoder_json + ": id 50256 is '" + key +
                                     "', expected <|endoftext|>");
      }
      continue;  // decodes to its literal text; never a BPE result
    }
    if (!to_bytes(key, &bytes)) {
      return Status::invalid_input(encoder_json + ": entry '" + key +
                                   "' is not a byte-level token string");
    }
    tokens[id] = bytes;
    bytes_id.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    if (bytes_id.find(std::string(1, static_cast<char>(b))) == bytes_id.end()) {
      return Status::invalid_input(encoder_json + ": no token for byte " + std::to_string(b));
    }
  }

  // ---- vocab.bpe: "#version: 0.2", then one merge "left right" per line, by rank.
  TRIDENT_ASSIGN_OR_RETURN(std::string bpe_text, read_file(vocab_bpe));
  std::istringstream lines(bpe_text);
  std::string line;
  size_t line_no = 0;
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  merges.reserve(kExpectedMerges);
  std::unordered_map<uint64_t, size_t> merge_line;
  std::string left, right;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    auto bad = [&](const std::string& why) {
      return Status::invalid_input(vocab_bpe + ": line " + std::to_string(line_no) + " '" + line +
                                   "': " + why);
    };
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return bad("expected two tokens separated by one space");
    }
    if (!to_bytes(std::string_view(line).substr(0, space), &left) ||
        !to_bytes(std::string_view(line).substr(space + 1), &right)) {
      return bad("not byte-level token strings");
    }
    auto l = bytes_id.find(left), r = bytes_id.find(right), m = bytes_id.find(left + right);
    if (l == bytes_id.end() || r == bytes_id.end() || m == bytes_id.end()) {
      return bad("a part or the merged token is not in " + encoder_json);
    }
    if (!merge_line.emplace((uint64_t{l->second} << 32) | r->second, line_no).second) {
      return bad("duplicate merge");
    }
    merges.push_back({l->second, r->second});
  }
  if (merges.size() != kExpectedMerges) {
    return Status::invalid_input(vocab_bpe + ": " + std::to_string(merges.size()) +
                                 " merges, expected " + std::to_string(kExpectedMerges));
  }
  TRIDENT_ASSIGN_OR_RETURN(
      BpeTokenizer bpe,
      BpeTokenizer::create("gpt2", std::move(tokens), BpePattern::kGpt2,
                           BpeMergeRule::kRecordedMerges, merges,
                           {{"<|endoftext|>", kGpt2EndOfText}}));
  return Gpt2Tokenizer(std::move(bpe));
}

}  // namespace trident
