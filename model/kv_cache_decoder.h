// KvCacheDecoder: incremental (one token at a time) decoding of one sequence with a
// key/value cache, for both families of model/model_config.h, in one process.
//
// step(token) runs the model for the single new token at position p = position():
//   gpt2:  x = wte[token] + wpe[p]; per layer LayerNorm, q/k/v, attention, GELU MLP;
//   llama: x = wte[token]; per layer RMSNorm, q/k/v with RoPE at position p, grouped-query
//          attention, SwiGLU MLP;
// then the final norm and the head, and returns the next-token logits. The new token's
// keys and values are appended to the cache, so the attention of step p reads the K/V
// of positions 0..p without recomputing them. The result equals the last row of
// Transformer::forward over the whole prefix (tests/e2e/generate_test.cpp checks this
// within float rounding, token for token).
//
// The matrix products, norms, RoPE and activations go through the Ops kernels; the
// attention of one query over the cache is written out here (softmax in double) on
// host copies of q and the cache: it is O(p * d) per step, and Ops has no single-query
// attention. The parameters follow describe_params (model/model_description.h) for one partition (no tensor
// or pipeline parallelism), so names and shapes are the checkpoint's global ones.
//
// Threading: one decoder per thread of control (it uses one Ops object).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "parallel/param_store.h"

namespace trident {

class KvCacheDecoder {
 public:
  // `config` must be finalize()d; the cache holds config.max_seq_len positions (the
  // rows of wpe for gpt2, the training seq_len for llama). Parameters start at zero.
  KvCacheDecoder(const TransformerConfig& config, Ops& ops);
  KvCacheDecoder(const KvCacheDecoder&) = delete;
  KvCacheDecoder& operator=(const KvCacheDecoder&) = delete;

  const TransformerConfig& config() const { return config_; }
  // The parameter table (names and global shapes, model/transformer.h).
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  // Sets parameter `name` from `count` host floats of its global shape, row-major.
  // invalid_input naming the parameter when it is unknown or the count differs.
  Status set_param(const std::string& name, const float* host, size_t count);

  int position() const { return position_; }          // tokens fed since reset()
  int max_positions() const { return max_positions_; }
  // Empties the cache: the next step() is at position 0.
  void reset() { position_ = 0; }
  // Feeds `token` (0 <= token < vocab_size) at position() < max_positions() and returns
  // the logits of the next token, padded_vocab entries (the padded columns are the
  // head's zero rows' products; callers sample from the first vocab_size only).
  const std::vector<float>& step(int32_t token);

 private:
  DevPtr param(const std::string& name) const;  // f32 device memory
  void attend(int layer, int pos);  // atty = attention of q over cache positions 0..pos

  TransformerConfig config_;
  Ops& ops_;
  ParamLayout layout_;
  DeviceBuffer weights_;  // flat, describe_params offsets
  int max_positions_ = 0;
  int position_ = 0;
  int q_dim_ = 0, kv_dim_ = 0;
  // Per-step device scratch.
  DeviceBuffer token_, x_, ln_, mean_, rstd_, q_, k_, v_, atty_, res2_, h1_, h2_, h_act_,
      logits_;
  // Host copies: the cache [L][max_positions][kv_dim] for keys and values, this step's
  // queries and attention output, and the logits returned by step().
  std::vector<float> k_cache_, v_cache_, q_host_, atty_host_, logits_host_;
  std::vector<double> scores_;
};

}  // namespace trident
