// KvCacheDecoder: incremental decoding of one sequence with a key/value cache, for both
// families of model/model_config.h, in one process: a thin wrapper over the Transformer's
// cache mode (model/transformer.h "Cache mode"), so decoding runs the model's own layer
// code, not a second forward.
//
// feed(tokens) runs Transformer::forward_cached over the new tokens at positions
// position() .. position() + n - 1 (a prompt in one call: the prefill) and returns the
// logits after the last of them; step(token) feeds one. The keys and values of every fed
// position stay in the cache, so a step attends over them without recomputing them. The
// result equals the last row of Transformer::forward over the whole prefix within float
// rounding (tests/model/kv_cache_decoder_test.cpp, tests/e2e/generate_test.cpp token for
// token). The parameters follow describe_params (model/model_description.h) for one
// partition (no tensor or pipeline parallelism), so names and shapes are the checkpoint's
// global ones; they live in f32 in a store without gradients (inference only), and the
// model keeps no training activations (num_slots 0).
//
// Threading: one decoder per thread of control (it uses one Ops object).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "parallel/param_store.h"

namespace trident {

class KvCacheDecoder {
 public:
  // `config` must be finalize()d; the cache holds config.max_seq_len positions (the
  // rows of wpe for gpt2, the training seq_len for llama). Parameters start at zero.
  KvCacheDecoder(const TransformerConfig& config, Ops& ops);
  ~KvCacheDecoder();
  KvCacheDecoder(const KvCacheDecoder&) = delete;
  KvCacheDecoder& operator=(const KvCacheDecoder&) = delete;

  const TransformerConfig& config() const { return model_->config(); }
  // The parameter table (names and global shapes, model/transformer.h).
  const std::vector<ParamInfo>& params() const { return model_->params(); }
  // Sets parameter `name` from `count` host floats of its global shape, row-major.
  // invalid_input naming the parameter when it is unknown or the count differs.
  Status set_param(const std::string& name, const float* host, size_t count);

  int position() const { return cache_.position(); }  // tokens fed since reset()
  int max_positions() const { return cache_.capacity(); }
  // Empties the cache: the next token fed is at position 0.
  void reset() { cache_.reset(); }
  // Feeds `tokens` (non-empty, each 0 <= id < vocab_size; position() + size <=
  // max_positions(), else a CHECK failure "KV cache full") in one forward and returns the
  // logits of the next token, padded_vocab entries (the padded columns are the head's
  // zero rows' products; callers sample from the first vocab_size only).
  const std::vector<float>& feed(std::span<const int32_t> tokens);
  const std::vector<float>& step(int32_t token) { return feed({&token, 1}); }

 private:
  class WeightStore;  // the f32 parameters, no gradients

  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<Transformer> model_;
  KvCache cache_;
  std::vector<float> logits_;
};

}  // namespace trident
