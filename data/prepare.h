// Corpus preparation behind `trident prepare`: text files in, llm.c token shards out.
//
// The input files are read in the given order as one byte stream and tokenized; the last
// val_fraction of the token stream is the validation split. Output, in out_dir:
//   train_000000.bin, train_000001.bin, ...   at most shard_tokens tokens each
//   val_000000.bin, ...                       (absent when the split is empty)
// in llm.c version 1 (uint16) format (data/token_file.h), each with a sidecar
// <shard>.meta.json holding its token count, largest id and size (data/token_meta.h).
// Shards (and sidecars) of the same names left by an earlier run beyond the ones written
// now are removed, so that a directory or glob spec never mixes two runs.
//
// Tokenizers: "byte" (every byte is a token, vocab 256). "gpt2" is not implemented yet
// and fails with invalid_config saying so. Errors name the file or option.
#pragma once

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
  uint64_t shard_tokens = 100'000'000;  // >= 1
};

struct PrepareSummary {
  uint64_t files = 0;
  uint64_t bytes = 0;
  int64_t vocab_size = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  // -sum p ln p over the unigram frequencies of the train tokens: the loss of the best
  // model that ignores context, the bar a trained model must beat.
  double unigram_entropy = 0.0;  // nats/token
};

Result<PrepareSummary> prepare_corpus(const PrepareOptions& options);

// Entropy in nats of the distribution counts / sum(counts); 0 for an empty histogram.
double unigram_entropy(const std::vector<uint64_t>& counts);

}  // namespace trident
