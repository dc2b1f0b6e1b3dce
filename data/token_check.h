// The start-up vocabulary check: every token id of a dataset must be < the model's
// vocab_size. DataLoader also checks each id it reads, but only when a batch first
// reads it — possibly hours into a run; this check runs before the first step.
//
// First, per shard with a trusted sidecar that records the tokenizer (data/token_meta.h):
// the tokenizer's vocabulary must fit, vocab_size >= its size, even when the ids in the
// data happen to be smaller (a special token that has not occurred yet still can), and
// every such shard of the dataset must name the same tokenizer (equal vocabulary size
// and SHA-256): ids of two vocabularies in one stream mean nothing. Failures:
// "<file>: its tokenizer llama3 has 128256 ids, more than model.vocab_size 128000". The
// byte tokenizer is exempt from the size: its ids are the bytes that occur.
// Sidecars without the record (older ones) and shards without sidecars skip this part.
//
// Then the ids, per shard, cheapest first:
//   - uint16 shards with vocab_size >= 65536: nothing to check;
//   - a trusted sidecar (data/token_meta.h): its max_id;
//   - otherwise a scan of the mapped tokens for the largest id, in parallel (OpenMP,
//     all threads), a few GB/s from the page cache (docs/PERFORMANCE.md).
// Only when a shard's largest id is out of range is it read again, sequentially, for
// the position of its first offending token. A sidecar whose max_id claims an
// offending token that the shard does not hold is ignored (the shard is scanned).
//
// The failure is invalid_input (exit 2) naming the first offending shard in stream
// order: "<file>: token id 50300 at position 123456 is >= model.vocab_size 50257
// (largest id in this file: 50310)". Thread-safe (reads only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "data/dataset.h"
#include "data/token_meta.h"

namespace trident {

struct TokenIdCheck {
  uint32_t max_id = 0;         // the largest id of the scanned and sidecar shards
  uint64_t tokens = 0;         // in the dataset
  uint64_t scanned_bytes = 0;  // token bytes scanned (not sidecar, not skipped)
  int files_scanned = 0;
  int files_from_sidecar = 0;
  int files_skipped = 0;       // uint16 shards under a vocabulary of >= 65536
  double seconds = 0;
  // The tokenizer the sidecars record (the same for all that record one), if any does.
  std::optional<TokenizerRecord> tokenizer;
};

Result<TokenIdCheck> check_token_ids(const TokenDataset& dataset, int64_t vocab_size);

// check_token_ids for the dataset of config key `key` ("data.train"), as Trainer::init
// calls it on one rank: the error message starts with the key ("data.train <file>:
// token id ..."), and the check is logged when it took longer than a second. `tokenizer`
// (when not null) receives TokenIdCheck::tokenizer, which the trainer stores in its
// checkpoints.
Status check_token_ids_at_startup(const std::string& key, const TokenDataset& dataset,
                                  int64_t vocab_size,
                                  std::optional<TokenizerRecord>* tokenizer = nullptr);

}  // namespace trident
