#include "model/transformer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/rng.h"

namespace trident {

namespace {
constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

// Pointers to one layer's tensors inside a parameter-shaped buffer (parameters or
// gradients). Absent tensors (gpt2-only biases in llama, ...) are null.
struct Transformer::LayerParams {
  float* ln1_w;  // (C)
  float* ln1_b;  // (C)
  float* q_w;    // (NH*HD, C)
  float* q_b;    // (NH*HD)
  float* k_w;    // (NKV*HD, C)
  float* k_b;    // (NKV*HD)
  float* v_w;    // (NKV*HD, C)
  float* v_b;    // (NKV*HD)
  float* o_w;    // (C, NH*HD)
  float* o_b;    // (C)
  float* ln2_w;  // (C)
  float* ln2_b;  // (C)
  float* fc_w;   // (F, C)  gpt2 mlp.fc / llama mlp.gate
  float* fc_b;   // (F)
  float* up_w;   // (F, C)  llama mlp.up
  float* proj_w; // (C, F)  gpt2 mlp.proj / llama mlp.down
  float* proj_b; // (C)
};

// One layer's saved activations, for a micro-batch of B*T = N rows.
struct Transformer::LayerActs {
  float* ln1;       // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  float* q;         // (N, NH*HD)  after RoPE (llama)
  float* k;         // (N, NKV*HD) after RoPE (llama)
  float* v;         // (N, NKV*HD)
  float* att;       // (B, NH, T, T) softmax probabilities
  float* atty;      // (N, NH*HD)
  float* res2;      // (N, C)  residual stream after attention
  float* ln2;       // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  float* h1;        // (N, F)  gpt2 fc output / llama gate output
  float* h2;        // (N, F)  llama up output
  float* h_act;     // (N, F)  gelu(h1) / silu(h1) * h2
};

// Indices into act_offsets_: per layer kLayerSlots slots, then the globals.
namespace {
enum LayerSlot {
  kLn1, kLn1Mean, kLn1Rstd, kQ, kK, kV, kAtt, kAtty, kRes2, kLn2, kLn2Mean, kLn2Rstd, kH1, kH2,
  kHAct, kLayerSlots
};
enum GlobalSlot {
  kTokens, kTargets, kLnf, kLnfMean, kLnfRstd, kLogits, kLosses,
  // backward scratch, shared by all layers
  kDx, kDln, kDq, kDk, kDv, kDatty, kDh1, kDh2, kDhAct, kGlobalSlots
};
}  // namespace

Transformer::Transformer(const TransformerConfig& config, Ops& ops, int micro_batch_size)
    : config_(config), ops_(ops), micro_batch_size_(micro_batch_size) {
  TRIDENT_CHECK_MSG(config_.head_dim > 0 && config_.padded_vocab >= config_.vocab_size,
                    "TransformerConfig must be finalize()d");
  TRIDENT_CHECK(micro_batch_size_ > 0);
  build_param_table();
  param_buffer_ = DeviceBuffer(ops_, num_param_floats_ * sizeof(float));
  grad_buffer_ = DeviceBuffer(ops_, num_param_floats_ * sizeof(float));
  plan_activations();
  activations_ = DeviceBuffer(ops_, act_arena_.total_bytes());
  act_arena_.bind(activations_.get());
}

void Transformer::build_param_table() {
  const auto& c = config_;
  const int64_t C = c.d_model, F = c.d_ff, HD = c.head_dim;
  const int64_t q_dim = c.n_heads * HD, kv_dim = c.n_kv_heads * HD;
  const bool gpt2 = c.is_gpt2();
  auto add = [&](std::string name, Shape shape) {
    ParamInfo p;
    p.decay = shape.rank() == 2;
    p.name = std::move(name);
    p.shape = std::move(shape);
    // Keep every tensor 16-float aligned so vector loads never straddle tensors.
    p.offset = (num_param_floats_ + 15) / 16 * 16;
    num_param_floats_ = p.offset + static_cast<size_t>(p.shape.numel());
    params_.push_back(std::move(p));
  };
  add("wte", {c.padded_vocab, C});
  if (gpt2) add("wpe", {c.max_seq_len, C});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "ln1.weight", {C});
    if (gpt2) add(p + "ln1.bias", {C});
    add(p + "attn.q.weight", {q_dim, C});
    if (gpt2) add(p + "attn.q.bias", {q_dim});
    add(p + "attn.k.weight", {kv_dim, C});
    if (gpt2) add(p + "attn.k.bias", {kv_dim});
    add(p + "attn.v.weight", {kv_dim, C});
    if (gpt2) add(p + "attn.v.bias", {kv_dim});
    add(p + "attn.o.weight", {C, q_dim});
    if (gpt2) add(p + "attn.o.bias", {C});
    add(p + "ln2.weight", {C});
    if (gpt2) add(p + "ln2.bias", {C});
    if (gpt2) {
      add(p + "mlp.fc.weight", {F, C});
      add(p + "mlp.fc.bias", {F});
      add(p + "mlp.proj.weight", {C, F});
      add(p + "mlp.proj.bias", {C});
    } else {
      add(p + "mlp.gate.weight", {F, C});
      add(p + "mlp.up.weight", {F, C});
      add(p + "mlp.down.weight", {C, F});
    }
  }
  add("lnf.weight", {C});
  if (gpt2) add("lnf.bias", {C});
  if (!c.tied()) add("lm_head.weight", {c.padded_vocab, C});
  num_param_floats_ = (num_param_floats_ + 15) / 16 * 16;
}

const ParamInfo* Transformer::find_param(std::string_view name) const {
  for (const auto& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

Transformer::LayerParams Transformer::layer_params(int layer, float* base) const {
  const std::string p = "layers." + std::to_string(layer) + ".";
  auto at = [&](const char* suffix) -> float* {
    const ParamInfo* info = find_param(p + suffix);
    return info ? base + info->offset : nullptr;
  };
  const bool gpt2 = config_.is_gpt2();
  LayerParams lp{};
  lp.ln1_w = at("ln1.weight");
  lp.ln1_b = at("ln1.bias");
  lp.q_w = at("attn.q.weight");
  lp.q_b = at("attn.q.bias");
  lp.k_w = at("attn.k.weight");
  lp.k_b = at("attn.k.bias");
  lp.v_w = at("attn.v.weight");
  lp.v_b = at("attn.v.bias");
  lp.o_w = at("attn.o.weight");
  lp.o_b = at("attn.o.bias");
  lp.ln2_w = at("ln2.weight");
  lp.ln2_b = at("ln2.bias");
  lp.fc_w = at(gpt2 ? "mlp.fc.weight" : "mlp.gate.weight");
  lp.fc_b = at("mlp.fc.bias");
  lp.up_w = at("mlp.up.weight");
  lp.proj_w = at(gpt2 ? "mlp.proj.weight" : "mlp.down.weight");
  lp.proj_b = at("mlp.proj.bias");
  return lp;
}

void Transformer::plan_activations() {
  const auto& c = config_;
  const size_t N = static_cast<size_t>(micro_batch_size_) * c.seq_len;
  const size_t C = c.d_model, F = c.d_ff, q_dim = c.n_heads * c.head_dim,
               kv_dim = c.n_kv_heads * c.head_dim;
  const size_t att = static_cast<size_t>(micro_batch_size_) * c.n_heads * c.seq_len * c.seq_len;
  const bool llama = !c.is_gpt2();
  // Residual stream x_0..x_L first, then each layer's slots, then the globals.
  act_offsets_.clear();
  auto reserve = [&](size_t floats) {
    act_offsets_.push_back(floats ? act_arena_.reserve(floats * sizeof(float)) : kAbsent);
  };
  for (int l = 0; l <= c.n_layers; ++l) reserve(N * C);
  for (int l = 0; l < c.n_layers; ++l) {
    const size_t sizes[kLayerSlots] = {N * C, N, N, N * q_dim, N * kv_dim, N * kv_dim, att,
                                       N * q_dim, N * C, N * C, N, N, N * F,
                                       llama ? N * F : 0, N * F};
    for (size_t s : sizes) reserve(s);
  }
  const size_t gsizes[kGlobalSlots] = {N, N, N * C, N, N, N * c.padded_vocab, N,
                                       N * C, N * C, N * q_dim, N * kv_dim, N * kv_dim,
                                       N * q_dim, N * F, llama ? N * F : 0, N * F};
  for (size_t s : gsizes) reserve(s);
}

namespace {
inline size_t global_slot_index(int n_layers, int slot) {
  return static_cast<size_t>(n_layers + 1) + static_cast<size_t>(n_layers) * kLayerSlots + slot;
}
}  // namespace

#define TRIDENT_ACT(index, type) \
  (act_offsets_[index] == kAbsent ? nullptr : act_arena_.at<type>(act_offsets_[index]))

Transformer::LayerActs Transformer::layer_acts(int layer) const {
  const size_t base = static_cast<size_t>(config_.n_layers + 1) +
                      static_cast<size_t>(layer) * kLayerSlots;
  auto slot = [&](int s) { return TRIDENT_ACT(base + s, float); };
  return LayerActs{slot(kLn1),  slot(kLn1Mean), slot(kLn1Rstd), slot(kQ),       slot(kK),
                   slot(kV),    slot(kAtt),     slot(kAtty),    slot(kRes2),    slot(kLn2),
                   slot(kLn2Mean), slot(kLn2Rstd), slot(kH1),   slot(kH2),      slot(kHAct)};
}

void Transformer::init_weights(uint64_t seed) {
  const auto& c = config_;
  std::vector<float> host;
  const float residual_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.n_layers));
  for (const auto& p : params_) {
    host.assign(static_cast<size_t>(p.numel()), 0.0f);
    const std::string_view name = p.name;
    if (ends_with(name, ".bias")) {
      // zeros
    } else if (name == "lnf.weight" || ends_with(name, "ln1.weight") ||
               ends_with(name, "ln2.weight")) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      const bool residual = ends_with(name, "attn.o.weight") ||
                            ends_with(name, "mlp.proj.weight") ||
                            ends_with(name, "mlp.down.weight");
      const float std = residual ? residual_std : c.init_std;
      const uint64_t key = rng_key(seed, hash_name(p.name));
      // Padded vocabulary rows stay zero: they never receive a gradient either.
      const bool vocab_rows = name == "wte" || name == "lm_head.weight";
      const int64_t live = vocab_rows ? static_cast<int64_t>(c.vocab_size) * p.shape[1]
                                      : p.numel();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < live; ++i) {
        host[static_cast<size_t>(i)] = std * normal_at(key, static_cast<uint64_t>(i));
      }
    }
    set_param(p, host.data());
  }
  zero_grads();
}

void Transformer::set_param(const ParamInfo& param, const float* host) {
  ops_.upload(param_data() + param.offset, host, static_cast<size_t>(param.numel()) * sizeof(float));
}

void Transformer::get_param(const ParamInfo& param, float* host) const {
  ops_.download(host, param_buffer_.as<float>() + param.offset,
                static_cast<size_t>(param.numel()) * sizeof(float));
}

std::vector<float> Transformer::params_to_host() const {
  std::vector<float> host(num_param_floats_);
  ops_.download(host.data(), param_buffer_.get(), num_param_floats_ * sizeof(float));
  return host;
}

std::vector<float> Transformer::grads_to_host() const {
  std::vector<float> host(num_param_floats_);
  ops_.download(host.data(), grad_buffer_.get(), num_param_floats_ * sizeof(float));
  return host;
}

void Transformer::params_from_host(const std::vector<float>& host) {
  TRIDENT_CHECK(host.size() == num_param_floats_);
  ops_.upload(param_buffer_.get(), host.data(), num_param_floats_ * sizeof(float));
}

void Transformer::zero_grads() { ops_.zero(grad_buffer_.get(), num_param_floats_ * sizeof(float)); }

std::vector<float> Transformer::logits_to_host() const {
  const size_t n = static_cast<size_t>(last_B_) * last_T_ * config_.padded_vocab;
  std::vector<float> host(n);
  const float* logits = TRIDENT_ACT(global_slot_index(config_.n_layers, kLogits), float);
  ops_.download(host.data(), logits, n * sizeof(float));
  return host;
}

void Transformer::layer_forward(int layer, const float* x_in, float* x_out, int B, int T) {
  const auto& c = config_;
  const LayerParams p = layer_params(layer, param_data());
  const LayerActs a = layer_acts(layer);
  const int N = B * T, C = c.d_model, F = c.d_ff, HD = c.head_dim;
  const int q_dim = c.n_heads * HD, kv_dim = c.n_kv_heads * HD;
  const bool gpt2 = c.is_gpt2();

  if (gpt2) {
    ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, N, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(a.ln1, a.ln1_rstd, x_in, p.ln1_w, N, C, c.norm_eps);
  }
  ops_.matmul_forward(a.q, a.ln1, p.q_w, p.q_b, N, C, q_dim);
  ops_.matmul_forward(a.k, a.ln1, p.k_w, p.k_b, N, C, kv_dim);
  ops_.matmul_forward(a.v, a.ln1, p.v_w, p.v_b, N, C, kv_dim);
  if (!gpt2) {
    ops_.rope_forward(a.q, B, T, c.n_heads, HD, c.rope_theta, 0);
    ops_.rope_forward(a.k, B, T, c.n_kv_heads, HD, c.rope_theta, 0);
  }
  ops_.attention_forward(a.atty, a.att, a.q, a.k, a.v, B, T, c.n_heads, c.n_kv_heads, HD);
  // res2 = x_in + attn.o(atty)
  ops_.matmul_forward(a.res2, a.atty, p.o_w, p.o_b, N, q_dim, C);
  ops_.add(a.res2, a.res2, x_in, static_cast<size_t>(N) * C);

  if (gpt2) {
    ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C,
                           c.norm_eps);
    ops_.matmul_forward(a.h1, a.ln2, p.fc_w, p.fc_b, N, C, F);
    ops_.gelu_forward(a.h_act, a.h1, static_cast<size_t>(N) * F);
  } else {
    ops_.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, p.ln2_w, N, C, c.norm_eps);
    ops_.matmul_forward(a.h1, a.ln2, p.fc_w, nullptr, N, C, F);
    ops_.matmul_forward(a.h2, a.ln2, p.up_w, nullptr, N, C, F);
    ops_.swiglu_forward(a.h_act, a.h1, a.h2, static_cast<size_t>(N) * F);
  }
  ops_.matmul_forward(x_out, a.h_act, p.proj_w, p.proj_b, N, F, C);
  ops_.add(x_out, x_out, a.res2, static_cast<size_t>(N) * C);
}

float Transformer::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(B >= 1 && B <= micro_batch_size_ && T >= 1 && T <= c.seq_len,
                    "B=" + std::to_string(B) + " T=" + std::to_string(T));
  const int L = c.n_layers, N = B * T, C = c.d_model, Vp = c.padded_vocab;
  auto global = [&](int slot) { return global_slot_index(L, slot); };
  int32_t* d_tokens = TRIDENT_ACT(global(kTokens), int32_t);
  int32_t* d_targets = TRIDENT_ACT(global(kTargets), int32_t);
  ops_.upload(d_tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
  if (targets) ops_.upload(d_targets, targets, static_cast<size_t>(N) * sizeof(int32_t));

  const float* wte = param_data() + find_param("wte")->offset;
  const ParamInfo* wpe = find_param("wpe");
  float* x0 = TRIDENT_ACT(0, float);
  ops_.embedding_forward(x0, d_tokens, wte, wpe ? param_data() + wpe->offset : nullptr, B, T, C,
                         0, Vp);
  for (int l = 0; l < L; ++l) {
    layer_forward(l, TRIDENT_ACT(l, float), TRIDENT_ACT(l + 1, float), B, T);
  }
  float* lnf = TRIDENT_ACT(global(kLnf), float);
  float* lnf_mean = TRIDENT_ACT(global(kLnfMean), float);
  float* lnf_rstd = TRIDENT_ACT(global(kLnfRstd), float);
  const float* lnf_w = param_data() + find_param("lnf.weight")->offset;
  const float* xL = TRIDENT_ACT(L, float);
  if (c.is_gpt2()) {
    const float* lnf_b = param_data() + find_param("lnf.bias")->offset;
    ops_.layernorm_forward(lnf, lnf_mean, lnf_rstd, xL, lnf_w, lnf_b, N, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(lnf, lnf_rstd, xL, lnf_w, N, C, c.norm_eps);
  }
  const float* head = param_data() + find_param(c.tied() ? "wte" : "lm_head.weight")->offset;
  float* logits = TRIDENT_ACT(global(kLogits), float);
  ops_.matmul_forward(logits, lnf, head, nullptr, N, C, Vp);

  last_B_ = B;
  last_T_ = T;
  last_had_targets_ = targets != nullptr;
  if (!targets) return 0.0f;
  float* losses = TRIDENT_ACT(global(kLosses), float);
  ops_.cross_entropy_forward(losses, logits, d_targets, N, c.vocab_size, Vp);
  std::vector<float> host(static_cast<size_t>(N));
  ops_.download(host.data(), losses, host.size() * sizeof(float));
  double sum = 0.0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / N);
}

void Transformer::layer_backward(int layer, const float* x_in, float* dx, int B, int T) {
  // On entry dx = dLoss/dx_out; on exit dx = dLoss/dx_in. Residual branches accumulate
  // straight into dx, since every backward op accumulates.
  const auto& c = config_;
  const LayerParams p = layer_params(layer, param_data());
  const LayerParams g = layer_params(layer, grad_data());
  const LayerActs a = layer_acts(layer);
  const int L = c.n_layers, N = B * T, C = c.d_model, F = c.d_ff, HD = c.head_dim;
  const int q_dim = c.n_heads * HD, kv_dim = c.n_kv_heads * HD;
  const size_t nF = static_cast<size_t>(N) * F, nC = static_cast<size_t>(N) * C;
  const bool gpt2 = c.is_gpt2();
  auto scratch = [&](int slot) { return TRIDENT_ACT(global_slot_index(L, slot), float); };
  float* dln = scratch(kDln);
  float* dq = scratch(kDq);
  float* dk = scratch(kDk);
  float* dv = scratch(kDv);
  float* datty = scratch(kDatty);
  float* dh1 = scratch(kDh1);
  float* dh2 = scratch(kDh2);
  float* dh_act = scratch(kDhAct);

  // MLP: x_out = res2 + proj(act(ln2(res2)))
  ops_.zero(dh_act, nF * sizeof(float));
  ops_.matmul_backward(dh_act, g.proj_w, g.proj_b, dx, a.h_act, p.proj_w, N, F, C);
  ops_.zero(dh1, nF * sizeof(float));
  ops_.zero(dln, nC * sizeof(float));
  if (gpt2) {
    ops_.gelu_backward(dh1, dh_act, a.h1, nF);
    ops_.matmul_backward(dln, g.fc_w, g.fc_b, dh1, a.ln2, p.fc_w, N, C, F);
    ops_.layernorm_backward(dx, g.ln2_w, g.ln2_b, dln, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                            N, C);
  } else {
    ops_.zero(dh2, nF * sizeof(float));
    ops_.swiglu_backward(dh1, dh2, dh_act, a.h1, a.h2, nF);
    ops_.matmul_backward(dln, g.fc_w, nullptr, dh1, a.ln2, p.fc_w, N, C, F);
    ops_.matmul_backward(dln, g.up_w, nullptr, dh2, a.ln2, p.up_w, N, C, F);
    ops_.rmsnorm_backward(dx, g.ln2_w, dln, a.res2, p.ln2_w, a.ln2_rstd, N, C);
  }

  // Attention: res2 = x_in + o(attn(q, k, v)), q/k/v = linear(ln1(x_in))
  const size_t nq = static_cast<size_t>(N) * q_dim, nkv = static_cast<size_t>(N) * kv_dim;
  ops_.zero(datty, nq * sizeof(float));
  ops_.matmul_backward(datty, g.o_w, g.o_b, dx, a.atty, p.o_w, N, q_dim, C);
  ops_.zero(dq, nq * sizeof(float));
  ops_.zero(dk, nkv * sizeof(float));
  ops_.zero(dv, nkv * sizeof(float));
  ops_.attention_backward(dq, dk, dv, datty, a.q, a.k, a.v, a.att, B, T, c.n_heads, c.n_kv_heads,
                          HD);
  if (!gpt2) {
    ops_.rope_backward(dq, B, T, c.n_heads, HD, c.rope_theta, 0);
    ops_.rope_backward(dk, B, T, c.n_kv_heads, HD, c.rope_theta, 0);
  }
  ops_.zero(dln, nC * sizeof(float));
  ops_.matmul_backward(dln, g.q_w, g.q_b, dq, a.ln1, p.q_w, N, C, q_dim);
  ops_.matmul_backward(dln, g.k_w, g.k_b, dk, a.ln1, p.k_w, N, C, kv_dim);
  ops_.matmul_backward(dln, g.v_w, g.v_b, dv, a.ln1, p.v_w, N, C, kv_dim);
  if (gpt2) {
    ops_.layernorm_backward(dx, g.ln1_w, g.ln1_b, dln, x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd, N,
                            C);
  } else {
    ops_.rmsnorm_backward(dx, g.ln1_w, dln, x_in, p.ln1_w, a.ln1_rstd, N, C);
  }
}

void Transformer::backward(float loss_scale) {
  TRIDENT_CHECK_MSG(last_had_targets_, "backward() needs a forward() with targets");
  const auto& c = config_;
  const int L = c.n_layers, B = last_B_, T = last_T_, N = B * T, C = c.d_model,
            Vp = c.padded_vocab;
  auto global = [&](int slot) { return global_slot_index(L, slot); };
  float* logits = TRIDENT_ACT(global(kLogits), float);
  const int32_t* d_targets = TRIDENT_ACT(global(kTargets), int32_t);
  const int32_t* d_tokens = TRIDENT_ACT(global(kTokens), int32_t);
  float* dx = TRIDENT_ACT(global(kDx), float);
  float* dln = TRIDENT_ACT(global(kDln), float);
  const size_t nC = static_cast<size_t>(N) * C;

  // Head: logits = lnf @ head^T; dlogits overwrite the logits in place.
  ops_.cross_entropy_backward(logits, logits, d_targets, loss_scale / static_cast<float>(N), N,
                              c.vocab_size, Vp);
  const char* head_name = c.tied() ? "wte" : "lm_head.weight";
  const size_t head_offset = find_param(head_name)->offset;
  ops_.zero(dln, nC * sizeof(float));
  ops_.matmul_backward(dln, grad_data() + head_offset, nullptr, logits,
                       TRIDENT_ACT(global(kLnf), float), param_data() + head_offset, N, C, Vp);
  ops_.zero(dx, nC * sizeof(float));
  const size_t lnf_w = find_param("lnf.weight")->offset;
  const float* xL = TRIDENT_ACT(L, float);
  if (c.is_gpt2()) {
    const size_t lnf_b = find_param("lnf.bias")->offset;
    ops_.layernorm_backward(dx, grad_data() + lnf_w, grad_data() + lnf_b, dln, xL,
                            param_data() + lnf_w, TRIDENT_ACT(global(kLnfMean), float),
                            TRIDENT_ACT(global(kLnfRstd), float), N, C);
  } else {
    ops_.rmsnorm_backward(dx, grad_data() + lnf_w, dln, xL, param_data() + lnf_w,
                          TRIDENT_ACT(global(kLnfRstd), float), N, C);
  }
  for (int l = L - 1; l >= 0; --l) layer_backward(l, TRIDENT_ACT(l, float), dx, B, T);

  const ParamInfo* wpe = find_param("wpe");
  ops_.embedding_backward(grad_data() + find_param("wte")->offset,
                          wpe ? grad_data() + wpe->offset : nullptr, dx, d_tokens, B, T, C, 0,
                          Vp);
  last_had_targets_ = false;  // the logits now hold gradients
}

#undef TRIDENT_ACT

}  // namespace trident
