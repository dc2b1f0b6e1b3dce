#include "model/hf_export.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "model/safetensors.h"
#include "model/transformer.h"

namespace trident {
namespace {

// How one Hugging Face tensor is made of Trident tensors.
enum class Kind {
  kCopy,            // same shape and layout
  kTranspose,       // Trident [r, c] -> HF [c, r] (GPT-2 Conv1D)
  kStackTranspose,  // parts [r_k, C] stacked by rows, then transposed: HF [C, sum r_k]
  kConcat,          // 1-D parts concatenated
  kVocabRows,       // Trident [Vp, C] -> HF [V, C]: the padded rows dropped
};

struct Rule {
  std::string hf;
  Kind kind;
  std::vector<std::string> parts;  // Trident names
};

// One row of a family's name table: a Hugging Face tensor, how it is made, and of which
// Trident tensors. "{i}" stands for the layer index in per-layer rows, "{e}" for the
// routed expert's index in per-expert rows (one per layer and expert).
struct NameRow {
  enum Where { kBefore, kLayer, kExpert, kAfter, kUntiedHead } where;
  const char* hf;
  Kind kind;
  std::vector<const char*> parts;
};

const std::vector<NameRow>& gpt2_names() {
  using R = NameRow;
  static const std::vector<NameRow> rows = {
      {R::kBefore, "transformer.wte.weight", Kind::kVocabRows, {"wte"}},
      {R::kBefore, "transformer.wpe.weight", Kind::kCopy, {"wpe"}},
      {R::kLayer, "transformer.h.{i}.ln_1.weight", Kind::kCopy, {"ln1.weight"}},
      {R::kLayer, "transformer.h.{i}.ln_1.bias", Kind::kCopy, {"ln1.bias"}},
      {R::kLayer, "transformer.h.{i}.attn.c_attn.weight", Kind::kStackTranspose,
       {"attn.q.weight", "attn.k.weight", "attn.v.weight"}},
      {R::kLayer, "transformer.h.{i}.attn.c_attn.bias", Kind::kConcat,
       {"attn.q.bias", "attn.k.bias", "attn.v.bias"}},
      {R::kLayer, "transformer.h.{i}.attn.c_proj.weight", Kind::kTranspose, {"attn.o.weight"}},
      {R::kLayer, "transformer.h.{i}.attn.c_proj.bias", Kind::kCopy, {"attn.o.bias"}},
      {R::kLayer, "transformer.h.{i}.ln_2.weight", Kind::kCopy, {"ln2.weight"}},
      {R::kLayer, "transformer.h.{i}.ln_2.bias", Kind::kCopy, {"ln2.bias"}},
      {R::kLayer, "transformer.h.{i}.mlp.c_fc.weight", Kind::kTranspose, {"mlp.fc.weight"}},
      {R::kLayer, "transformer.h.{i}.mlp.c_fc.bias", Kind::kCopy, {"mlp.fc.bias"}},
      {R::kLayer, "transformer.h.{i}.mlp.c_proj.weight", Kind::kTranspose, {"mlp.proj.weight"}},
      {R::kLayer, "transformer.h.{i}.mlp.c_proj.bias", Kind::kCopy, {"mlp.proj.bias"}},
      {R::kAfter, "transformer.ln_f.weight", Kind::kCopy, {"lnf.weight"}},
      {R::kAfter, "transformer.ln_f.bias", Kind::kCopy, {"lnf.bias"}},
      {R::kUntiedHead, "lm_head.weight", Kind::kVocabRows, {"lm_head.weight"}},
  };
  return rows;
}

const std::vector<NameRow>& llama_names() {
  using R = NameRow;
  static const std::vector<NameRow> rows = {
      {R::kBefore, "model.embed_tokens.weight", Kind::kVocabRows, {"wte"}},
      {R::kLayer, "model.layers.{i}.input_layernorm.weight", Kind::kCopy, {"ln1.weight"}},
      {R::kLayer, "model.layers.{i}.self_attn.q_proj.weight", Kind::kCopy, {"attn.q.weight"}},
      {R::kLayer, "model.layers.{i}.self_attn.k_proj.weight", Kind::kCopy, {"attn.k.weight"}},
      {R::kLayer, "model.layers.{i}.self_attn.v_proj.weight", Kind::kCopy, {"attn.v.weight"}},
      {R::kLayer, "model.layers.{i}.self_attn.o_proj.weight", Kind::kCopy, {"attn.o.weight"}},
      {R::kLayer, "model.layers.{i}.post_attention_layernorm.weight", Kind::kCopy,
       {"ln2.weight"}},
      {R::kLayer, "model.layers.{i}.mlp.gate_proj.weight", Kind::kCopy, {"mlp.gate.weight"}},
      {R::kLayer, "model.layers.{i}.mlp.up_proj.weight", Kind::kCopy, {"mlp.up.weight"}},
      {R::kLayer, "model.layers.{i}.mlp.down_proj.weight", Kind::kCopy, {"mlp.down.weight"}},
      {R::kAfter, "model.norm.weight", Kind::kCopy, {"lnf.weight"}},
      {R::kUntiedHead, "lm_head.weight", Kind::kVocabRows, {"lm_head.weight"}},
  };
  return rows;
}

// Mixtral (modeling_mixtral.py): Llama's attention and norms; each layer's MLP is the
// sparse block, a router `gate` [E, C] and E experts of SwiGLU with w1 = gate, w3 = up
// (both [Fe, C]) and w2 = down ([C, Fe]): Trident's routed experts, row for row. The
// routing rule is the same (softmax, top k, the k weights renormalised).
const std::vector<NameRow>& mixtral_names() {
  using R = NameRow;
  static const std::vector<NameRow> rows = [] {
    std::vector<NameRow> r;
    for (const NameRow& row : llama_names()) {
      if (std::string_view(row.hf).find(".mlp.") == std::string_view::npos) r.push_back(row);
    }
    const auto at = std::find_if(r.begin(), r.end(), [](const NameRow& x) { return x.where == R::kAfter; });
    r.insert(at, {{R::kLayer, "model.layers.{i}.block_sparse_moe.gate.weight", Kind::kCopy,
                   {"moe.router.weight"}},
                  {R::kExpert, "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
                   Kind::kCopy, {"moe.experts.{e}.gate.weight"}},
                  {R::kExpert, "model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight",
                   Kind::kCopy, {"moe.experts.{e}.down.weight"}},
                  {R::kExpert, "model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight",
                   Kind::kCopy, {"moe.experts.{e}.up.weight"}}});
    return r;
  }();
  return rows;
}

void gpt2_config(const TransformerConfig& c, nlohmann::ordered_json& j);
void llama_config(const TransformerConfig& c, nlohmann::ordered_json& j);
void mixtral_config(const TransformerConfig& c, nlohmann::ordered_json& j);
class ConfigReader;
Status read_gpt2(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c, bool* tied);
Status read_llama(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c, bool* tied);
Status read_mixtral(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c,
                    bool* tied);

// The Hugging Face side of a family: its model_type and class, its name table, and its
// config.json writer and reader. `moe`: the row of the family's mixture-of-experts models.
struct HfFamily {
  Arch arch;
  bool moe;
  const char* model_type;
  const char* hf_class;
  const std::vector<NameRow>& (*names)();
  void (*write_config)(const TransformerConfig&, nlohmann::ordered_json&);
  Status (*read_config)(const ConfigReader&, const nlohmann::json&, TransformerConfig*, bool*);
};

const HfFamily kHfFamilies[] = {
    {Arch::kGpt2, false, "gpt2", "GPT2LMHeadModel", gpt2_names, gpt2_config, read_gpt2},
    {Arch::kLlama, false, "llama", "LlamaForCausalLM", llama_names, llama_config, read_llama},
    {Arch::kLlama, true, "mixtral", "MixtralForCausalLM", mixtral_names, mixtral_config,
     read_mixtral},
};

const HfFamily* hf_family(Arch arch, bool moe) {
  for (const HfFamily& f : kHfFamilies) {
    if (f.arch == arch && f.moe == moe) return &f;
  }
  return nullptr;
}

const HfFamily& hf_family_of(const TransformerConfig& c) {
  const HfFamily* f = hf_family(c.arch, c.moe());
  TRIDENT_CHECK_MSG(f != nullptr, std::string("model family ") + arch_name(c.arch) +
                                      (c.moe() ? " with experts" : "") +
                                      " has no Hugging Face names");
  return *f;
}

// pattern with "{key}" replaced by value (when present).
std::string substitute(std::string s, const char* key, const std::string& value) {
  const size_t at = s.find(key);
  if (at != std::string::npos) s.replace(at, std::strlen(key), value);
  return s;
}

std::vector<Rule> hf_rules(const TransformerConfig& c) {
  std::vector<Rule> rules;
  auto add = [&](const NameRow& row, const std::string& layer, const std::string& expert = "") {
    Rule r{substitute(substitute(row.hf, "{i}", layer), "{e}", expert), row.kind, {}};
    const bool per_layer = row.where == NameRow::kLayer || row.where == NameRow::kExpert;
    const std::string prefix = per_layer ? "layers." + layer + "." : "";
    for (const char* part : row.parts) r.parts.push_back(prefix + substitute(part, "{e}", expert));
    rules.push_back(std::move(r));
  };
  const std::vector<NameRow>& names = hf_family_of(c).names();
  for (const NameRow& row : names) {
    if (row.where == NameRow::kBefore) add(row, "");
  }
  for (int i = 0; i < c.n_layers; ++i) {
    for (const NameRow& row : names) {
      if (row.where == NameRow::kLayer) add(row, std::to_string(i));
    }
    for (int e = 0; e < c.moe_experts; ++e) {
      for (const NameRow& row : names) {
        if (row.where == NameRow::kExpert) add(row, std::to_string(i), std::to_string(e));
      }
    }
  }
  for (const NameRow& row : names) {
    if (row.where == NameRow::kAfter || (row.where == NameRow::kUntiedHead && !c.tied())) {
      add(row, "");
    }
  }
  return rules;
}

// Global shapes of a whole model's parameters, by Trident name.
std::map<std::string, std::vector<int64_t>> trident_shapes(const TransformerConfig& c) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamInfo& p : describe_params(c, ModelPartition{}).params) {
    shapes[p.name] = p.shape.dims();
  }
  return shapes;
}

std::vector<int64_t> hf_shape(const Rule& rule, const TransformerConfig& c,
                              const std::map<std::string, std::vector<int64_t>>& shapes) {
  const std::vector<int64_t>& first = shapes.at(rule.parts[0]);
  switch (rule.kind) {
    case Kind::kCopy: return first;
    case Kind::kTranspose: return {first[1], first[0]};
    case Kind::kStackTranspose: {
      int64_t rows = 0;
      for (const std::string& p : rule.parts) rows += shapes.at(p)[0];
      return {first[1], rows};
    }
    case Kind::kConcat: {
      int64_t n = 0;
      for (const std::string& p : rule.parts) n += shapes.at(p)[0];
      return {n};
    }
    case Kind::kVocabRows: return {c.vocab_size, first[1]};
  }
  return {};
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// out[j * rows + i] = in[i * cols + j]: [rows, cols] -> [cols, rows].
std::vector<float> transpose(const float* in, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  }
  return out;
}

// The shortest decimal that reads back as the same float (1e-05, not 9.99999974e-06),
// so config.json shows the value the user configured.
double shortest(float v) {
  char buf[32];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace

Status check_hf_exportable(const TransformerConfig& config) {
  if (!config.moe()) return Status::ok();
  const std::string what =
      "a mixture-of-experts model (model.moe_experts=" + std::to_string(config.moe_experts) + ")";
  if (!config.family().swiglu() || hf_family(config.arch, true) == nullptr) {
    return Status::invalid_input(what + " of the " + arch_name(config.arch) +
                                 " family has no Hugging Face format: only the llama family's "
                                 "(SwiGLU experts) exports, as Mixtral");
  }
  if (config.moe_shared_experts > 0) {
    return Status::invalid_input(what + " with model.moe_shared_experts=" +
                                 std::to_string(config.moe_shared_experts) +
                                 " has no Mixtral equivalent (Mixtral has routed experts only)");
  }
  if (config.moe_first_dense_layers > 0) {
    return Status::invalid_input(what + " with model.moe_first_dense_layers=" +
                                 std::to_string(config.moe_first_dense_layers) +
                                 " has no Mixtral equivalent (every Mixtral layer is sparse)");
  }
  return Status::ok();
}

Result<std::vector<HfTensor>> to_hf_tensors(const TransformerConfig& config,
                                            const TridentParamLookup& lookup) {
  TRIDENT_RETURN_IF_ERROR(check_hf_exportable(config));
  const auto shapes = trident_shapes(config);
  std::vector<HfTensor> out;
  for (const Rule& rule : hf_rules(config)) {
    std::vector<std::vector<float>> parts;
    for (const std::string& name : rule.parts) {
      TRIDENT_ASSIGN_OR_RETURN(std::vector<float> data, lookup(name));
      const std::vector<int64_t>& shape = shapes.at(name);
      if (static_cast<int64_t>(data.size()) != numel(shape)) {
        return Status::invalid_input("parameter " + name + " has " + std::to_string(data.size()) +
                                     " values, the model needs " + shape_str(shape));
      }
      parts.push_back(std::move(data));
    }
    HfTensor t;
    t.name = rule.hf;
    t.shape = hf_shape(rule, config, shapes);
    const std::vector<int64_t>& s0 = shapes.at(rule.parts[0]);
    switch (rule.kind) {
      case Kind::kCopy: t.data = std::move(parts[0]); break;
      case Kind::kTranspose: t.data = transpose(parts[0].data(), s0[0], s0[1]); break;
      case Kind::kStackTranspose: {
        std::vector<float> stacked;
        for (const auto& p : parts) stacked.insert(stacked.end(), p.begin(), p.end());
        t.data = transpose(stacked.data(), t.shape[1], t.shape[0]);
        break;
      }
      case Kind::kConcat:
        for (const auto& p : parts) t.data.insert(t.data.end(), p.begin(), p.end());
        break;
      case Kind::kVocabRows:
        t.data.assign(parts[0].begin(), parts[0].begin() + numel(t.shape));
        break;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string hf_config_json(const TransformerConfig& c, const HfTokenIds& ids) {
  nlohmann::ordered_json j;
  const HfFamily& f = hf_family_of(c);
  j["architectures"] = {f.hf_class};
  j["model_type"] = f.model_type;
  f.write_config(c, j);
  if (ids.bos >= 0) j["bos_token_id"] = ids.bos;
  if (ids.eos >= 0) j["eos_token_id"] = ids.eos;
  j["tie_word_embeddings"] = c.tied();
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

const char* hf_class_name(const TransformerConfig& config) { return hf_family_of(config).hf_class; }

namespace {

void gpt2_config(const TransformerConfig& c, nlohmann::ordered_json& j) {
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.max_seq_len;
  j["n_ctx"] = c.max_seq_len;
  j["n_embd"] = c.d_model;
  j["n_layer"] = c.n_layers;
  j["n_head"] = c.n_heads;
  j["n_inner"] = c.d_ff;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = shortest(c.norm_eps);
  j["initializer_range"] = shortest(c.init_std);
  // Trident trains without dropout.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
}

void mixtral_config(const TransformerConfig& c, nlohmann::ordered_json& j) {
  llama_config(c, j);
  j.erase("mlp_bias");  // Mixtral's experts have no bias option
  j["intermediate_size"] = c.moe_d_ff;  // an expert's hidden width
  j["num_local_experts"] = c.moe_experts;
  j["num_experts_per_tok"] = c.moe_top_k;
  j["sliding_window"] = nullptr;  // full causal attention, as Trident's
  j["router_jitter_noise"] = 0.0;
  j["output_router_logits"] = false;
}

void llama_config(const TransformerConfig& c, nlohmann::ordered_json& j) {
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.d_ff;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = shortest(c.norm_eps);
  j["rope_theta"] = shortest(c.rope_theta);
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["initializer_range"] = shortest(c.init_std);
}

}  // namespace

const std::vector<float>* HfModel::find(std::string_view name) const {
  for (const auto& [n, data] : tensors) {
    if (n == name) return &data;
  }
  return nullptr;
}

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

namespace {

// Reads HF config keys with HF's defaults; errors name config.json and the key.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {}

  Status integer(const char* key, int fallback, int* out) const {
    if (!j_.contains(key) || j_[key].is_null()) {
      *out = fallback;
      return Status::ok();
    }
    const auto& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30)) {
      return bad(key, "a positive integer", v);
    }
    *out = v.get<int>();
    return Status::ok();
  }
  Status number(const char* key, double fallback, float* out) const {
    if (!j_.contains(key) || j_[key].is_null()) {
      *out = static_cast<float>(fallback);
      return Status::ok();
    }
    const auto& v = j_[key];
    if (!v.is_number() || v.get<double>() <= 0) return bad(key, "a positive number", v);
    *out = v.get<float>();
    return Status::ok();
  }
  Status boolean(const char* key, bool fallback, bool* out) const {
    if (!j_.contains(key) || j_[key].is_null()) {
      *out = fallback;
      return Status::ok();
    }
    if (!j_[key].is_boolean()) return bad(key, "true or false", j_[key]);
    *out = j_[key].get<bool>();
    return Status::ok();
  }
  // Options Trident cannot represent must be absent or have the one supported value.
  Status require(const char* key, const nlohmann::json& supported) const {
    if (!j_.contains(key) || j_[key] == supported) return Status::ok();
    return Status::invalid_input(path_ + ": '" + key + "' is " + j_[key].dump() +
                                 "; Trident supports only " + supported.dump());
  }

 private:
  Status bad(const char* key, const char* expected, const nlohmann::json& v) const {
    return Status::invalid_input(path_ + ": '" + key + "' must be " + expected + ", got " +
                                 v.dump());
  }
  const nlohmann::json& j_;
  std::string path_;
};

Status read_gpt2(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c,
                 bool* tied) {
  TRIDENT_RETURN_IF_ERROR(r.integer("vocab_size", 50257, &c->vocab_size));
  TRIDENT_RETURN_IF_ERROR(r.integer("n_positions", 1024, &c->max_seq_len));
  TRIDENT_RETURN_IF_ERROR(r.integer("n_embd", 768, &c->d_model));
  TRIDENT_RETURN_IF_ERROR(r.integer("n_layer", 12, &c->n_layers));
  TRIDENT_RETURN_IF_ERROR(r.integer("n_head", 12, &c->n_heads));
  TRIDENT_RETURN_IF_ERROR(r.integer("n_inner", 4 * c->d_model, &c->d_ff));
  TRIDENT_RETURN_IF_ERROR(r.number("layer_norm_epsilon", 1e-5, &c->norm_eps));
  TRIDENT_RETURN_IF_ERROR(r.boolean("tie_word_embeddings", true, tied));
  if (j.contains("activation_function") && j["activation_function"] != "gelu_pytorch_tanh") {
    TRIDENT_RETURN_IF_ERROR(r.require("activation_function", "gelu_new"));
  }
  TRIDENT_RETURN_IF_ERROR(r.require("scale_attn_weights", true));
  TRIDENT_RETURN_IF_ERROR(r.require("scale_attn_by_inverse_layer_idx", false));
  TRIDENT_RETURN_IF_ERROR(r.require("reorder_and_upcast_attn", false));
  c->n_kv_heads = c->n_heads;
  return Status::ok();
}

Status read_llama(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c,
                  bool* tied) {
  (void)j;
  TRIDENT_RETURN_IF_ERROR(r.integer("vocab_size", 32000, &c->vocab_size));
  TRIDENT_RETURN_IF_ERROR(r.integer("hidden_size", 4096, &c->d_model));
  TRIDENT_RETURN_IF_ERROR(r.integer("intermediate_size", 11008, &c->d_ff));
  TRIDENT_RETURN_IF_ERROR(r.integer("num_hidden_layers", 32, &c->n_layers));
  TRIDENT_RETURN_IF_ERROR(r.integer("num_attention_heads", 32, &c->n_heads));
  TRIDENT_RETURN_IF_ERROR(r.integer("num_key_value_heads", c->n_heads, &c->n_kv_heads));
  TRIDENT_RETURN_IF_ERROR(r.integer("max_position_embeddings", 2048, &c->max_seq_len));
  TRIDENT_RETURN_IF_ERROR(r.number("rms_norm_eps", 1e-6, &c->norm_eps));
  TRIDENT_RETURN_IF_ERROR(r.number("rope_theta", 10000.0, &c->rope_theta));
  TRIDENT_RETURN_IF_ERROR(r.boolean("tie_word_embeddings", false, tied));
  TRIDENT_RETURN_IF_ERROR(r.require("hidden_act", "silu"));
  TRIDENT_RETURN_IF_ERROR(r.require("rope_scaling", nullptr));
  TRIDENT_RETURN_IF_ERROR(r.require("attention_bias", false));
  TRIDENT_RETURN_IF_ERROR(r.require("mlp_bias", false));
  if (c->n_heads > 0 && c->d_model % c->n_heads == 0) {
    TRIDENT_RETURN_IF_ERROR(r.require("head_dim", c->d_model / c->n_heads));
  }
  return Status::ok();
}

Status read_mixtral(const ConfigReader& r, const nlohmann::json& j, TransformerConfig* c,
                    bool* tied) {
  TRIDENT_RETURN_IF_ERROR(read_llama(r, j, c, tied));
  TRIDENT_RETURN_IF_ERROR(r.integer("num_local_experts", 8, &c->moe_experts));
  TRIDENT_RETURN_IF_ERROR(r.integer("num_experts_per_tok", 2, &c->moe_top_k));
  TRIDENT_RETURN_IF_ERROR(r.require("sliding_window", nullptr));
  c->moe_d_ff = c->d_ff;  // intermediate_size is the experts' width
  return Status::ok();
}

Result<TransformerConfig> read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::invalid_input(path + ": cannot open (no config.json in the directory?)");
  std::stringstream buf;
  buf << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::invalid_input(path + ": not a JSON object");
  }
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    return Status::invalid_input(path +
                                 ": no 'model_type' (expected \"gpt2\", \"llama\" or \"mixtral\")");
  }
  const std::string type = j["model_type"].get<std::string>();
  ConfigReader r(j, path);
  TransformerConfig c;
  bool tied = false;
  const HfFamily* family = nullptr;
  std::string supported;
  for (const HfFamily& f : kHfFamilies) {
    if (type == f.model_type) family = &f;
    supported += (supported.empty() ? "" : ", ") + std::string(f.model_type);
  }
  if (family == nullptr) {
    return Status::invalid_input(path + ": unknown model_type \"" + type +
                                 "\" (supported: " + supported + ")");
  }
  c.arch = family->arch;
  TRIDENT_RETURN_IF_ERROR(family->read_config(r, j, &c, &tied));
  c.tie_embeddings = tied ? 1 : 0;
  c.seq_len = c.max_seq_len;
  c.init_std = 0.02f;
  c.finalize();
  Status st = c.validate();
  if (!st.is_ok()) return Status::invalid_input(path + ": " + st.message());
  return c;
}

}  // namespace

Result<HfModel> read_hf_model(const std::string& dir) {
  HfModel model;
  model.dir = dir;
  const std::string config_path = (std::filesystem::path(dir) / kHfConfigFile).string();
  const std::string weights_path = (std::filesystem::path(dir) / kHfWeightsFile).string();
  TRIDENT_ASSIGN_OR_RETURN(model.arch, read_hf_config(config_path));
  std::error_code ec;
  if (!std::filesystem::exists(weights_path, ec)) {
    return Status::invalid_input(weights_path + ": missing (sharded or .bin Hugging Face "
                                 "checkpoints are not supported; save with safe_serialization)");
  }
  TRIDENT_ASSIGN_OR_RETURN(SafetensorsFile file, read_safetensors(weights_path));
  const TransformerConfig& c = model.arch;
  const auto shapes = trident_shapes(c);
  std::set<std::string> used;
  std::map<std::string, std::vector<float>> by_name;
  for (const Rule& rule : hf_rules(c)) {
    const SafetensorsTensor* t = file.find(rule.hf);
    std::string found = rule.hf;
    // HF's own gpt2 files were saved from GPT2Model: no "transformer." prefix.
    if (!t && rule.hf.rfind("transformer.", 0) == 0) {
      found = rule.hf.substr(12);
      t = file.find(found);
    }
    if (!t) return Status::invalid_input(weights_path + ": missing tensor " + rule.hf);
    used.insert(found);
    const std::vector<int64_t> want = hf_shape(rule, c, shapes);
    if (t->shape != want) {
      return Status::invalid_input(weights_path + ": tensor " + found + " has shape " +
                                   shape_str(t->shape) + ", " + config_path + " implies " +
                                   shape_str(want));
    }
    const std::vector<int64_t>& s0 = shapes.at(rule.parts[0]);
    switch (rule.kind) {
      case Kind::kCopy: by_name[rule.parts[0]] = t->data; break;
      case Kind::kTranspose: by_name[rule.parts[0]] = transpose(t->data.data(), s0[1], s0[0]); break;
      case Kind::kStackTranspose: {
        const std::vector<float> stacked = transpose(t->data.data(), want[0], want[1]);
        size_t at = 0;
        for (const std::string& p : rule.parts) {
          const size_t n = static_cast<size_t>(numel(shapes.at(p)));
          by_name[p].assign(stacked.begin() + at, stacked.begin() + at + n);
          at += n;
        }
        break;
      }
      case Kind::kConcat: {
        size_t at = 0;
        for (const std::string& p : rule.parts) {
          const size_t n = static_cast<size_t>(numel(shapes.at(p)));
          by_name[p].assign(t->data.begin() + at, t->data.begin() + at + n);
          at += n;
        }
        break;
      }
      case Kind::kVocabRows: {
        std::vector<float> padded(static_cast<size_t>(numel(s0)), 0.0f);
        std::copy(t->data.begin(), t->data.end(), padded.begin());
        by_name[rule.parts[0]] = std::move(padded);
        break;
      }
    }
  }
  for (const SafetensorsTensor& t : file.tensors) {
    const bool buffer = t.name.size() > 9 && (t.name.ends_with(".attn.bias") ||
                                              t.name.ends_with(".attn.masked_bias"));
    // A tied model's file may carry the head as well (it is the embedding).
    if (!used.count(t.name) && !buffer && !(c.tied() && t.name == "lm_head.weight")) {
      log::warn("model.init_from {}: ignoring tensor {} that the model does not use",
                weights_path, t.name);
    }
  }
  for (const ParamInfo& p : describe_params(c, ModelPartition{}).params) {
    model.tensors.emplace_back(p.name, std::move(by_name.at(p.name)));
  }
  return model;
}

Status apply_hf_architecture(const HfModel& model, TransformerConfig* config) {
  const TransformerConfig& a = model.arch;
  const bool learned = a.family().learned_positions();
  if (learned && config->seq_len > a.max_seq_len) {
    return Status::invalid_config("model.seq_len: " + std::to_string(config->seq_len) +
                                  " exceeds the " + std::to_string(a.max_seq_len) +
                                  " positions (n_positions) of model.init_from " + model.dir);
  }
  if (!learned && config->seq_len > a.max_seq_len) {
    log::warn("model.init_from {}: model.seq_len={} exceeds max_position_embeddings={}",
              model.dir, config->seq_len, a.max_seq_len);
  }
  if (config->arch != a.arch) {
    log::warn("model.init_from {}: overriding model.arch={} with {} from config.json",
              model.dir, arch_name(config->arch), arch_name(a.arch));
  }
  config->arch = a.arch;
  auto override_int = [&](const char* key, int* field, int value, bool configured) {
    if (configured && *field != value) {
      log::warn("model.init_from {}: overriding model.{}={} with {} from config.json",
                model.dir, key, *field, value);
    }
    *field = value;
  };
  auto override_float = [&](const char* key, float* field, float value) {
    if (*field != value) {
      log::warn("model.init_from {}: overriding model.{}={} with {} from config.json",
                model.dir, key, *field, value);
    }
    *field = value;
  };
  override_int("vocab_size", &config->vocab_size, a.vocab_size, true);
  override_int("n_layers", &config->n_layers, a.n_layers, true);
  override_int("n_heads", &config->n_heads, a.n_heads, true);
  override_int("n_kv_heads", &config->n_kv_heads, a.n_kv_heads, config->n_kv_heads != 0);
  override_int("d_model", &config->d_model, a.d_model, true);
  override_int("d_ff", &config->d_ff, a.d_ff, config->d_ff != 0);
  override_int("tie_embeddings", &config->tie_embeddings, a.tie_embeddings,
               config->tie_embeddings != -1);
  // Experts: Mixtral's (none for gpt2 and llama); a Hugging Face model has no shared
  // experts and no leading dense layers.
  override_int("moe_experts", &config->moe_experts, a.moe_experts, true);
  if (a.moe()) {
    override_int("moe_top_k", &config->moe_top_k, a.moe_top_k, true);
    override_int("moe_d_ff", &config->moe_d_ff, a.moe_d_ff, config->moe_d_ff != 0);
  } else {
    config->moe_d_ff = 0;
  }
  override_int("moe_shared_experts", &config->moe_shared_experts, 0, true);
  override_int("moe_first_dense_layers", &config->moe_first_dense_layers, 0, true);
  override_float("norm_eps", &config->norm_eps, a.norm_eps);
  if (a.family().rope()) override_float("rope_theta", &config->rope_theta, a.rope_theta);
  config->padded_vocab = a.padded_vocab;
  config->max_seq_len = learned ? a.max_seq_len : 0;
  config->head_dim = a.head_dim;
  return Status::ok();
}

}  // namespace trident
