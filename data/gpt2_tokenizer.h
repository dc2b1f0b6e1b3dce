// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.json + vocab.bpe, 50,257 ids): one
// configuration of the byte-level BPE engine (data/bpe_tokenizer.h). encoder.json's ids
// are the ranks (every merge's result has id 256 + its line in vocab.bpe), vocab.bpe's
// pairs are the merges (BpeMergeRule::kRecordedMerges: exactly encoder.py's bpe()), the
// pattern is BpePattern::kGpt2 and <|endoftext|> (50256) the one special token.
//
// Encoding = pre-tokenize the text with GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (PCRE2, UTF + UCP, JIT when available), then merge the bytes of each piece by BPE rank.
// \s is Unicode White_Space, as in OpenAI's encoder.py (Python `regex`) and tiktoken,
// which llm.c and nanoGPT use: U+0085 is whitespace, U+FEFF is not. (The npm
// gpt-3-encoder, our test oracle, uses JavaScript's \s and differs on exactly those two
// code points; see docs/DATA.md.) encode() never produces the special token: the text
// "<|endoftext|>" is encoded as ordinary text; callers place kEndOfText themselves.
//
// Input must be valid UTF-8: pass raw bytes through sanitize_utf8() first, which replaces
// each ill-formed subsequence with U+FFFD the way a WHATWG (Node) decoder does.
//
// Threads: a loaded tokenizer is immutable; encode*() and decode() may be called from
// many threads at once. Each thread keeps a private cache of piece -> ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/bpe_tokenizer.h"

namespace trident {

inline constexpr uint32_t kGpt2EndOfText = 50256;  // <|endoftext|>
inline constexpr int64_t kGpt2VocabSize = 50257;

class Gpt2Tokenizer {
 public:
  // Loads encoder.json and vocab.bpe; every inconsistency (wrong count, a merge whose
  // parts or result are not in the vocabulary, a bad line) is invalid_input naming the
  // file and the entry.
  static Result<Gpt2Tokenizer> load(const std::string& encoder_json, const std::string& vocab_bpe);
  // load(dir + "/encoder.json", dir + "/vocab.bpe").
  static Result<Gpt2Tokenizer> load_dir(const std::string& dir);

  // Appends the ids of `text` (valid UTF-8) to *out.
  void encode(std::string_view text, std::vector<uint32_t>* out) const { bpe_.encode(text, out); }
  // The ids of the pre-tokenizer matches that start before `end` (all of them by
  // default), computed by `threads` OpenMP threads over pieces of the text split where
  // the pre-tokenizer always splits (see safe_split()); the result equals the serial
  // encode(). text[end:] is look-ahead only: the regex sees it, so a block cut at a safe
  // split and handed over with one more byte encodes exactly as inside the whole text.
  // Text without safe splits is encoded serially.
  void encode_parallel(std::string_view text, int threads, std::vector<uint32_t>* out,
                       size_t end = std::string_view::npos) const {
    bpe_.encode_parallel(text, threads, out, end);
  }

  // The bytes of the ids (every id < kGpt2VocabSize; the special token decodes to
  // "<|endoftext|>"). Not necessarily valid UTF-8 for an arbitrary id sequence.
  std::string decode(const std::vector<uint32_t>& ids) const { return bpe_.decode(ids); }

  // Whether a match of the regex always starts at p (0 < p < text.size()):
  // text[p-1] == '\n' and text[p] is printable ASCII (0x21..0x7E); see
  // BpeTokenizer::safe_split for why.
  static bool safe_split(std::string_view text, size_t p) {
    return BpeTokenizer::safe_split(BpePattern::kGpt2, text, p);
  }

  // The engine itself, for code that serves every vocabulary (prepare).
  const BpeTokenizer& bpe() const { return bpe_; }
  BpeTokenizer release() && { return std::move(bpe_); }

 private:
  explicit Gpt2Tokenizer(BpeTokenizer bpe) : bpe_(std::move(bpe)) {}
  BpeTokenizer bpe_;
};

}  // namespace trident
