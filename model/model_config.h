// TransformerConfig: the architecture of one decoder-only model: its family (a row of
// model/architecture.h's table: gpt2, llama) and its sizes. It is parsed from the
// `model:` section of a YAML config (config/config.h) and
// validated by validate(); derived sizes are computed by finalize().
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/architecture.h"

namespace trident {

// Activation recomputation (training.recompute; what is recomputed: model/transformer.h).
enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);  // "none", "selective", "full"

struct TransformerConfig {
  Arch arch = Arch::kGpt2;
  int vocab_size = 256;     // V: real vocabulary (token ids are < V)
  int seq_len = 64;         // T: training sequence length
  int n_layers = 4;         // L
  int n_heads = 4;          // NH
  int n_kv_heads = 0;       // NKV; 0 = n_heads (no GQA). Families without GQA need NKV == NH.
  int d_model = 128;        // C
  int d_ff = 0;             // F; 0 = default (GELU: 4C; SwiGLU: 8C/3 rounded up to 64)
  int tie_embeddings = -1;  // -1 = family default (Architecture::tied_head); else 0/1
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;
  std::string init_from;  // llm.c GPT-2 checkpoint to load the architecture and weights from
  // Mixture of experts (model/transformer.h, "Mixture of experts"): every layer's MLP
  // replaced by moe_experts experts (0: dense) of which each token takes moe_top_k, each
  // an MLP of the family's kind with hidden width moe_d_ff (0 = d_ff).
  int moe_experts = 0;
  int moe_top_k = 2;
  int moe_d_ff = 0;
  int moe_first_dense_layers = 0;  // leading layers with the dense MLP (DeepSeek), < n_layers
  // Whether layer `layer`'s MLP is the experts (a MoE model past its dense leading layers).
  bool moe_layer(int layer) const { return moe() && layer >= moe_first_dense_layers; }
  int moe_shared_experts = 0;      // experts every token takes besides its moe_top_k

  // ---- derived by finalize() --------------------------------------------------------
  int padded_vocab = 0;  // Vp: V rounded up to a multiple of 128 (or the checkpoint's Vp)
  int max_seq_len = 0;   // rows of the position table (learned positions): seq_len, or the checkpoint's maxT
  int head_dim = 0;      // HD = C / NH

  bool tied() const { return tie_embeddings == 1; }
  bool moe() const { return moe_experts > 0; }
  // The family's row of the architecture table.
  const Architecture& family() const { return architecture(arch); }

  // Fills defaults (n_kv_heads, d_ff, tie_embeddings) and derived sizes. Keeps
  // padded_vocab / max_seq_len if already set larger (by an llm.c checkpoint).
  void finalize();
  // Errors name the offending key, e.g. "model.n_heads: 5 does not divide model.d_model=128".
  Status validate() const;

  // Parameter count (global, whole model; the tied head counted once).
  int64_t num_parameters() const;
  // The parameters a token runs through: num_parameters() less, with experts, the
  // moe_experts - moe_top_k routed experts it is not sent to (= num_parameters() dense).
  int64_t active_parameters() const;
  // Model FLOPs per token for training: 6*N + 12*L*C*T (attention), with N excluding
  // the position embedding and, with experts, counting the parameters a token is active
  // in (the router and top_k of the experts) (docs/CONFIG.md "FLOPs per token and MFU").
  double flops_per_token() const;
};

}  // namespace trident
