#include "data/sampler.h"

#include "core/check.h"
#include "core/rng.h"

namespace trident {

namespace {
constexpr int kFeistelRounds = 6;
}

Result<uint64_t> num_samples_for(uint64_t num_tokens, int seq_len, const std::string& what) {
  if (seq_len <= 0) {
    return Status::invalid_config(what + ": sequence length must be positive, got " +
                                  std::to_string(seq_len));
  }
  const uint64_t n = num_tokens == 0 ? 0 : (num_tokens - 1) / static_cast<uint64_t>(seq_len);
  if (n < 1) {
    return Status::invalid_input(what + ": " + std::to_string(num_tokens) +
                                 " tokens hold no sample of seq_len + 1 = " +
                                 std::to_string(int64_t{seq_len} + 1) +
                                 " tokens (model.seq_len=" + std::to_string(seq_len) + ")");
  }
  return n;
}

GlobalSampler::GlobalSampler(uint64_t num_samples, uint64_t seed, bool shuffle)
    : num_samples_(num_samples),
      shuffle_(shuffle),
      key_(rng_key(seed, hash_name("trident.data.sampler"))),
      half_bits_(0) {
  TRIDENT_CHECK_MSG(num_samples >= 1, "GlobalSampler needs at least one sample");
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < num_samples) ++bits;
  // A balanced Feistel network needs an even bit count; at most 4x the domain, so
  // cycle-walking takes under 4 rounds of the network on average.
  half_bits_ = (bits + 1) / 2;
}

uint64_t GlobalSampler::feistel(uint64_t x, uint64_t epoch) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;  // half_bits_ <= 32
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int round = 0; round < kFeistelRounds; ++round) {
    // Philox keyed by the seed, counter (epoch, round, right): a fresh pseudo-random
    // round function per epoch and round.
    auto r = philox4x32(key_, epoch, (static_cast<uint64_t>(round) << 32) | right);
    const uint64_t f = ((static_cast<uint64_t>(r[1]) << 32) | r[0]) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t GlobalSampler::permute(uint64_t position, uint64_t epoch) const {
  if (half_bits_ == 0) return 0;  // one sample
  // The network permutes [0, 2^(2*half_bits)); applying it until the value lands in
  // [0, num_samples) restricts it to a permutation of that range (cycle-walking).
  uint64_t x = position;
  do {
    x = feistel(x, epoch);
  } while (x >= num_samples_);
  return x;
}

uint64_t GlobalSampler::sample_index(uint64_t counter) const {
  const uint64_t position = counter % num_samples_;
  if (!shuffle_) return position;
  return permute(position, counter / num_samples_);
}

CounterRange global_batch_range(uint64_t step, uint64_t global_batch) {
  return {step * global_batch, global_batch};
}

CounterRange dp_slice(uint64_t step, uint64_t global_batch, int dp, int dp_rank) {
  TRIDENT_CHECK_MSG(dp >= 1 && dp_rank >= 0 && dp_rank < dp,
                    "dp_rank " + std::to_string(dp_rank) + " of dp " + std::to_string(dp));
  TRIDENT_CHECK_MSG(global_batch % static_cast<uint64_t>(dp) == 0,
                    "global batch " + std::to_string(global_batch) + " not divisible by dp " +
                        std::to_string(dp));
  const uint64_t per_rank = global_batch / static_cast<uint64_t>(dp);
  return {step * global_batch + static_cast<uint64_t>(dp_rank) * per_rank, per_rank};
}

CounterRange micro_batch_range(uint64_t step, uint64_t global_batch, int dp, int dp_rank,
                               uint64_t micro_batch, uint64_t micro) {
  CounterRange slice = dp_slice(step, global_batch, dp, dp_rank);
  TRIDENT_CHECK_MSG(micro_batch >= 1 && slice.count % micro_batch == 0 &&
                        micro < slice.count / micro_batch,
                    "micro-batch " + std::to_string(micro) + " of size " +
                        std::to_string(micro_batch) + " in a dp slice of " +
                        std::to_string(slice.count));
  return {slice.first + micro * micro_batch, micro_batch};
}

}  // namespace trident
