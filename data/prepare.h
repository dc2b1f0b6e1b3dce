// Corpus preparation behind `trident prepare`: text files in, token files out.
//
// The input files are read in the given order and tokenized; the last val_fraction of
// the token stream is the validation split. Output, in out_dir, by format:
//   llmc (default): train_000000.bin, train_000001.bin, ...  at most shard_tokens each
//                   val_000000.bin, ...                      (absent when the split is empty)
//                   in llm.c version 1 (uint16) format (data/token_file.h), each with a
//                   sidecar <shard>.meta.json holding its token count, largest id, size
//                   and the tokenizer (data/token_meta.h)
//   megatron:       train.bin + train.idx, val.bin + val.idx  (data/megatron_file.h),
//                   with the sidecars train.bin.meta.json, val.bin.meta.json
// The files are written into a fresh staging directory beside out_dir (".<name>.prepare.
// <pid>", same file system) and moved into out_dir only once all are complete; then the
// outputs of an earlier run beyond the ones written now (shards of either format) are
// removed, so that a directory or glob spec never mixes two runs. A run that fails or is
// stopped leaves out_dir as it was and removes its staging directory; one of a process
// that no longer exists (a kill -9) is removed by the next run for the same out_dir.
//
// Tokenizers (--tokenizer SPEC):
//   "byte": every byte is a token (vocab 256); the files are one byte stream, no
//           document separators.
//   "gpt2", "cl100k_base", "o200k_base", "llama3", the path of a tiktoken rank file
//           (with tokenizer_pattern) or of a Hugging Face tokenizer.json: byte-level BPE
//           (data/bpe_vocabularies.h) from vocab_dir. Each input file is one document, and
//           the vocabulary's document token is placed before every document
//           (<|endoftext|>: gpt2 50256, cl100k_base 100257, o200k_base 199999; llama3
//           <|begin_of_text|> 128000), as llm.c and nanoGPT do for GPT-2. Special-token
//           text inside a document is ordinary text, or with allow_special the special id
//           (the text is then cut into blocks only where no special token is cut).
//           Invalid UTF-8 becomes U+FFFD (counted in the summary). Tokenized by `threads`
//           threads; the ids do not depend on it.
// Vocabularies of more than 65,536 ids write llm.c version 7 (uint32) shards, and from
// 65,500 ids on Megatron int32 files (Megatron's preprocess_data.py rule).
// With megatron, each document is one sequence; the document that straddles the
// train/val split is cut there, so both formats hold the same token stream.
// Errors name the file or option.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string tokenizer = "byte";
  double val_fraction = 0.05;          // in [0, 1)
  uint64_t shard_tokens = 100'000'000;  // >= 1 (llmc)
  std::string format = "llmc";          // llmc | megatron
  // gpt2: holds encoder.json and vocab.bpe; cl100k_base, o200k_base, llama3: holds
  // <name>.tiktoken (scripts/fetch_vocabs.sh); unused for a rank file path.
  std::string vocab_dir;
  // A rank file's pre-tokenizer: gpt2 | cl100k | o200k | llama3 (the file does not say).
  std::string tokenizer_pattern;
  // Special-token text inside a document becomes the special id (BPE only); by default it
  // is ordinary text.
  bool allow_special = false;
  int threads = 0;                      // BPE tokenization threads; 0 = all cores
  bool progress = false;                // a progress line on stderr every few seconds
  // Text read and tokenized at a time (bounds memory; a file with no safe split in a
  // block is read further). The ids do not depend on it; tests make it small.
  size_t read_block_bytes = size_t{32} << 20;
  // When set (e.g. by a SIGINT handler), the run stops at the next block or shard with an
  // "interrupted" error and out_dir is left unchanged.
  const std::atomic<bool>* stop = nullptr;
};

struct PrepareSummary {
  uint64_t files = 0;
  uint64_t bytes = 0;
  int64_t vocab_size = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  uint64_t documents = 0;           // BPE or megatron: one per input file
  uint64_t utf8_replacements = 0;   // ill-formed UTF-8 subsequences replaced by U+FFFD
  std::vector<std::string> train_shards;  // the .bin files written (megatron: train.bin)
  std::vector<std::string> val_shards;
  // -sum p ln p over the unigram frequencies of the train tokens: the loss of the best
  // model that ignores context, the bar a trained model must beat.
  double unigram_entropy = 0.0;  // nats/token
};

Result<PrepareSummary> prepare_corpus(const PrepareOptions& options);

// Entropy in nats of the distribution counts / sum(counts); 0 for an empty histogram.
double unigram_entropy(const std::vector<uint64_t>& counts);

}  // namespace trident
