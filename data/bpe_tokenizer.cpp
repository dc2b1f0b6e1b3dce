#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <omp.h>
#include <openssl/evp.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <queue>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "core/check.h"

namespace trident {

namespace {

constexpr uint32_t kNoId = 0xFFFFFFFFu;

// \s as Unicode White_Space (what Python's `regex` and tiktoken's Rust regex use), spelled
// out so the result does not depend on which \s the PCRE2 build implements.
#define TRIDENT_WS \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
// The whitespace alternatives that end every pattern: \s+(?!\S)|\s+.
#define TRIDENT_WS_TAIL "|[" TRIDENT_WS "]+(?![^" TRIDENT_WS "])|[" TRIDENT_WS "]+"
// cl100k's and llama3's, from the npm tiktoken package's encoders/cl100k_base.json.
#define TRIDENT_CL100K                                                                  \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"              \
  "| ?[^" TRIDENT_WS "\\p{L}\\p{N}]+[\\r\\n]*|[" TRIDENT_WS "]*[\\r\\n]+" TRIDENT_WS_TAIL
#define TRIDENT_O200K_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define TRIDENT_O200K_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define TRIDENT_O200K_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"

const char* pattern_regex(BpePattern pattern) {
  switch (pattern) {
    case BpePattern::kGpt2:
      return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" TRIDENT_WS "\\p{L}\\p{N}]+"
          TRIDENT_WS_TAIL;
    case BpePattern::kCl100k:
    case BpePattern::kLlama3:
      return TRIDENT_CL100K;
    case BpePattern::kO200k:
      // From the npm tiktoken package's encoders/o200k_base.json.
      return "[^\\r\\n\\p{L}\\p{N}]?" TRIDENT_O200K_UPPER "*" TRIDENT_O200K_LOWER
          "+" TRIDENT_O200K_CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?" TRIDENT_O200K_UPPER
          "+" TRIDENT_O200K_LOWER "*" TRIDENT_O200K_CONTRACTION "|\\p{N}{1,3}"
          "| ?[^" TRIDENT_WS "\\p{L}\\p{N}]+[\\r\\n/]*|[" TRIDENT_WS "]*[\\r\\n]+" TRIDENT_WS_TAIL;
  }
  return "";
}
// The same patterns with \s, as tiktoken's pat_str and Hugging Face's Split regex spell them.
#define TRIDENT_SOURCE_TAIL "|\\s+(?!\\S)|\\s+"
const char* pattern_source_regex(BpePattern pattern) {
  switch (pattern) {
    case BpePattern::kGpt2:
      return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+" TRIDENT_SOURCE_TAIL;
    case BpePattern::kCl100k:
    case BpePattern::kLlama3:
      return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
             "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+" TRIDENT_SOURCE_TAIL;
    case BpePattern::kO200k:
      return "[^\\r\\n\\p{L}\\p{N}]?" TRIDENT_O200K_UPPER "*" TRIDENT_O200K_LOWER
          "+" TRIDENT_O200K_CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?" TRIDENT_O200K_UPPER
          "+" TRIDENT_O200K_LOWER "*" TRIDENT_O200K_CONTRACTION "|\\p{N}{1,3}"
          "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+" TRIDENT_SOURCE_TAIL;
  }
  return "";
}
#undef TRIDENT_SOURCE_TAIL
#undef TRIDENT_O200K_CONTRACTION
#undef TRIDENT_O200K_LOWER
#undef TRIDENT_O200K_UPPER
#undef TRIDENT_CL100K
#undef TRIDENT_WS_TAIL
#undef TRIDENT_WS

// Open-addressing map (left id, right id) -> (rank, merged id): the BPE inner loop is
// mostly these lookups. Sized at load to at most half full.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  void reserve(size_t entries) {
    bits_ = 4;
    while ((size_t{1} << bits_) < 2 * entries) ++bits_;
    keys_.assign(size_t{1} << bits_, kEmpty);
    values_.assign(size_t{1} << bits_, Merge{});
  }

  bool insert(uint32_t left, uint32_t right, Merge m) {
    const uint64_t key = pack(left, right);
    for (size_t s = slot(key);; s = (s + 1) & mask()) {
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
    for (size_t s = slot(key);; s = (s + 1) & mask()) {
      if (keys_[s] == key) return &values_[s];
      if (keys_[s] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  size_t mask() const { return (size_t{1} << bits_) - 1; }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> (64 - bits_); }
  int bits_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
};

// Open-addressing map token bytes -> rank over strings that outlive it (the tokenizer's
// id_bytes, a rank file's tokens): a vocabulary of 200k tokens loads in a fraction of the
// time of a node-based map, and the whole-piece lookup of encode() is one probe.
class TokenIndex {
 public:
  void reserve(size_t entries) {
    bits_ = 4;
    while ((size_t{1} << bits_) < 2 * entries) ++bits_;
    slots_.assign(size_t{1} << bits_, Slot{});
  }
  // False (and nothing changes) when `bytes` is there already; *existing gets its value.
  bool insert(std::string_view bytes, uint32_t value, uint32_t* existing = nullptr) {
    for (size_t s = slot(bytes);; s = (s + 1) & mask()) {
      if (slots_[s].data == nullptr) {
        slots_[s] = {bytes.data(), static_cast<uint32_t>(bytes.size()), value};
        return true;
      }
      if (view(slots_[s]) == bytes) {
        if (existing != nullptr) *existing = slots_[s].value;
        return false;
      }
    }
  }
  uint32_t find(std::string_view bytes) const {
    for (size_t s = slot(bytes);; s = (s + 1) & mask()) {
      if (slots_[s].data == nullptr) return kNoId;
      if (view(slots_[s]) == bytes) return slots_[s].value;
    }
  }

 private:
  struct Slot {
    const char* data = nullptr;
    uint32_t size = 0;
    uint32_t value = 0;
  };
  static std::string_view view(const Slot& s) { return {s.data, s.size}; }
  size_t mask() const { return (size_t{1} << bits_) - 1; }
  size_t slot(std::string_view bytes) const {
    return (std::hash<std::string_view>{}(bytes) * 0x9E3779B97F4A7C15ull) >> (64 - bits_);
  }
  int bits_ = 0;
  std::vector<Slot> slots_;
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

bool valid_utf8(std::string_view text) {
  std::string scratch;
  // Fast path: pure ASCII needs no decoding.
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return true;
  return sanitize_utf8(text, &scratch) == 0;
}

}  // namespace

const char* bpe_pattern_name(BpePattern pattern) {
  switch (pattern) {
    case BpePattern::kGpt2: return "gpt2";
    case BpePattern::kCl100k: return "cl100k";
    case BpePattern::kO200k: return "o200k";
    case BpePattern::kLlama3: return "llama3";
  }
  return "?";
}

const char* bpe_pattern_source(BpePattern pattern) { return pattern_source_regex(pattern); }

Result<BpePattern> parse_bpe_pattern(const std::string& name) {
  for (BpePattern p : {BpePattern::kGpt2, BpePattern::kCl100k, BpePattern::kO200k,
                       BpePattern::kLlama3}) {
    if (name == bpe_pattern_name(p)) return p;
  }
  return Status::invalid_config("unknown pre-tokenizer pattern '" + name +
                                "' (allowed: gpt2, cl100k, o200k, llama3)");
}

struct BpeTokenizer::Impl {
  uint64_t id = 0;
  std::string name;
  BpePattern pattern = BpePattern::kGpt2;
  BpeMergeRule rule = BpeMergeRule::kTiktoken;
  pcre2_code* code = nullptr;
  std::vector<std::string> id_bytes;  // [vocab size]; special tokens hold their text
  std::vector<bool> is_id;            // false for the ids between ranks and specials
  uint32_t byte_id[256] = {};
  MergeTable merges;
  size_t ranks = 0;
  std::vector<std::pair<uint32_t, uint32_t>> recorded;  // kRecordedMerges*: the list given
  // kTiktoken's whole-piece lookup: token bytes -> rank (views into id_bytes).
  TokenIndex rank_of;
  std::vector<BpeSpecialToken> specials;
  bool special_first_byte[256] = {};

  ~Impl() { pcre2_code_free(code); }

  // kTiktoken's pairs: every cut of a token into two tokens, as {left, right, token}, by
  // the token's rank, then by the cut's position.
  std::vector<std::array<uint32_t, 3>> tiktoken_pairs() const;

  void bpe_small(std::vector<uint32_t>* parts) const;
  void bpe_heap(std::vector<uint32_t>* parts) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>* out) const;
  void encode_range(std::string_view text, size_t begin, size_t end,
                    std::vector<uint32_t>* out) const;
  // encode_parallel without special tokens: text[end:] is look-ahead.
  void encode_parallel_range(std::string_view text, int threads, std::vector<uint32_t>* out,
                             size_t end) const;
};

// Merges the lowest-ranked adjacent pair, leftmost first, until no pair has a rank. This
// equals GPT-2's "merge every occurrence of the best pair" loop: a merge never creates
// another instance of the pair just merged, so the remaining occurrences are merged next,
// left to right; and it is tiktoken's loop as written. O(n^2): for short pieces.
void BpeTokenizer::Impl::bpe_small(std::vector<uint32_t>* parts) const {
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
void BpeTokenizer::Impl::bpe_heap(std::vector<uint32_t>* parts) const {
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

void BpeTokenizer::Impl::encode_piece(std::string_view piece, std::vector<uint32_t>* out) const {
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
  std::vector<uint32_t> parts;
  const uint32_t whole = rule != BpeMergeRule::kRecordedMerges ? rank_of.find(piece) : kNoId;
  if (whole != kNoId) {
    parts.push_back(whole);
  } else {
    parts.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) parts[i] = byte_id[static_cast<unsigned char>(piece[i])];
    if (parts.size() < 64) {
      bpe_small(&parts);
    } else {
      bpe_heap(&parts);
    }
  }
  out->insert(out->end(), parts.begin(), parts.end());
  if (cache.map.size() >= kCacheEntries) cache.map.clear();
  cache.map.emplace(key, std::move(parts));
}

void BpeTokenizer::Impl::encode_range(std::string_view text, size_t begin, size_t end,
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
    TRIDENT_CHECK_MSG(rc > 0, name + " pre-tokenizer found no match at byte " + std::to_string(pos));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    if (ovector[0] >= end) break;
    TRIDENT_CHECK(ovector[1] > ovector[0]);
    encode_piece(text.substr(ovector[0], ovector[1] - ovector[0]), out);
    pos = ovector[1];
  }
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

const std::string& BpeTokenizer::name() const { return impl_->name; }
BpePattern BpeTokenizer::pattern() const { return impl_->pattern; }
int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_bytes.size()); }
const std::vector<BpeSpecialToken>& BpeTokenizer::specials() const { return impl_->specials; }
BpeMergeRule BpeTokenizer::merge_rule() const { return impl_->rule; }
int64_t BpeTokenizer::ranks() const { return static_cast<int64_t>(impl_->ranks); }
std::string_view BpeTokenizer::token(uint32_t rank) const {
  TRIDENT_CHECK(rank < impl_->ranks);
  return impl_->id_bytes[rank];
}

std::vector<std::pair<uint32_t, uint32_t>> BpeTokenizer::merges() const {
  if (impl_->rule != BpeMergeRule::kTiktoken) return impl_->recorded;
  std::vector<std::array<uint32_t, 3>> pairs = impl_->tiktoken_pairs();
  std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
    return std::tie(a[2], a[0], a[1]) < std::tie(b[2], b[0], b[1]);
  });
  std::vector<std::pair<uint32_t, uint32_t>> out;
  out.reserve(pairs.size());
  for (const auto& p : pairs) out.push_back({p[0], p[1]});
  return out;
}

std::vector<std::array<uint32_t, 3>> BpeTokenizer::Impl::tiktoken_pairs() const {
  std::vector<std::array<uint32_t, 3>> pairs;
  for (size_t r = 0; r < ranks; ++r) {
    const std::string_view t = id_bytes[r];
    for (size_t cut = 1; cut < t.size(); ++cut) {
      const uint32_t left = rank_of.find(t.substr(0, cut));
      if (left == kNoId) continue;
      const uint32_t right = rank_of.find(t.substr(cut));
      if (right == kNoId) continue;
      pairs.push_back({left, right, static_cast<uint32_t>(r)});
    }
  }
  return pairs;
}

int64_t BpeTokenizer::special_id(std::string_view text) const {
  for (const BpeSpecialToken& s : impl_->specials) {
    if (s.text == text) return s.id;
  }
  return -1;
}

Result<BpeTokenizer> BpeTokenizer::create(std::string name, std::vector<std::string> tokens,
                                          BpePattern pattern, BpeMergeRule rule,
                                          const std::vector<std::pair<uint32_t, uint32_t>>& merges,
                                          std::vector<BpeSpecialToken> specials) {
  auto impl = std::make_unique<Impl>();
  impl->id = g_next_tokenizer_id.fetch_add(1);
  impl->name = std::move(name);
  impl->pattern = pattern;
  impl->rule = rule;
  const size_t ranks = tokens.size();
  impl->ranks = ranks;
  size_t vocab = ranks;
  for (const BpeSpecialToken& s : specials) vocab = std::max<size_t>(vocab, size_t{s.id} + 1);
  impl->id_bytes = std::move(tokens);
  impl->id_bytes.resize(vocab);
  impl->is_id.assign(vocab, false);
  std::fill(impl->is_id.begin(), impl->is_id.begin() + static_cast<ptrdiff_t>(ranks), true);
  for (const BpeSpecialToken& s : specials) {
    if (s.id < ranks || impl->is_id[s.id] || s.text.empty()) {
      return Status::invalid_input(impl->name + ": special token '" + s.text + "' has id " +
                                   std::to_string(s.id) + ", which is taken (or the text is empty)");
    }
    impl->is_id[s.id] = true;
    impl->id_bytes[s.id] = s.text;
    impl->special_first_byte[static_cast<unsigned char>(s.text[0])] = true;
  }
  impl->specials = std::move(specials);

  impl->rank_of.reserve(2 * ranks);
  for (size_t r = 0; r < ranks; ++r) {
    const std::string& t = impl->id_bytes[r];
    if (t.empty() || !impl->rank_of.insert(t, static_cast<uint32_t>(r))) {
      return Status::invalid_input(impl->name + ": rank " + std::to_string(r) +
                                   (t.empty() ? " is empty" : " repeats an earlier token"));
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    const uint32_t it = impl->rank_of.find(std::string_view(&byte, 1));
    if (it == kNoId) {
      return Status::invalid_input(impl->name + ": no token for byte " + std::to_string(b));
    }
    impl->byte_id[b] = it;
  }

  if (rule != BpeMergeRule::kTiktoken) {
    impl->merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto [l, r] = merges[i];
      const uint32_t m =
          l < ranks && r < ranks ? impl->rank_of.find(impl->id_bytes[l] + impl->id_bytes[r]) : kNoId;
      if (m == kNoId) {
        return Status::invalid_input(impl->name + ": merge " + std::to_string(i) +
                                     " makes no token");
      }
      if (!impl->merges.insert(l, r, {static_cast<uint32_t>(i), m})) {
        return Status::invalid_input(impl->name + ": merge " + std::to_string(i) + " repeats");
      }
    }
    impl->recorded = merges;
  } else {
    // Every way to cut a token into two tokens is a pair that merges into it: tiktoken
    // looks pairs up by their concatenated bytes.
    const std::vector<std::array<uint32_t, 3>> pairs = impl->tiktoken_pairs();
    impl->merges.reserve(pairs.size());
    for (const auto& [left, right, r] : pairs) impl->merges.insert(left, right, {r, r});
  }

  int error = 0;
  PCRE2_SIZE error_offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_regex(pattern)),
                             PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                             &error, &error_offset, nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::internal(std::string(bpe_pattern_name(pattern)) +
                            " pattern does not compile at " + std::to_string(error_offset) + ": " +
                            reinterpret_cast<const char*>(message));
  }
  // JIT is several times faster; without it (no JIT in this PCRE2 build) the interpreter
  // gives the same matches.
  (void)pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);
  return BpeTokenizer(std::move(impl));
}

namespace {

// Calls ordinary(begin, end) for each stretch of text[0, end) between special tokens (the
// leftmost, then the longest at one position; empty stretches too) and special(token)
// for each special token that lies inside text[0, end), in order.
template <typename Ordinary, typename Special>
void split_at_specials(const std::vector<BpeSpecialToken>& specials, const bool* first_byte,
                       std::string_view text, size_t end, Ordinary ordinary, Special special) {
  size_t start = 0;
  for (size_t p = 0; p < end; ++p) {
    if (!first_byte[static_cast<unsigned char>(text[p])]) continue;
    const BpeSpecialToken* best = nullptr;
    for (const BpeSpecialToken& s : specials) {
      if ((best == nullptr || s.text.size() > best->text.size()) && p + s.text.size() <= end &&
          text.compare(p, s.text.size(), s.text) == 0) {
        best = &s;
      }
    }
    if (best == nullptr) continue;
    ordinary(start, p);
    special(*best);
    start = p + best->text.size();
    p = start - 1;
  }
  ordinary(start, end);
}

}  // namespace

void BpeTokenizer::encode(std::string_view text, std::vector<uint32_t>* out,
                          bool allow_special) const {
  TRIDENT_CHECK_MSG(valid_utf8(text), impl_->name + ": encode: text is not valid UTF-8");
  if (!allow_special || impl_->specials.empty()) {
    impl_->encode_range(text, 0, text.size(), out);
    return;
  }
  // The ordinary text between special tokens is a subject of its own: the pattern's
  // look-ahead must not see the special token.
  split_at_specials(
      impl_->specials, impl_->special_first_byte, text, text.size(),
      [&](size_t b, size_t e) { impl_->encode_range(text.substr(b, e - b), 0, e - b, out); },
      [&](const BpeSpecialToken& s) { out->push_back(s.id); });
}

bool BpeTokenizer::safe_split(std::string_view text, size_t p, bool allow_special) const {
  if (!safe_split(text, p)) return false;
  if (!allow_special) return true;
  // Whether s may start at `start`: it does, or the text ends inside it (a block read so
  // far), so the rest may follow.
  auto may_start = [&](const std::string& s, size_t start) {
    const size_t n = std::min(s.size(), text.size() - start);
    return text.compare(start, n, s, 0, n) == 0;
  };
  for (const BpeSpecialToken& s : impl_->specials) {
    if (may_start(s.text, p)) return false;
    // A special token that spans p has the '\n' before p inside it, not last.
    for (size_t k = s.text.find('\n'); k != std::string::npos && k + 1 < s.text.size();
         k = s.text.find('\n', k + 1)) {
      if (p - 1 >= k && may_start(s.text, p - 1 - k)) return false;
    }
  }
  return true;
}

void BpeTokenizer::encode_parallel(std::string_view text, int threads,
                                   std::vector<uint32_t>* out, size_t end,
                                   bool allow_special) const {
  TRIDENT_CHECK_MSG(valid_utf8(text), impl_->name + ": encode_parallel: text is not valid UTF-8");
  end = std::min(end, text.size());
  if (!allow_special || impl_->specials.empty()) {
    impl_->encode_parallel_range(text, threads, out, end);
    return;
  }
  split_at_specials(
      impl_->specials, impl_->special_first_byte, text, end,
      [&](size_t b, size_t e) {
        // The last stretch keeps text[end:] as its look-ahead, the others end at a special.
        impl_->encode_parallel_range(e == end ? text.substr(b) : text.substr(b, e - b), threads,
                                     out, e - b);
      },
      [&](const BpeSpecialToken& s) { out->push_back(s.id); });
}

void BpeTokenizer::Impl::encode_parallel_range(std::string_view text, int threads,
                                               std::vector<uint32_t>* out, size_t end) const {
  // Pieces of at least 256 KiB, about 4 per thread so uneven pieces still balance.
  threads = std::max(threads, 1);
  const size_t target = std::max<size_t>(size_t{1} << 18, end / (size_t(threads) * 4) + 1);
  std::vector<size_t> bounds{0};
  for (size_t p = target; threads > 1 && p < end; p = bounds.back() + target) {
    while (p < end && !BpeTokenizer::safe_split(pattern, text, p)) ++p;
    if (p >= end) break;
    bounds.push_back(p);
  }
  bounds.push_back(end);
  const int pieces = static_cast<int>(bounds.size()) - 1;
  if (pieces == 1) {
    encode_range(text, 0, end, out);
    return;
  }
  std::vector<std::vector<uint32_t>> ids(pieces);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int i = 0; i < pieces; ++i) encode_range(text, bounds[i], bounds[i + 1], &ids[i]);
  size_t total = out->size();
  for (const auto& v : ids) total += v.size();
  out->reserve(total);
  for (const auto& v : ids) out->insert(out->end(), v.begin(), v.end());
}

std::string BpeTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  for (uint32_t id : ids) {
    TRIDENT_CHECK_MSG(id < impl_->is_id.size() && impl_->is_id[id],
                      impl_->name + ": decode: no token has id " + std::to_string(id));
    text += impl_->id_bytes[id];
  }
  return text;
}

// ---- tiktoken rank files ---------------------------------------------------------------

namespace {

// Standard base64 (RFC 4648 alphabet, '=' padding to a multiple of 4) through OpenSSL;
// false on anything else, including a non-canonical last character (bits beyond the data
// set): what decodes must encode back to exactly `in`.
bool decode_base64(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && in[in.size() - 1 - pad] == '=') ++pad;
  std::string bytes(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0 || static_cast<size_t>(n) != bytes.size()) return false;
  bytes.resize(bytes.size() - pad);  // EVP_DecodeBlock counts the padding as zero bytes
  std::string again(in.size() + 1, '\0');  // EVP_EncodeBlock writes a terminating NUL
  const int m = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(again.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  if (m < 0 || std::string_view(again.data(), static_cast<size_t>(m)) != in) return false;
  *out = std::move(bytes);
  return true;
}

}  // namespace

Result<std::vector<std::string>> read_tiktoken_ranks(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid_input(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read error");
  const std::string text = ss.str();
  std::vector<std::string> tokens;
  // Reserved up front so that the strings do not move: `seen` holds views of them.
  tokens.reserve(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1);
  std::vector<uint32_t> line_of;  // [rank]
  TokenIndex seen;
  seen.reserve(tokens.capacity());
  std::string bytes;
  size_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t stop = text.find('\n', begin);
    if (stop == std::string::npos) stop = text.size();
    const std::string_view line(text.data() + begin, stop - begin);
    begin = stop + 1;
    ++line_no;
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return Status::invalid_input(path + ": line " + std::to_string(line_no) + ": " + why);
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return bad("expected '<base64 token> <rank>'");
    }
    const std::string_view b64 = line.substr(0, space);
    const std::string rank_text(line.substr(space + 1));
    if (!decode_base64(b64, &bytes)) return bad("bad base64 '" + std::string(b64) + "'");
    if (rank_text.empty() || rank_text.size() > 9 ||
        rank_text.find_first_not_of("0123456789") != std::string::npos) {
      return bad("rank '" + rank_text + "' is not a non-negative integer");
    }
    const size_t rank = std::stoul(rank_text);
    if (rank < tokens.size()) return bad("duplicate rank " + rank_text);
    if (rank > tokens.size()) {
      return bad("rank " + rank_text + " where " + std::to_string(tokens.size()) +
                 " comes next (ranks must be contiguous from 0, in order)");
    }
    tokens.push_back(bytes);
    uint32_t first = 0;
    if (!seen.insert(tokens.back(), static_cast<uint32_t>(rank), &first)) {
      return bad("duplicate token '" + std::string(b64) + "' (also on line " +
                 std::to_string(line_of[first]) + ")");
    }
    line_of.push_back(static_cast<uint32_t>(line_no));
  }
  if (tokens.empty()) return Status::invalid_input(path + ": no ranks");
  return tokens;
}

Result<BpeTokenizer> BpeTokenizer::load_tiktoken(const std::string& path, BpePattern pattern,
                                                 std::vector<BpeSpecialToken> specials) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::string> tokens, read_tiktoken_ranks(path));
  return create(path, std::move(tokens), pattern, BpeMergeRule::kTiktoken, {}, std::move(specials));
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
