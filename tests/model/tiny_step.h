// One forward and backward of a tiny test model (tests/model/tiny_config.h) for step
// `step` of a test's loop: its token and target ids, spread over [0, vocab) and different
// for each step; step 2 on half-length sequences (the buffers planned for the largest call
// serve a smaller one), the others on seq_len. Returns the step's loss; the gradients are
// the model's (zeroed first).
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace trident::testing {

inline float tiny_forward_backward(Transformer& model, const TransformerConfig& config, int B,
                                   int step) {
  const int T = step == 2 ? config.seq_len / 2 : config.seq_len;
  const size_t n = static_cast<size_t>(B) * T;
  std::vector<int32_t> tokens(n), targets(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + step * 13) % config.vocab_size);
    targets[i] = static_cast<int32_t>((i * 11 + step * 5 + 3) % config.vocab_size);
  }
  model.zero_grads();
  const float loss = model.forward(tokens.data(), targets.data(), B, T);
  model.backward(1.0f);
  return loss;
}

}  // namespace trident::testing
