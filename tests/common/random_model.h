// Random inputs for comparing a split Transformer with the whole model (the parallel
// model tests): token ids and targets, and a value for every parameter, biases and norm
// weights included (the default init makes biases zero, which would hide a bias added
// on every rank). Deterministic: counter-based draws keyed by the given seeds.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/transformer.h"

namespace trident::test {

// N token ids and N targets, uniform over the vocabulary, drawn at key (a, b).
struct RandomBatch {
  std::vector<int32_t> tokens, targets;
};
inline RandomBatch random_batch(const TransformerConfig& c, int N, uint64_t a, uint64_t b) {
  RandomBatch batch{std::vector<int32_t>(N), std::vector<int32_t>(N)};
  const uint64_t key = rng_key(a, b);
  for (int i = 0; i < N; ++i) {
    batch.tokens[i] = static_cast<int32_t>(uniform_int_at(key, i, c.vocab_size));
    batch.targets[i] = static_cast<int32_t>(uniform_int_at(key, N + i, c.vocab_size));
  }
  return batch;
}

// Sets every parameter of `model` (a whole model) to 0.1 * N(0, 1) keyed by (seed, its
// name), the padded vocabulary rows of wte and lm_head.weight zero when `zero_padding`;
// zeroes the gradients. Returns the values in parameter order.
inline std::vector<std::vector<float>> set_random_params(Transformer& model, uint64_t seed,
                                                         bool zero_padding) {
  const TransformerConfig& c = model.config();
  std::vector<std::vector<float>> values;
  for (const ParamInfo& p : model.params()) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    const uint64_t pkey = rng_key(seed, hash_name(p.name));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * normal_at(pkey, i);
    if (zero_padding && (p.name == "wte" || p.name == "lm_head.weight")) {
      std::fill(v.begin() + static_cast<ptrdiff_t>(c.vocab_size) * c.d_model, v.end(), 0.0f);
    }
    model.set_param(p, v.data());
    values.push_back(std::move(v));
  }
  model.zero_grads();
  return values;
}

}  // namespace trident::test
