// Hugging Face model directories (model.safetensors + config.json): Trident's weights
// in Hugging Face's names and conventions, for `trident export --format safetensors`,
// and back, for model.init_from. Each family has one name table (one row per HF tensor:
// its name, the Trident tensors it is made of and the transpose/stack rule) and its
// config.json writer and reader (hf_export.cpp's kHfFamilies):
//
//   gpt2  -> GPT2LMHeadModel: transformer.wte / wpe / h.{i}.ln_1 / attn.c_attn /
//            attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj / ln_f, lm_head when untied.
//            GPT-2's Conv1D stores weights [in, out] (y = x W + b), the transpose of
//            Trident's [out, in]; c_attn is q, k, v concatenated along out.
//   llama -> LlamaForCausalLM: model.embed_tokens / layers.{i}.input_layernorm /
//            self_attn.{q,k,v,o}_proj / post_attention_layernorm /
//            mlp.{gate,up,down}_proj / model.norm, lm_head when untied. Linear weights
//            [out, in] like Trident's. No permutation of q/k rows: Trident's RoPE
//            (kernels/cpu/rope.cpp) already pairs (i, i + HD/2), HF's rotate_half.
//   llama with experts (model.moe_experts > 0) -> MixtralForCausalLM: llama's names but
//            the MLP, which is layers.{i}.block_sparse_moe.gate (the router, [E, C]) and
//            block_sparse_moe.experts.{e}.w1 / w2 / w3 (gate / down / up); config.json
//            adds num_local_experts, num_experts_per_tok and intermediate_size = the
//            experts' width. Shared experts and leading dense layers have no Mixtral form
//            (check_hf_exportable refuses them).
// Padded vocabulary rows (Trident's Vp > V) are dropped on export and re-padded with
// zeros on import; a tied head is written once (the embedding), as HF expects for
// tie_word_embeddings = true. All tensors are F32 (read also accepts BF16 / F16).
//
// Errors: reading a directory fails with Status::invalid_input naming the file
// (config.json, model.safetensors) and the key or tensor: missing files, unknown
// model_type, unsupported options (activation, rope_scaling, biases), a missing tensor,
// a wrong shape, a damaged safetensors file (model/safetensors.h).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"

namespace trident {

inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfConfigFile = "config.json";

struct HfTensor {
  std::string name;             // Hugging Face's name
  std::vector<int64_t> shape;   // Hugging Face's shape
  std::vector<float> data;      // row-major
};

// The global tensor (model/transformer.h name and shape, row-major) of a Trident
// parameter, or an error naming where it was looked for.
using TridentParamLookup = std::function<Result<std::vector<float>>(const std::string& name)>;

// OK when `config` has a Hugging Face format; for a mixture-of-experts model that is
// Mixtral: the llama family (SwiGLU experts), no shared experts, no leading dense layers.
// Otherwise Status::invalid_input saying which key has no Mixtral equivalent.
Status check_hf_exportable(const TransformerConfig& config);

// The Hugging Face tensors of a finalized `config` (padded_vocab and, for gpt2,
// max_seq_len as the weights have them), in HF's module order.
Result<std::vector<HfTensor>> to_hf_tensors(const TransformerConfig& config,
                                            const TridentParamLookup& lookup);

// The special-token ids config.json records (bos_token_id, eos_token_id: what Hugging
// Face's generate() starts and stops with); -1 leaves the key out (no tokenizer known).
struct HfTokenIds {
  int64_t bos = -1;
  int64_t eos = -1;
};

// config.json text for `config` (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM),
// with the tokenizer's ids where `ids` has them.
std::string hf_config_json(const TransformerConfig& config, const HfTokenIds& ids = {});
// The Hugging Face class of config's family ("GPT2LMHeadModel", "LlamaForCausalLM").
const char* hf_class_name(const TransformerConfig& config);

// A model read from a Hugging Face directory, in Trident's terms.
struct HfModel {
  std::string dir;
  // The architecture config.json describes, finalized (padded_vocab = V rounded up to
  // 128, max_seq_len = n_positions for gpt2).
  TransformerConfig arch;
  // Every parameter of a whole `arch` model under Trident's name, global shape.
  std::vector<std::pair<std::string, std::vector<float>>> tensors;

  const std::vector<float>* find(std::string_view name) const;  // nullptr when absent
};

// True when `path` is a directory (model.init_from then means a Hugging Face model;
// a file means an llm.c checkpoint).
bool is_hf_model_dir(const std::string& path);

Result<HfModel> read_hf_model(const std::string& dir);

// Makes `config` describe the directory's model (arch, vocab_size, n_layers, n_heads,
// n_kv_heads, d_model, d_ff, tie_embeddings, norm_eps, rope_theta, padded_vocab,
// max_seq_len), warning for each configured value it overrides; seq_len is kept, and for
// gpt2 seq_len > n_positions is Status::invalid_config naming model.seq_len. Call
// finalize() and validate() afterwards.
Status apply_hf_architecture(const HfModel& model, TransformerConfig* config);

}  // namespace trident
