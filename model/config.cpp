#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace trident {
namespace {

int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

Status positive(const char* key, int value) {
  if (value >= 1) return Status::ok();
  return Status::invalid_config(std::string("model.") + key + ": must be >= 1, got " +
                                std::to_string(value));
}

Status positive_finite(const char* key, float value) {
  if (std::isfinite(value) && value > 0.0f) return Status::ok();
  return Status::invalid_config(std::string("model.") + key + ": must be > 0, got " +
                                std::to_string(value));
}

}  // namespace

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::kGpt2:
      return "gpt2";
    case Arch::kLlama:
      return "llama";
  }
  return "?";
}

void TransformerConfig::finalize() {
  if (n_kv_heads == 0) n_kv_heads = n_heads;
  if (d_ff == 0) {
    // llama: the SwiGLU width that keeps the MLP's parameter count at ~8C^2 (three
    // matrices instead of two), rounded up to a multiple of 64 for the GEMMs.
    d_ff = is_gpt2() ? 4 * d_model : round_up((8 * d_model + 2) / 3, 64);
  }
  if (tie_embeddings == -1) tie_embeddings = is_gpt2() ? 1 : 0;
  // Padding the vocabulary to a multiple of 128 (llm.c) keeps the LM-head GEMM aligned
  // and lets tp up to 128 split it evenly; an llm.c checkpoint may already carry more.
  if (vocab_size > 0) padded_vocab = std::max(padded_vocab, round_up(vocab_size, 128));
  max_seq_len = std::max(max_seq_len, seq_len);
  head_dim = n_heads > 0 ? d_model / n_heads : 0;
}

Status TransformerConfig::validate() const {
  // Validate the effective values, so that 0 / -1 "defaults" are judged by what they
  // become and a caller that forgot finalize() still gets meaningful messages.
  TransformerConfig c = *this;
  c.finalize();
  if (c.vocab_size < 2) {
    return Status::invalid_config("model.vocab_size: must be >= 2, got " +
                                  std::to_string(c.vocab_size));
  }
  TRIDENT_RETURN_IF_ERROR(positive("seq_len", c.seq_len));
  TRIDENT_RETURN_IF_ERROR(positive("n_layers", c.n_layers));
  TRIDENT_RETURN_IF_ERROR(positive("n_heads", c.n_heads));
  TRIDENT_RETURN_IF_ERROR(positive("n_kv_heads", c.n_kv_heads));
  TRIDENT_RETURN_IF_ERROR(positive("d_model", c.d_model));
  TRIDENT_RETURN_IF_ERROR(positive("d_ff", c.d_ff));
  if (c.tie_embeddings < -1 || c.tie_embeddings > 1) {
    return Status::invalid_config("model.tie_embeddings: must be true, false or -1 (family "
                                  "default), got " + std::to_string(c.tie_embeddings));
  }
  if (c.d_model % c.n_heads != 0) {
    return Status::invalid_config("model.n_heads: " + std::to_string(c.n_heads) +
                                  " does not divide model.d_model=" + std::to_string(c.d_model));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return Status::invalid_config("model.n_kv_heads: " + std::to_string(c.n_kv_heads) +
                                  " does not divide model.n_heads=" + std::to_string(c.n_heads));
  }
  if (c.is_gpt2() && c.n_kv_heads != c.n_heads) {
    return Status::invalid_config("model.n_kv_heads: gpt2 has no grouped-query attention; "
                                  "n_kv_heads must equal model.n_heads=" +
                                  std::to_string(c.n_heads) + " (or be 0), got " +
                                  std::to_string(c.n_kv_heads));
  }
  if (!c.is_gpt2() && c.head_dim % 2 != 0) {
    return Status::invalid_config("model.n_heads: llama needs an even head_dim for RoPE, but "
                                  "model.d_model=" + std::to_string(c.d_model) + " / n_heads=" +
                                  std::to_string(c.n_heads) + " = " + std::to_string(c.head_dim));
  }
  TRIDENT_RETURN_IF_ERROR(positive_finite("norm_eps", c.norm_eps));
  TRIDENT_RETURN_IF_ERROR(positive_finite("init_std", c.init_std));
  TRIDENT_RETURN_IF_ERROR(positive_finite("rope_theta", c.rope_theta));
  if (c.seq_len > c.max_seq_len) {
    return Status::invalid_config("model.seq_len: " + std::to_string(c.seq_len) +
                                  " exceeds the model's maximum positions " +
                                  std::to_string(c.max_seq_len));
  }
  if (c.padded_vocab < c.vocab_size) {
    return Status::invalid_config("model.vocab_size: " + std::to_string(c.vocab_size) +
                                  " exceeds the padded vocabulary " +
                                  std::to_string(c.padded_vocab));
  }
  return Status::ok();
}

int64_t TransformerConfig::num_parameters() const {
  TransformerConfig c = *this;
  c.finalize();
  const int64_t C = c.d_model, F = c.d_ff, Vp = c.padded_vocab, L = c.n_layers;
  const int64_t q = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv = int64_t{c.n_kv_heads} * c.head_dim;
  const bool gpt2 = c.is_gpt2();
  // Exactly the tensors of model/transformer.h's parameter table.
  int64_t layer = 0;
  layer += C * (gpt2 ? 2 : 1);                  // ln1 (+ bias)
  layer += q * C + 2 * kv * C + C * q;          // attn q, k, v, o weights
  if (gpt2) layer += q + 2 * kv + C;            // attn biases
  layer += C * (gpt2 ? 2 : 1);                  // ln2 (+ bias)
  layer += gpt2 ? (F * C + F + C * F + C)       // mlp fc (+ bias), proj (+ bias)
                : (3 * F * C);                  // mlp gate, up, down
  int64_t total = Vp * C;                       // wte
  if (gpt2) total += int64_t{c.max_seq_len} * C;  // wpe
  total += L * layer;
  total += C * (gpt2 ? 2 : 1);                  // lnf (+ bias)
  if (!c.tied()) total += Vp * C;               // lm_head
  return total;
}

double TransformerConfig::flops_per_token() const {
  TransformerConfig c = *this;
  c.finalize();
  // N excludes the position table: a lookup costs no multiply-adds. The padded
  // vocabulary rows stay in N (the GEMMs really compute them), as in llm.c.
  int64_t n = c.num_parameters();
  if (c.is_gpt2()) n -= int64_t{c.max_seq_len} * c.d_model;
  return 6.0 * static_cast<double>(n) +
         12.0 * c.n_layers * static_cast<double>(c.d_model) * c.seq_len;
}

}  // namespace trident
