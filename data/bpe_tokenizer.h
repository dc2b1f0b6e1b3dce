// Byte-level BPE: the one engine behind every vocabulary Trident reads (GPT-2's
// encoder.json + vocab.bpe, tiktoken rank files: cl100k_base, o200k_base, Llama 3, and
// Hugging Face tokenizer.json files: data/bpe_hf_tokenizer.h).
//
// A vocabulary is a list of byte strings indexed by rank (the rank is the id), a
// pre-tokenizer pattern and a set of special tokens. Encoding = split the text into
// pieces with the pattern (PCRE2, UTF + UCP, JIT when available), then merge the bytes of
// each piece, lowest rank first, leftmost first among equal ranks. The merge rules:
//   kTiktoken:        any adjacent pair whose concatenation is a token merges, at that
//                     token's rank, and a piece that is itself a token is that token
//                     without merging (tiktoken's _byte_pair_merge and its whole-piece
//                     lookup; Llama 3's tokenizer.json says the same with ignore_merges).
//   kRecordedMerges:  only the pairs of a merge list merge (GPT-2's encoder.py bpe(),
//                     Hugging Face's BPE model), the earlier in the list first (GPT-2's
//                     list is in the order of the results' ranks), with no whole-piece
//                     lookup.
//   kRecordedMergesWholePiece: the same with the whole-piece lookup (Hugging Face's
//                     ignore_merges).
// \s in every pattern is Unicode White_Space, as in tiktoken's Rust regex and Python's
// `regex`: U+0085 is whitespace, U+FEFF is not (the JavaScript encoders differ exactly
// there; see docs/DATA.md).
//
// Special tokens are matched before splitting only when the caller allows them
// (encode(..., allow_special = true)): then the leftmost occurrence of any special token
// text is emitted as its id, the longest at one position, and the text between is encoded
// as separate pieces (the pattern does not see across a special token), as tiktoken's
// encode(allowed_special="all") does. By default special-token text is ordinary text.
//
// Input must be valid UTF-8: pass raw bytes through sanitize_utf8() first, which replaces
// each ill-formed subsequence with U+FFFD the way a WHATWG (Node) decoder does.
//
// Threads: a built tokenizer is immutable; encode*() and decode() may be called from many
// threads at once. Each thread keeps a private cache of piece -> ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace trident {

// The pre-tokenizer patterns, each exactly as tiktoken spells it (the npm tiktoken
// package's encoders/*.json pat_str; Llama 3's from Meta's tokenizer.py, which is
// cl100k's), with \s spelled out as White_Space.
enum class BpePattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kCl100k,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
            //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kO200k,   // case-sensitive words with the contraction attached:
            // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?|
            // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?|
            // \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,  // cl100k's pattern (Meta's tokenizer.py); its own name so a run says which.
};

// "gpt2", "cl100k", "o200k", "llama3" <-> the enum; parse fails naming the allowed ones.
const char* bpe_pattern_name(BpePattern pattern);
Result<BpePattern> parse_bpe_pattern(const std::string& name);
// The pattern as its source spells it (with \s, before Trident spells \s out): what a
// Hugging Face tokenizer.json's Split pre-tokenizer declares for it (Llama 3's is cl100k's).
const char* bpe_pattern_source(BpePattern pattern);

enum class BpeMergeRule { kTiktoken, kRecordedMerges, kRecordedMergesWholePiece };

struct BpeSpecialToken {
  std::string text;
  uint32_t id;
};

class BpeTokenizer {
 public:
  // tokens[rank] = the token's bytes (ranks 0..n-1, all distinct, every single byte among
  // them). merges: for the kRecordedMerges rules, the (left rank, right rank) pairs in
  // merge order; ignored for kTiktoken. Special ids must not collide with ranks or each
  // other.
  // `name` appears in messages ("cl100k_base", a file path).
  static Result<BpeTokenizer> create(std::string name, std::vector<std::string> tokens,
                                     BpePattern pattern, BpeMergeRule rule,
                                     const std::vector<std::pair<uint32_t, uint32_t>>& merges,
                                     std::vector<BpeSpecialToken> specials);
  // A tiktoken rank file (read_tiktoken_ranks) with kTiktoken merges.
  static Result<BpeTokenizer> load_tiktoken(const std::string& path, BpePattern pattern,
                                            std::vector<BpeSpecialToken> specials);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  const std::string& name() const;
  BpePattern pattern() const;
  // One past the largest id (ranks and special tokens): what model.vocab_size must cover.
  int64_t vocab_size() const;
  // The id of a special token's text, or -1.
  int64_t special_id(std::string_view text) const;
  const std::vector<BpeSpecialToken>& specials() const;
  BpeMergeRule merge_rule() const;
  // The ordinary tokens: ranks 0..ranks()-1, token(r) their bytes.
  int64_t ranks() const;
  std::string_view token(uint32_t rank) const;
  // The merges as a Hugging Face BPE model lists them (tokenizer.json's model.merges), in
  // their order: kRecordedMerges*: the recorded list; kTiktoken: every cut of a token into
  // two tokens, by the token's rank, then by the left part's rank, then the right's (what
  // Hugging Face's TikTokenConverter derives from a rank file; with ignore_merges they
  // give tiktoken's ids).
  std::vector<std::pair<uint32_t, uint32_t>> merges() const;

  // Appends the ids of `text` (valid UTF-8) to *out.
  void encode(std::string_view text, std::vector<uint32_t>* out, bool allow_special = false) const;
  // The ids of the pre-tokenizer matches that start before `end` (all of them by
  // default), computed by `threads` OpenMP threads over pieces of the text cut at
  // safe_split() positions; the result equals the serial encode() (special tokens are
  // ordinary text unless allow_special). text[end:] is look-ahead only: the regex sees
  // it, so a block cut at a safe split and handed over with one more byte encodes exactly
  // as inside the whole text. Text without safe splits is encoded serially. With
  // allow_special, the special tokens in text[0, end) are found first and the text
  // between them is encoded as separate subjects, each in parallel, as encode() does; a
  // block must then be cut where safe_split(text, p, true) holds.
  void encode_parallel(std::string_view text, int threads, std::vector<uint32_t>* out,
                       size_t end = std::string_view::npos, bool allow_special = false) const;

  // The bytes of the ids; every id must be a rank or a special token (a special token
  // decodes to its text). Not necessarily valid UTF-8 for an arbitrary id sequence.
  std::string decode(const std::vector<uint32_t>& ids) const;

  // Whether a match of `pattern` always starts at p (0 < p < text.size()), whatever
  // precedes or follows: text[p-1] == '\n' and text[p] is printable ASCII (0x21..0x7E),
  // for o200k also not '/'. Why, pattern by pattern:
  //   gpt2: a '\n' can only be in a whitespace match (\s+(?!\S), \s+), which cannot take
  //     the non-space after it, and the optional ' ' prefix of the other alternatives is
  //     U+0020, not '\n'.
  //   cl100k, llama3: '\n' is excluded from [^\r\n\p{L}\p{N}]? and is no letter or digit,
  //     so it is only in ' ?[^\s\p{L}\p{N}]+[\r\n]*' (where only [\r\n]* may follow it)
  //     or in the whitespace alternatives (\s*[\r\n]+, \s+(?!\S), \s+: only whitespace
  //     may follow it). A printable non-space ASCII character is neither, so no match,
  //     and no attempt of the backtracking matcher, runs from before p past p; the match
  //     starting at p does not look behind.
  //   o200k: the same, except that the punctuation run's tail is [\r\n/]*: a '/' may
  //     follow the '\n' inside one match ("x;\n/"), so text[p] must not be '/'.
  // The character at p is ASCII, so one byte of look-ahead is a whole character.
  static bool safe_split(BpePattern pattern, std::string_view text, size_t p) {
    const unsigned char c = static_cast<unsigned char>(text[p]);
    return text[p - 1] == '\n' && c >= 0x21 && c <= 0x7E && (pattern != BpePattern::kO200k || c != '/');
  }
  bool safe_split(std::string_view text, size_t p) const { return safe_split(pattern(), text, p); }
  // With special tokens matched (allow_special), a block cut must also not start or cut
  // through a special token's text, nor one that the end of `text` cuts short (it may go
  // on in the next read): then the look-ahead byte is ordinary text in both the block and
  // the whole text, and each special token lies inside one block.
  bool safe_split(std::string_view text, size_t p, bool allow_special) const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A tiktoken rank file: one "<base64 of the token's bytes> <rank>" per line, ranks 0..n-1
// (tiktoken's *.tiktoken, Llama 3's tokenizer.model). Returns tokens[rank]. A missing
// file, a line without exactly one space, bad base64 (alphabet, padding, an empty
// token), a rank that is not a decimal integer, a duplicate rank or token, or ranks that
// are not contiguous from 0 are invalid_input naming the file and the line.
Result<std::vector<std::string>> read_tiktoken_ranks(const std::string& path);

// Appends `in` to *out with every ill-formed UTF-8 subsequence replaced by U+FFFD (one
// per maximal subpart: the WHATWG Encoding Standard's rule, which Node's TextDecoder
// follows). Returns the number of replacements.
size_t sanitize_utf8(std::string_view in, std::string* out);

}  // namespace trident
