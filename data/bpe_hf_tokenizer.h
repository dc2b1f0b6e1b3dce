// A Hugging Face tokenizer.json as a BpeTokenizer configuration (data/bpe_tokenizer.h):
// `trident prepare --tokenizer PATH/tokenizer.json`. Read with nlohmann-json.
//
// What Trident implements, and so accepts (any other value is refused, naming the file
// and the JSON field):
//   model          type "BPE"; vocab (byte-level strings, GPT-2's bytes_to_unicode) and
//                  merges, as "a b" strings or [a, b] pairs; ignore_merges true or false
//                  (BpeMergeRule::kRecordedMergesWholePiece / kRecordedMerges);
//                  byte_fallback false, dropout null, no continuing_subword_prefix or
//                  end_of_word_suffix. unk_token is allowed and never used: every byte
//                  has a token.
//   normalizer     null.
//   pre_tokenizer  ByteLevel with use_regex true (GPT-2's pattern), or a Sequence of
//                  Split {pattern: {Regex: R}, behavior: Isolated, invert: false} and
//                  ByteLevel with use_regex false (Llama 3's layout), where R is one of
//                  the patterns Trident knows, spelled as bpe_pattern_source() spells it
//                  (after JSON unescaping): gpt2, cl100k (= Llama 3's), o200k.
//                  add_prefix_space false.
//   added_tokens   the special tokens (special or not: their text becomes the token only
//                  when special tokens are allowed, otherwise it is ordinary text); single_word,
//                  lstrip and rstrip false. An added token that is also in vocab (GPT-2's
//                  <|endoftext|>) must have the same id there. The vocab without the added
//                  tokens must be ids 0..n-1 (the ranks) and the added tokens come after.
//   decoder        null or ByteLevel.
//   post_processor null, ByteLevel, TemplateProcessing or a Sequence of those: the ids it
//                  adds are not applied (prepare places the document token itself), but
//                  it names the document token.
// truncation and padding do not change the ids of a text and are ignored.
//
// The document token: the special token that TemplateProcessing's single template starts
// with (Llama 3: <|begin_of_text|>), else the added token <|endoftext|> (GPT-2).
#pragma once

#include <string>

#include "core/status.h"
#include "data/bpe_vocabularies.h"

namespace trident {

// Whether SPEC names a tokenizer.json file (it ends in ".json").
bool is_hf_tokenizer_spec(const std::string& spec);

// Errors are invalid_input "PATH: FIELD: what is wrong" (exit 2).
Result<LoadedTokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace trident
