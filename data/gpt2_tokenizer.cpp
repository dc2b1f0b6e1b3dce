#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <omp.h>
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/check.h"

namespace trident {

namespace {

constexpr uint32_t kNoId = 0xFFFFFFFFu;
constexpr size_t kExpectedMerges = 50000;

// \s as Unicode White_Space (what Python's `regex` and tiktoken's Rust regex use), spelled
// out so the result does not depend on which \s the PCRE2 build implements.
#define TRIDENT_GPT2_WS \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" TRIDENT_GPT2_WS "\\p{L}\\p{N}]+"
    "|[" TRIDENT_GPT2_WS "]+(?![^" TRIDENT_GPT2_WS "])|[" TRIDENT_GPT2_WS "]+";
#undef TRIDENT_GPT2_WS

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

// Open-addressing map (left id, right id) -> (rank, merged id): the BPE inner loop is
// mostly these lookups.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  MergeTable() : keys_(kSlots, kEmpty), values_(kSlots) {}

  bool insert(uint32_t left, uint32_t right, Merge m) {
    const uint64_t key = pack(left, right);
    for (size_t s = slot(key);; s = (s + 1) & (kSlots - 1)) {
      if (keys_[s] == key) return false;
      if (keys_[s] == kEmpty) {
        keys_[s] = key;
        values_[s] = m;
        return true;
      }
    }
  }
  const Merge* find(uint32_t left, uint32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t s = slot(key);; s = (s + 1) & (kSlots - 1)) {
      if (keys_[s] == key) return &values_[s];
      if (keys_[s] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr size_t kSlots = 1 << 17;  // > 2 x 50,000 merges
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  static size_t slot(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> (64 - 17); }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
};

std::atomic<uint64_t> g_next_tokenizer_id{1};

// Each thread's piece -> ids cache. Thread-local rather than in the tokenizer so that
// encode() stays const and lock-free; tagged with the owning tokenizer's id so two
// tokenizers never share entries. Bounded: cleared when it grows past kCacheEntries.
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<uint32_t>> map;
};
constexpr size_t kCacheEntries = 1 << 18;
thread_local PieceCache t_cache;

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid_input(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read error");
  return ss.str();
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  uint64_t id = 0;
  pcre2_code* code = nullptr;
  std::vector<std::string> id_bytes;  // [kGpt2VocabSize]
  uint32_t byte_id[256] = {};
  MergeTable merges;

  ~Impl() { pcre2_code_free(code); }

  void bpe_small(std::vector<uint32_t>* parts) const;
  void bpe_heap(std::vector<uint32_t>* parts) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>* out) const;
  void encode_range(std::string_view text, size_t begin, size_t end,
                    std::vector<uint32_t>* out) const;
};

// Merges the lowest-ranked adjacent pair, leftmost first, until no pair has a rank. This
// equals the reference's "merge every occurrence of the best pair" loop: a merge never
// creates another instance of the pair just merged, so the remaining occurrences are
// merged next, left to right. O(n^2): for short pieces.
void Gpt2Tokenizer::Impl::bpe_small(std::vector<uint32_t>* parts) const {
  std::vector<uint32_t>& p = *parts;
  while (p.size() >= 2) {
    uint32_t best_rank = kNoId;
    size_t best = 0;
    uint32_t best_id = 0;
    for (size_t i = 0; i + 1 < p.size(); ++i) {
      const MergeTable::Merge* m = merges.find(p[i], p[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best = i;
        best_id = m->id;
      }
    }
    if (best_rank == kNoId) break;
    p[best] = best_id;
    p.erase(p.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
}

// The same merges in O(n log n) for long pieces (long words, whitespace runs): a linked
// list of parts and a min-heap of (rank, position) over adjacent pairs; entries made
// stale by a merge are recognised on pop by their ids no longer matching.
void Gpt2Tokenizer::Impl::bpe_heap(std::vector<uint32_t>* parts) const {
  std::vector<uint32_t>& ids = *parts;
  const int n = static_cast<int>(ids.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Entry {
    uint32_t rank;
    int pos;
    uint32_t left, right;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    const MergeTable::Merge* m = merges.find(ids[i], ids[next[i]]);
    if (m != nullptr) heap.push({m->rank, i, ids[i], ids[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const int j = next[e.pos];
    if (ids[e.pos] != e.left || j < 0 || ids[j] != e.right) continue;
    ids[e.pos] = merges.find(e.left, e.right)->id;
    ids[j] = kNoId;
    next[e.pos] = next[j];
    if (next[j] >= 0) prev[next[j]] = e.pos;
    push(prev[e.pos]);
    push(e.pos);
  }
  size_t w = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

void Gpt2Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<uint32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  PieceCache& cache = t_cache;
  if (cache.owner != id) {
    cache.map.clear();
    cache.owner = id;
  }
  const std::string key(piece);
  auto it = cache.map.find(key);
  if (it != cache.map.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<uint32_t> parts(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) parts[i] = byte_id[static_cast<unsigned char>(piece[i])];
  if (parts.size() < 64) {
    bpe_small(&parts);
  } else {
    bpe_heap(&parts);
  }
  out->insert(out->end(), parts.begin(), parts.end());
  if (cache.map.size() >= kCacheEntries) cache.map.clear();
  cache.map.emplace(key, std::move(parts));
}

void Gpt2Tokenizer::Impl::encode_range(std::string_view text, size_t begin, size_t end,
                                       std::vector<uint32_t>* out) const {
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  TRIDENT_CHECK(match != nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = begin;
  while (pos < end) {
    // The text was validated once by the caller; checking again per match would make
    // the scan quadratic.
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match.get(),
                               nullptr);
    // Every character matches one alternative, so a match always starts at pos.
    TRIDENT_CHECK_MSG(rc > 0, "GPT-2 pre-tokenizer found no match at byte " + std::to_string(pos));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    if (ovector[0] >= end) break;
    TRIDENT_CHECK(ovector[1] > ovector[0]);
    encode_piece(text.substr(ovector[0], ovector[1] - ovector[0]), out);
    pos = ovector[1];
  }
}

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Result<Gpt2Tokenizer> Gpt2Tokenizer::load_dir(const std::string& dir) {
  return load(dir + "/encoder.json", dir + "/vocab.bpe");
}

Result<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& encoder_json,
                                          const std::string& vocab_bpe) {
  auto impl = std::make_unique<Impl>();
  impl->id = g_next_tokenizer_id.fetch_add(1);

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

  // ---- encoder.json: {"token string": id, ...}
  TRIDENT_ASSIGN_OR_RETURN(std::string json_text, read_file(encoder_json));
  nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return Status::invalid_input(encoder_json + ": not a JSON object");
  if (json.size() != static_cast<size_t>(kGpt2VocabSize)) {
    return Status::invalid_input(encoder_json + ": " + std::to_string(json.size()) +
                                 " entries, expected " + std::to_string(kGpt2VocabSize));
  }
  impl->id_bytes.assign(kGpt2VocabSize, std::string());
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
      impl->id_bytes[id] = key;  // decodes to its literal text; never a BPE result
      continue;
    }
    if (!to_bytes(key, &bytes)) {
      return Status::invalid_input(encoder_json + ": entry '" + key +
                                   "' is not a byte-level token string");
    }
    impl->id_bytes[id] = bytes;
    bytes_id.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_id.end()) {
      return Status::invalid_input(encoder_json + ": no token for byte " + std::to_string(b));
    }
    impl->byte_id[b] = it->second;
  }

  // ---- vocab.bpe: "#version: 0.2", then one merge "left right" per line, by rank.
  TRIDENT_ASSIGN_OR_RETURN(std::string bpe_text, read_file(vocab_bpe));
  std::istringstream lines(bpe_text);
  std::string line;
  size_t line_no = 0;
  uint32_t rank = 0;
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
    if (!impl->merges.insert(l->second, r->second, {rank, m->second})) {
      return bad("duplicate merge");
    }
    ++rank;
  }
  if (rank != kExpectedMerges) {
    return Status::invalid_input(vocab_bpe + ": " + std::to_string(rank) + " merges, expected " +
                                 std::to_string(kExpectedMerges));
  }

  // ---- the pre-tokenizer
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &error_offset,
                             nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::internal("GPT-2 pattern does not compile at " + std::to_string(error_offset) +
                            ": " + reinterpret_cast<const char*>(message));
  }
  // JIT is several times faster; without it (no JIT in this PCRE2 build) the interpreter
  // gives the same matches.
  (void)pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);
  return Gpt2Tokenizer(std::move(impl));
}

namespace {
bool valid_utf8(std::string_view text) {
  std::string scratch;
  // Fast path: pure ASCII needs no decoding.
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return true;
  return sanitize_utf8(text, &scratch) == 0;
}
}  // namespace

void Gpt2Tokenizer::encode(std::string_view text, std::vector<uint32_t>* out) const {
  TRIDENT_CHECK_MSG(valid_utf8(text), "Gpt2Tokenizer::encode: text is not valid UTF-8");
  impl_->encode_range(text, 0, text.size(), out);
}

void Gpt2Tokenizer::encode_parallel(std::string_view text, int threads,
                                    std::vector<uint32_t>* out, size_t end) const {
  TRIDENT_CHECK_MSG(valid_utf8(text), "Gpt2Tokenizer::encode_parallel: text is not valid UTF-8");
  end = std::min(end, text.size());
  // Pieces of at least 256 KiB, about 4 per thread so uneven pieces still balance.
  threads = std::max(threads, 1);
  const size_t target = std::max<size_t>(size_t{1} << 18, end / (size_t(threads) * 4) + 1);
  std::vector<size_t> bounds{0};
  for (size_t p = target; threads > 1 && p < end; p = bounds.back() + target) {
    while (p < end && !safe_split(text, p)) ++p;
    if (p >= end) break;
    bounds.push_back(p);
  }
  bounds.push_back(end);
  const int pieces = static_cast<int>(bounds.size()) - 1;
  if (pieces == 1) {
    impl_->encode_range(text, 0, end, out);
    return;
  }
  std::vector<std::vector<uint32_t>> ids(pieces);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int i = 0; i < pieces; ++i) impl_->encode_range(text, bounds[i], bounds[i + 1], &ids[i]);
  size_t total = out->size();
  for (const auto& v : ids) total += v.size();
  out->reserve(total);
  for (const auto& v : ids) out->insert(out->end(), v.begin(), v.end());
}

std::string Gpt2Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  for (uint32_t id : ids) {
    TRIDENT_CHECK_MSG(id < kGpt2VocabSize, "Gpt2Tokenizer::decode: id " + std::to_string(id));
    text += impl_->id_bytes[id];
  }
  return text;
}

size_t sanitize_utf8(std::string_view in, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t replaced = 0;
  out->reserve(out->size() + in.size());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = in[i];
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;  // nothing above U+10FFFF
    } else {
      out->append(kReplacement);
      ++replaced;
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      const unsigned char lo = k == 0 ? lower : 0x80, hi = k == 0 ? upper : 0xBF;
      if (j >= n || static_cast<unsigned char>(in[j]) < lo || static_cast<unsigned char>(in[j]) > hi) {
        ok = false;  // the maximal subpart [i, j) becomes one U+FFFD; in[j] starts afresh
        break;
      }
    }
    if (ok) {
      out->append(in.substr(i, j - i));
    } else {
      out->append(kReplacement);
      ++replaced;
    }
    i = j;
  }
  return replaced;
}

}  // namespace trident
