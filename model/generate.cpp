#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace trident {

int32_t choose_token(std::span<const float> logits, const SamplingOptions& options,
                     uint64_t draw) {
  const int n = options.vocab_limit > 0
                    ? std::min<int>(options.vocab_limit, static_cast<int>(logits.size()))
                    : static_cast<int>(logits.size());
  TRIDENT_CHECK(n > 0);
  if (options.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + n) -
                                logits.begin());
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  if (options.top_k > 0 && options.top_k < n) {
    std::partial_sort(ids.begin(), ids.begin() + options.top_k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    ids.resize(static_cast<size_t>(options.top_k));
    std::sort(ids.begin(), ids.end());  // cumulative order by id, as without top-k
  }
  double max_logit = -HUGE_VAL;
  for (int32_t id : ids) max_logit = std::max(max_logit, static_cast<double>(logits[id]));
  std::vector<double> p(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) / options.temperature);
    total += p[i];
  }
  const double target = uniform_at(rng_key(options.seed, hash_name("generate")), draw) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += p[i];
    if (cumulative > target) return ids[i];
  }
  return ids.back();  // rounding: target within the last ulp of total
}

GenerateResult generate(KvCacheDecoder& decoder, std::span<const int32_t> prompt,
                        int max_new_tokens, const SamplingOptions& options, bool keep_logits,
                        const std::function<void(int32_t)>& on_token) {
  TRIDENT_CHECK_MSG(!prompt.empty() && static_cast<int>(prompt.size()) <= decoder.max_positions(),
                    "prompt of " + std::to_string(prompt.size()) + " tokens");
  GenerateResult result;
  decoder.reset();
  const std::vector<float>* logits = &decoder.feed(prompt);  // the prefill: one forward
  for (int i = 0; i < max_new_tokens; ++i) {
    if (i > 0) {
      if (decoder.position() >= decoder.max_positions()) {
        result.context_full = true;
        break;
      }
      logits = &decoder.step(result.tokens.back());
    }
    const int32_t next = choose_token(*logits, options, static_cast<uint64_t>(i));
    if (keep_logits) result.logits.push_back(*logits);
    result.tokens.push_back(next);
    if (on_token) on_token(next);
  }
  return result;
}

}  // namespace trident
