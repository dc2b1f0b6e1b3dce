// The global sample order (docs/ARCHITECTURE.md "Numerics and determinism").
//
// A sample is a window of T + 1 tokens of the concatenated stream: sample k is tokens
// [k*T, k*T + T]; inputs are the first T, targets the last T (shifted by one). So a
// stream of N tokens holds (N - 1) / T samples.
//
// One global sequence of samples is defined for the whole run by a counter g = 0, 1, 2,
// ... that crosses epochs: epoch = g / num_samples, position = g % num_samples, and the
// sample is position itself (shuffle off) or perm_{seed,epoch}(position) (shuffle on), a
// pseudo-random permutation of [0, num_samples) that depends only on (seed, epoch). The
// permutation is a keyed Feistel network over the next even power of two, cycle-walked
// into range: O(1) memory and a few Philox calls per sample, for any number of samples.
//
// The order never depends on the layout. Optimizer step s consumes counters
// [s*G, (s+1)*G) (G = global batch); data-parallel rank r of dp takes the contiguous
// slice [s*G + r*G/dp, s*G + (r+1)*G/dp) and splits it into micro-batches in order.
// Resuming from a checkpoint = continuing from its consumed-samples counter.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace trident {

// (num_tokens - 1) / seq_len; invalid_input naming `what` when that is < 1.
Result<uint64_t> num_samples_for(uint64_t num_tokens, int seq_len, const std::string& what);

class GlobalSampler {
 public:
  // num_samples >= 1.
  GlobalSampler(uint64_t num_samples, uint64_t seed, bool shuffle);

  uint64_t num_samples() const { return num_samples_; }
  uint64_t epoch(uint64_t counter) const { return counter / num_samples_; }
  // The sample index (in [0, num_samples)) that global counter `counter` reads.
  uint64_t sample_index(uint64_t counter) const;

 private:
  uint64_t permute(uint64_t position, uint64_t epoch) const;
  uint64_t feistel(uint64_t x, uint64_t epoch) const;

  uint64_t num_samples_;
  bool shuffle_;
  uint64_t key_;
  int half_bits_;  // the permuted domain is [0, 2^(2*half_bits))
};

// A contiguous range of global counters.
struct CounterRange {
  uint64_t first = 0;
  uint64_t count = 0;
  bool operator==(const CounterRange&) const = default;
};

// Counters [s*G, (s+1)*G) of optimizer step s (G = global_batch).
CounterRange global_batch_range(uint64_t step, uint64_t global_batch);
// The slice of step s's global batch that dp rank `dp_rank` of `dp` consumes.
// global_batch must be divisible by dp.
CounterRange dp_slice(uint64_t step, uint64_t global_batch, int dp, int dp_rank);
// Micro-batch `micro` (of size micro_batch) of that slice, in order.
CounterRange micro_batch_range(uint64_t step, uint64_t global_batch, int dp, int dp_rank,
                               uint64_t micro_batch, uint64_t micro);

}  // namespace trident
