#include "model/model_config.h"

#include "model/model_description.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

namespace trident {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// In 64 bits: the int values a user may set (up to 2^31 - 1) must not wrap here.
int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// The default FFN width: a GELU MLP 4C; a SwiGLU one the width that keeps the MLP's
// parameter count at ~8C^2 (three matrices instead of two), rounded up to a multiple of
// 64 for the GEMMs. May exceed an int for a huge d_model (validate() reports that).
int64_t default_d_ff(const Architecture& a, int64_t d_model) {
  return a.swiglu() ? round_up((8 * d_model + 2) / 3, 64) : 4 * d_model;
}

// a * b and a + b in 64 bits, or nullopt when the result does not fit.
std::optional<int64_t> mul(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t out = 0;
  if (!a || !b || __builtin_mul_overflow(*a, *b, &out)) return std::nullopt;
  return out;
}
std::optional<int64_t> add(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t out = 0;
  if (!a || !b || __builtin_add_overflow(*a, *b, &out)) return std::nullopt;
  return out;
}

// Parameters of one layer and of the whole model (exactly the tensors of the model
// description, model/model_description.h; the tied head counted once), or nullopt when
// a count overflows 64 bits. `c` is finalized. layer_parameters: a MoE layer's in a
// mixture of experts (`layer` >= 0: that layer's, the leading dense layers' dense).
std::optional<int64_t> layer_parameters(const TransformerConfig& c, int layer = -1) {
  const int64_t q = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv = int64_t{c.n_kv_heads} * c.head_dim;
  auto size = [&](Dim d) -> int64_t {
    switch (d) {
      case Dim::kOne: return 1;
      case Dim::kC: return c.d_model;
      case Dim::kQ: return q;
      case Dim::kKV: return kv;
      case Dim::kF: return c.d_ff;
      case Dim::kE: return c.moe_experts;
      case Dim::kK: return c.moe_top_k;
      case Dim::kFe: return c.moe_d_ff;
      case Dim::kKC: return int64_t{c.moe_top_k} * c.d_model;
      case Dim::kKF: return int64_t{c.moe_top_k} * c.moe_d_ff;
      case Dim::kSF: return int64_t{c.moe_shared_experts} * c.moe_d_ff;
    }
    return 0;
  };
  std::optional<int64_t> count = 0;
  const BlockDescription& block = layer < 0 ? describe_block(c) : describe_layer_block(c, layer);
  for (const LayerTensor& t : block.tensors) count = add(count, mul(size(t.rows), size(t.cols)));
  return count;
}

std::optional<int64_t> model_parameters(const TransformerConfig& c) {
  // A mixture of experts' leading moe_first_dense_layers have the dense MLP.
  const int dense = c.moe() ? c.moe_first_dense_layers : 0;
  std::optional<int64_t> total = mul(c.n_layers - dense, layer_parameters(c));
  if (dense > 0) total = add(total, mul(dense, layer_parameters(c, 0)));
  for (GroupKind g : {GroupKind::kEmbedding, GroupKind::kHead}) {
    for (const TensorDesc& t : describe_group(c, g, 1, true)) total = add(total, t.shape.numel());
  }
  return total;
}

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

void TransformerConfig::finalize() {
  if (n_kv_heads == 0) n_kv_heads = n_heads;
  if (d_ff == 0 && d_model >= 1) {
    // A default too wide for an int stays 0; validate() names model.d_model.
    const int64_t f = default_d_ff(family(), d_model);
    if (f <= kIntMax) d_ff = static_cast<int>(f);
  }
  if (tie_embeddings == -1) tie_embeddings = family().tied_head ? 1 : 0;
  if (moe_experts > 0 && moe_d_ff == 0) moe_d_ff = d_ff;
  // Padding the vocabulary to a multiple of 128 (llm.c) keeps the LM-head GEMM aligned
  // and lets tp up to 128 split it evenly; an llm.c checkpoint may already carry more.
  // A padded size beyond an int is left out (validate() names model.vocab_size).
  if (vocab_size > 0 && round_up(vocab_size, 128) <= kIntMax) {
    padded_vocab = std::max(padded_vocab, static_cast<int>(round_up(vocab_size, 128)));
  }
  max_seq_len = std::max(max_seq_len, seq_len);
  head_dim = n_heads > 0 ? d_model / n_heads : 0;
}

Status TransformerConfig::validate() const {
  // Validate the effective values, so that 0 / -1 "defaults" are judged by what they
  // become and a caller that forgot finalize() still gets meaningful messages.
  TransformerConfig c = *this;
  c.finalize();
  const Architecture& a = c.family();
  if (c.vocab_size < 2) {
    return Status::invalid_config("model.vocab_size: must be >= 2, got " +
                                  std::to_string(c.vocab_size));
  }
  if (round_up(c.vocab_size, 128) > kIntMax && c.padded_vocab < c.vocab_size) {
    return Status::invalid_config(
        "model.vocab_size: " + std::to_string(c.vocab_size) + " padded to a multiple of 128 is " +
        std::to_string(round_up(c.vocab_size, 128)) + ", more than the " +
        std::to_string(kIntMax) + " rows a tensor dimension allows (at most " +
        std::to_string(kIntMax / 128 * 128) + ")");
  }
  TRIDENT_RETURN_IF_ERROR(positive("seq_len", c.seq_len));
  TRIDENT_RETURN_IF_ERROR(positive("n_layers", c.n_layers));
  TRIDENT_RETURN_IF_ERROR(positive("n_heads", c.n_heads));
  TRIDENT_RETURN_IF_ERROR(positive("n_kv_heads", c.n_kv_heads));
  TRIDENT_RETURN_IF_ERROR(positive("d_model", c.d_model));
  if (d_ff == 0 && c.d_ff == 0) {
    return Status::invalid_config(
        "model.d_model: " + std::to_string(c.d_model) + " gives a default model.d_ff (" +
        (a.swiglu() ? "8 * d_model / 3 rounded up to 64" : "4 * d_model") + ") of " +
        std::to_string(default_d_ff(a, c.d_model)) + ", more than " +
        std::to_string(kIntMax) + "; set model.d_ff or use a smaller model.d_model");
  }
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
  if (!a.gqa && c.n_kv_heads != c.n_heads) {
    return Status::invalid_config("model.n_kv_heads: " + std::string(a.name) +
                                  " has no grouped-query attention; "
                                  "n_kv_heads must equal model.n_heads=" +
                                  std::to_string(c.n_heads) + " (or be 0), got " +
                                  std::to_string(c.n_kv_heads));
  }
  if (a.rope() && c.head_dim % 2 != 0) {
    return Status::invalid_config("model.n_heads: " + std::string(a.name) +
                                  " needs an even head_dim for RoPE, but "
                                  "model.d_model=" + std::to_string(c.d_model) + " / n_heads=" +
                                  std::to_string(c.n_heads) + " = " + std::to_string(c.head_dim));
  }
  if (a.qk_norm || a.rope_scaling != 1.0f) {
    return Status::invalid_config("model.arch: " + std::string(a.name) +
                                  " asks for q/k norms or RoPE scaling, which Trident does not "
                                  "implement");
  }
  if (c.moe_experts < 0) {
    return Status::invalid_config("model.moe_experts: must be >= 0 (0: a dense model), got " +
                                  std::to_string(c.moe_experts));
  }
  if (c.moe()) {
    if (c.moe_top_k < 1 || c.moe_top_k > c.moe_experts) {
      return Status::invalid_config("model.moe_top_k: must be in [1, model.moe_experts=" +
                                    std::to_string(c.moe_experts) + "], got " +
                                    std::to_string(c.moe_top_k));
    }
    TRIDENT_RETURN_IF_ERROR(positive("moe_d_ff", c.moe_d_ff));
    // A Hugging Face directory (Mixtral, model/hf_export.h) loads; an llm.c file is a
    // dense GPT-2.
    std::error_code ec;
    if (!c.init_from.empty() && !std::filesystem::is_directory(c.init_from, ec)) {
      return Status::invalid_config("model.init_from: " + c.init_from +
                                    " is not a Hugging Face model directory; loading an llm.c "
                                    "checkpoint into a mixture-of-experts model (model.moe_experts=" +
                                    std::to_string(c.moe_experts) + ") is not supported yet");
    }
    if (c.moe_first_dense_layers < 0 || c.moe_first_dense_layers >= c.n_layers) {
      return Status::invalid_config("model.moe_first_dense_layers: must be in [0, model.n_layers=" +
                                    std::to_string(c.n_layers) + "), got " +
                                    std::to_string(c.moe_first_dense_layers));
    }
    if (c.moe_shared_experts < 0) {
      return Status::invalid_config("model.moe_shared_experts: must be >= 0, got " +
                                    std::to_string(c.moe_shared_experts));
    }
  } else if (c.moe_d_ff != 0 || c.moe_first_dense_layers != 0 || c.moe_shared_experts != 0) {
    const char* key = c.moe_d_ff != 0                  ? "model.moe_d_ff"
                      : c.moe_first_dense_layers != 0 ? "model.moe_first_dense_layers"
                                                     : "model.moe_shared_experts";
    return Status::invalid_config(std::string(key) +
                                  ": set for a dense model (model.moe_experts is 0)");
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
  // Parameter counts are int64 throughout (num_parameters, the layout tables); a model
  // whose count wraps would be planned with garbage sizes.
  if (!layer_parameters(c)) {
    return Status::invalid_config("model.d_ff: " + std::to_string(c.d_ff) + " with model.d_model=" +
                                  std::to_string(c.d_model) +
                                  " makes one layer hold more than 2^63 parameters");
  }
  if (!model_parameters(c)) {
    return Status::invalid_config(
        "model.n_layers: " + std::to_string(c.n_layers) + " layers of " +
        std::to_string(*layer_parameters(c)) + " parameters each (model.d_model=" +
        std::to_string(c.d_model) + ", model.d_ff=" + std::to_string(c.d_ff) +
        ") overflow a 64-bit parameter count");
  }
  return Status::ok();
}

int64_t TransformerConfig::num_parameters() const {
  TransformerConfig c = *this;
  c.finalize();
  // validate() rejects configs whose count overflows; saturate for the others.
  return model_parameters(c).value_or(std::numeric_limits<int64_t>::max());
}

int64_t TransformerConfig::active_parameters() const {
  TransformerConfig c = *this;
  c.finalize();
  int64_t n = c.num_parameters();
  if (c.moe()) {
    // A token runs through top_k of the experts of each MoE layer (the leading dense
    // layers' MLP is all active): the other experts' parameters are not active for it.
    int64_t expert = 0;
    for (const TensorDesc& t : describe_group(c, GroupKind::kLayer, 1, false)) {
      if (t.expert == 0) expert += t.shape.numel();
    }
    n -= int64_t{c.n_layers - c.moe_first_dense_layers} * (c.moe_experts - c.moe_top_k) * expert;
  }
  return n;
}

double TransformerConfig::flops_per_token() const {
  TransformerConfig c = *this;
  c.finalize();
  // N excludes the position table: a lookup costs no multiply-adds. The padded
  // vocabulary rows stay in N (the GEMMs really compute them), as in llm.c.
  int64_t n = c.active_parameters();
  if (c.family().learned_positions()) n -= int64_t{c.max_seq_len} * c.d_model;
  return 6.0 * static_cast<double>(n) +
         12.0 * c.n_layers * static_cast<double>(c.d_model) * c.seq_len;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

}  // namespace trident
