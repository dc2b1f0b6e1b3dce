// Text generation on a KvCacheDecoder: choosing the next token from logits (greedy,
// temperature, top-k) and the decode loop (prefill the prompt in one forward, then sample
// and feed one token at a time until max_new_tokens or the end of the model's context).
//
// Sampling (choose_token), over the first `vocab_limit` logits only (the tokenizer's ids;
// padded columns and ids the tokenizer cannot decode are never chosen):
//   temperature 0: argmax (the lowest id among equal maxima);
//   else: with top_k > 0 only the top_k largest logits (ties broken towards lower ids)
//   stay; p = softmax(logit / temperature) in double; the token is the first whose
//   cumulative probability exceeds u * sum(p), u = uniform_at(key(seed), draw) from the
//   Philox stream of core/rng.h. `draw` is the index of the generated token (0, 1, ...),
//   so a seed gives the same text on every machine and thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_cache_decoder.h"

namespace trident {

struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;
  int vocab_limit = 0;       // sample from ids < vocab_limit; 0 = the model's vocab_size
};

int32_t choose_token(std::span<const float> logits, const SamplingOptions& options,
                     uint64_t draw);

struct GenerateResult {
  std::vector<int32_t> tokens;              // the new tokens (prompt excluded)
  std::vector<std::vector<float>> logits;   // per new token, the logits it was chosen from
                                            // (only with keep_logits)
  bool context_full = false;                // stopped early at decoder.max_positions()
};

// Resets the decoder, feeds `prompt` (non-empty, ids < vocab_size, at most
// max_positions()) in one call, then chooses up to max_new_tokens tokens, calling on_token (if set)
// after each. The last new token is not fed back (its logits are never needed).
GenerateResult generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt,
                        int max_new_tokens, const SamplingOptions& options, bool keep_logits,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace trident
