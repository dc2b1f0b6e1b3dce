#include "model/kv_cache_decoder.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/transformer.h"

namespace trident {

namespace {

DeviceBuffer floats(Ops& ops, size_t n) { return DeviceBuffer(ops, std::max<size_t>(n, 1) * sizeof(float)); }

}  // namespace

KvCacheDecoder::KvCacheDecoder(const TransformerConfig& config, Ops& ops)
    : config_(config), ops_(ops) {
  TRIDENT_CHECK_MSG(config_.head_dim > 0, "TransformerConfig must be finalize()d");
  layout_ = describe_params(config_, ModelPartition{});
  weights_ = floats(ops_, layout_.total_floats());
  max_positions_ = config_.max_seq_len;
  const int C = config_.d_model, F = config_.d_ff, HD = config_.head_dim;
  q_dim_ = config_.n_heads * HD;
  kv_dim_ = config_.n_kv_heads * HD;
  token_ = DeviceBuffer(ops_, sizeof(int32_t));
  x_ = floats(ops_, C);
  ln_ = floats(ops_, C);
  mean_ = floats(ops_, 1);
  rstd_ = floats(ops_, 1);
  q_ = floats(ops_, q_dim_);
  k_ = floats(ops_, kv_dim_);
  v_ = floats(ops_, kv_dim_);
  atty_ = floats(ops_, q_dim_);
  res2_ = floats(ops_, C);
  h1_ = floats(ops_, F);
  h2_ = floats(ops_, F);
  h_act_ = floats(ops_, F);
  logits_ = floats(ops_, config_.padded_vocab);
  const size_t cache = static_cast<size_t>(config_.n_layers) * max_positions_ * kv_dim_;
  k_cache_.assign(cache, 0.0f);
  v_cache_.assign(cache, 0.0f);
  q_host_.assign(static_cast<size_t>(q_dim_), 0.0f);
  atty_host_.assign(static_cast<size_t>(q_dim_), 0.0f);
  logits_host_.assign(static_cast<size_t>(config_.padded_vocab), 0.0f);
  scores_.assign(static_cast<size_t>(max_positions_), 0.0);
}

Status KvCacheDecoder::set_param(const std::string& name, const float* host, size_t count) {
  const ParamInfo* p = layout_.find(name);
  if (p == nullptr) return Status::invalid_input("parameter '" + name + "' is not in the model");
  if (static_cast<int64_t>(count) != p->numel()) {
    return Status::invalid_input("parameter '" + name + "': " + std::to_string(count) +
                                 " values for " + std::to_string(p->numel()) + " elements");
  }
  ops_.upload(weights_.as(DType::kF32) + p->offset, host, count * sizeof(float));
  return Status::ok();
}

DevPtr KvCacheDecoder::param(const std::string& name) const {
  const ParamInfo* p = layout_.find(name);
  TRIDENT_CHECK_MSG(p != nullptr, "no parameter " + name);
  return weights_.as(DType::kF32) + p->offset;
}

void KvCacheDecoder::attend(int layer, int pos) {
  const int NH = config_.n_heads, NKV = config_.n_kv_heads, HD = config_.head_dim;
  const int group = NH / NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  const float* keys = k_cache_.data() + static_cast<size_t>(layer) * max_positions_ * kv_dim_;
  const float* values = v_cache_.data() + static_cast<size_t>(layer) * max_positions_ * kv_dim_;
  for (int h = 0; h < NH; ++h) {
    const int kvh = h / group;
    const float* q = q_host_.data() + static_cast<size_t>(h) * HD;
    double max_score = -HUGE_VAL;
    for (int j = 0; j <= pos; ++j) {
      const float* k = keys + static_cast<size_t>(j) * kv_dim_ + kvh * HD;
      double s = 0.0;
      for (int d = 0; d < HD; ++d) s += static_cast<double>(q[d]) * k[d];
      scores_[static_cast<size_t>(j)] = s * scale;
      max_score = std::max(max_score, s * scale);
    }
    double total = 0.0;
    for (int j = 0; j <= pos; ++j) {
      double& s = scores_[static_cast<size_t>(j)];
      s = std::exp(s - max_score);
      total += s;
    }
    float* out = atty_host_.data() + static_cast<size_t>(h) * HD;
    for (int d = 0; d < HD; ++d) {
      double acc = 0.0;
      for (int j = 0; j <= pos; ++j) {
        acc += scores_[static_cast<size_t>(j)] * values[static_cast<size_t>(j) * kv_dim_ + kvh * HD + d];
      }
      out[d] = static_cast<float>(acc / total);
    }
  }
}

const std::vector<float>& KvCacheDecoder::step(int32_t token) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(position_ < max_positions_,
                    "KV cache full: " + std::to_string(max_positions_) + " positions");
  TRIDENT_CHECK_MSG(token >= 0 && token < c.vocab_size, "token " + std::to_string(token));
  const int pos = position_;
  const int C = c.d_model, F = c.d_ff, HD = c.head_dim;
  const Architecture& arch = c.family();
  DevPtr x = x_.as(DType::kF32);
  DevPtr ln = ln_.as(DType::kF32);
  DevPtr q = q_.as(DType::kF32);
  DevPtr k = k_.as(DType::kF32);
  DevPtr v = v_.as(DType::kF32);
  DevPtr res2 = res2_.as(DType::kF32);
  ops_.upload(token_.get(), &token, sizeof(int32_t));
  // One row of position pos: the kernel adds wpe[n % T] with T = 1, so pass row pos.
  DevPtr wpe = arch.learned_positions() ? param("wpe") + static_cast<size_t>(pos) * C : DevPtr();
  ops_.embedding_forward(x, token_.as(DType::kI32), param("wte"), wpe, 1, 1, C, 0, c.padded_vocab);

  auto norm = [&](DevPtr out, DevPtr in, const std::string& prefix) {
    if (arch.layer_norm()) {
      ops_.layernorm_forward(out, mean_.as(DType::kF32), rstd_.as(DType::kF32), in,
                             param(prefix + ".weight"), param(prefix + ".bias"), 1, C, c.norm_eps);
    } else {
      ops_.rmsnorm_forward(out, rstd_.as(DType::kF32), in, param(prefix + ".weight"), 1, C,
                           c.norm_eps);
    }
  };
  auto bias = [&](const std::string& name) { return arch.biases ? param(name) : DevPtr(); };

  const size_t kv_bytes = static_cast<size_t>(kv_dim_) * sizeof(float);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    norm(ln, x, p + "ln1");
    ops_.matmul_forward(q, ln, param(p + "attn.q.weight"), bias(p + "attn.q.bias"), 1, C, q_dim_);
    ops_.matmul_forward(k, ln, param(p + "attn.k.weight"), bias(p + "attn.k.bias"), 1, C, kv_dim_);
    ops_.matmul_forward(v, ln, param(p + "attn.v.weight"), bias(p + "attn.v.bias"), 1, C, kv_dim_);
    if (arch.rope()) {
      ops_.rope_forward(q, 1, 1, c.n_heads, HD, c.rope_theta, pos);
      ops_.rope_forward(k, 1, 1, c.n_kv_heads, HD, c.rope_theta, pos);
    }
    const size_t row = (static_cast<size_t>(l) * max_positions_ + pos) * kv_dim_;
    ops_.download(k_cache_.data() + row, k, kv_bytes);
    ops_.download(v_cache_.data() + row, v, kv_bytes);
    ops_.download(q_host_.data(), q, q_host_.size() * sizeof(float));
    attend(l, pos);
    ops_.upload(atty_.get(), atty_host_.data(), atty_host_.size() * sizeof(float));
    ops_.matmul_forward(res2, atty_.as(DType::kF32), param(p + "attn.o.weight"),
                        bias(p + "attn.o.bias"), 1, q_dim_, C);
    ops_.add(res2, res2, x, static_cast<size_t>(C));
    norm(ln, res2, p + "ln2");
    DevPtr h_act = h_act_.as(DType::kF32);
    if (!arch.swiglu()) {
      ops_.matmul_forward(h1_.as(DType::kF32), ln, param(p + "mlp.fc.weight"),
                          bias(p + "mlp.fc.bias"), 1, C, F);
      ops_.gelu_forward(h_act, h1_.as(DType::kF32), static_cast<size_t>(F));
      ops_.matmul_forward(x, h_act, param(p + "mlp.proj.weight"), bias(p + "mlp.proj.bias"), 1,
                          F, C);
    } else {
      ops_.matmul_forward(h1_.as(DType::kF32), ln, param(p + "mlp.gate.weight"),
                          bias(p + "mlp.gate.bias"), 1, C, F);
      ops_.matmul_forward(h2_.as(DType::kF32), ln, param(p + "mlp.up.weight"), DevPtr(), 1, C, F);
      ops_.swiglu_forward(h_act, h1_.as(DType::kF32), h2_.as(DType::kF32), static_cast<size_t>(F));
      ops_.matmul_forward(x, h_act, param(p + "mlp.down.weight"), bias(p + "mlp.down.bias"), 1,
                          F, C);
    }
    ops_.add(x, x, res2, static_cast<size_t>(C));
  }
  norm(ln, x, "lnf");
  DevPtr head = c.tied() ? param("wte") : param("lm_head.weight");
  ops_.matmul_forward(logits_.as(DType::kF32), ln, head, DevPtr(), 1, C, c.padded_vocab);
  ops_.download(logits_host_.data(), logits_.get(), logits_host_.size() * sizeof(float));
  ++position_;
  return logits_host_;
}

}  // namespace trident
