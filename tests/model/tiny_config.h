// The tiny model of the model tests: vocabulary 256 (bytes), 32 positions, 2 layers,
// 4 heads of 16, grouped-query attention (2 kv heads) for llama. Finalized.
#pragma once

#include "model/model_config.h"

namespace trident::testing {

inline TransformerConfig tiny_model(Arch arch) {
  TransformerConfig c;
  c.arch = arch;
  c.vocab_size = 256;
  c.seq_len = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = arch == Arch::kLlama ? 2 : 0;  // llama: grouped-query attention
  c.d_model = 64;
  c.finalize();
  return c;
}

}  // namespace trident::testing
