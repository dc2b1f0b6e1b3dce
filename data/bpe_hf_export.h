// A BpeTokenizer as Hugging Face tokenizer files, written by `trident export` beside the
// model (docs/EXPORT.md), so that the exported directory loads with transformers'
// AutoTokenizer.from_pretrained(dir) and gives the ids the data was prepared with:
//
//   tokenizer.json         model: BPE over byte-level strings (GPT-2's bytes_to_unicode),
//                          vocab = the ranks (ids 0..n-1), merges as "a b" strings:
//                          kTiktoken vocabularies (cl100k_base, o200k_base, llama3, a rank
//                          file) get the merges Hugging Face's TikTokenConverter derives from
//                          the ranks (BpeTokenizer::merges()) and ignore_merges true (the
//                          whole-piece lookup), which together are tiktoken's BPE; recorded
//                          merges (gpt2's vocab.bpe) are written as they are, ignore_merges
//                          as the rule says.
//                          pre_tokenizer: Sequence [Split {Regex: the pattern as tiktoken
//                          spells it (bpe_pattern_source), Isolated}, ByteLevel (use_regex
//                          false, add_prefix_space false)], as Meta's Llama 3 file has it.
//                          added_tokens: the special tokens at their ids (special, not
//                          normalized), which vocab also maps to those ids (as the Hub's
//                          GPT-2 file has <|endoftext|>): Hugging Face's Rust core numbers
//                          an added token that the vocab lacks by the next free id, not by
//                          the id written. normalizer null. post_processor: Sequence [ByteLevel,
//                          TemplateProcessing that puts the document token before the
//                          text], Meta's Llama 3 layout: with add_special_tokens (the
//                          default) a text gets the ids that prepare gives a document of it;
//                          without, Trident's encode() ids. decoder ByteLevel.
//   tokenizer_config.json  tokenizer_class PreTrainedTokenizerFast, bos_token = the
//                          document token, eos_token = <|end_of_text|> where the vocabulary
//                          has it (Llama 3) else <|endoftext|>, model_max_length = the
//                          model's seq_len, clean_up_tokenization_spaces false (decode gives
//                          the bytes back unchanged).
//
// A tokenizer read from a tokenizer.json (data/bpe_hf_tokenizer.h) is exported as that
// file's bytes: Trident reads only what it implements exactly, so the file already says
// what Trident does, and its own choices (Llama 3's TemplateProcessing that adds
// <|begin_of_text|>, for instance) are kept.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "data/bpe_tokenizer.h"
#include "data/bpe_vocabularies.h"

namespace trident {

inline constexpr const char* kHfTokenizerFile = "tokenizer.json";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

// tokenizer.json text for `tok` (see above); document_token must be one of its special
// tokens.
std::string hf_tokenizer_json(const BpeTokenizer& tok, uint32_t document_token);

// tokenizer_config.json text (see above).
std::string hf_tokenizer_config_json(const LoadedTokenizer& tok, int64_t model_max_length);

struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  bool source_copied = false;  // tokenizer_json is the source tokenizer.json's bytes
  // The ids of the tokens tokenizer_config.json names as bos_token and eos_token (-1: it
  // names none), for the model's config.json.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
};

// Both files of a loaded tokenizer: a tokenizer.json source (tok.spec, data/bpe_hf_tokenizer.h)
// as its bytes, whose SHA-256 must still be tok.sha256 (invalid_input naming the file and
// both hashes otherwise), any other as hf_tokenizer_json(tok.bpe).
Result<HfTokenizerFiles> hf_tokenizer_files(const LoadedTokenizer& tok, int64_t model_max_length);

}  // namespace trident
