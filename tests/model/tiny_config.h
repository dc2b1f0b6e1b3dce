// The tiny model of the tests: by default vocabulary 256 (bytes), 32 positions, 2 layers,
// 4 heads of 16, grouped-query attention (2 kv heads) for llama. A test that needs another
// size names only what differs (TinySize{.seq_len = 16, .d_model = 32}); the same sizes
// come as a TransformerConfig (finalized) or as the model: line of a YAML config.
#pragma once

#include <string>

#include "model/model_config.h"

namespace trident::testing {

struct TinySize {
  int vocab_size = 256;
  int seq_len = 32;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = -1;  // -1: 2 for llama (grouped-query attention), n_heads for the others
  int d_model = 64;
  int d_ff = 0;  // 0: the family's default
};

inline int tiny_kv_heads(Arch arch, const TinySize& s) {
  if (s.n_kv_heads >= 0) return s.n_kv_heads;
  return arch == Arch::kLlama ? 2 : s.n_heads;
}

inline TransformerConfig tiny_model(Arch arch, const TinySize& s = {}) {
  TransformerConfig c;
  c.arch = arch;
  c.vocab_size = s.vocab_size;
  c.seq_len = s.seq_len;
  c.n_layers = s.n_layers;
  c.n_heads = s.n_heads;
  c.n_kv_heads = tiny_kv_heads(arch, s);
  c.d_model = s.d_model;
  c.d_ff = s.d_ff;
  c.finalize();
  return c;
}

// "model: {arch: gpt2, vocab_size: 256, ...}\n": the same model as a config's section.
// `extra`: more keys of the section (", tie_embeddings: 0").
inline std::string tiny_model_yaml(Arch arch, const TinySize& s = {},
                                   const std::string& extra = "") {
  return std::string("model: {arch: ") + arch_name(arch) +
         ", vocab_size: " + std::to_string(s.vocab_size) +
         ", seq_len: " + std::to_string(s.seq_len) + ", n_layers: " + std::to_string(s.n_layers) +
         ", n_heads: " + std::to_string(s.n_heads) +
         ", n_kv_heads: " + std::to_string(tiny_kv_heads(arch, s)) +
         ", d_model: " + std::to_string(s.d_model) +
         (s.d_ff > 0 ? ", d_ff: " + std::to_string(s.d_ff) : std::string()) + extra + "}\n";
}

}  // namespace trident::testing
