#include "model/kv_cache_decoder.h"

#include <algorithm>

#include "core/check.h"

namespace trident {

// Every group resident in one f32 buffer at describe_params offsets; a forward-only model
// never asks for gradients.
class KvCacheDecoder::WeightStore final : public ParamStore {
 public:
  WeightStore(const TransformerConfig& config, Ops& ops)
      : ops_(ops),
        layout_(describe_params(config, ModelPartition{})),
        weights_(ops, std::max<size_t>(1, layout_.total_floats()) * sizeof(float)) {}
  void acquire(int, Phase) override {}
  void release(int, Phase) override {}
  DevPtr params(int group) override {
    return data() + layout_.groups[static_cast<size_t>(group)].offset;
  }
  DevPtr grads(int) override {
    TRIDENT_CHECK_MSG(false, "KvCacheDecoder: a forward-only model has no gradients");
    return DevPtr();
  }
  DType compute_dtype() const override { return DType::kF32; }
  const ParamLayout& layout() const { return layout_; }
  void set(const ParamInfo& p, const float* host) {
    ops_.upload_floats(data() + p.offset, host, static_cast<size_t>(p.numel()));
  }

 private:
  DevPtr data() const { return weights_.as(DType::kF32); }

  Ops& ops_;
  ParamLayout layout_;
  DeviceBuffer weights_;
};

KvCacheDecoder::KvCacheDecoder(const TransformerConfig& config, Ops& ops) {
  TRIDENT_CHECK_MSG(config.head_dim > 0, "TransformerConfig must be finalize()d");
  store_ = std::make_unique<WeightStore>(config, ops);
  model_ = std::make_unique<Transformer>(config, ops, ModelPartition{}, /*tp=*/nullptr,
                                         store_.get(), /*micro_batch_size=*/1, /*num_slots=*/0);
  // A prompt as long as the context is prefilled in one call.
  cache_ = model_->make_kv_cache(1, config.max_seq_len, config.max_seq_len);
}

KvCacheDecoder::~KvCacheDecoder() = default;

Status KvCacheDecoder::set_param(const std::string& name, const float* host, size_t count) {
  const ParamInfo* p = store_->layout().find(name);
  if (p == nullptr) return Status::invalid_input("parameter '" + name + "' is not in the model");
  if (static_cast<int64_t>(count) != p->numel()) {
    return Status::invalid_input("parameter '" + name + "': " + std::to_string(count) +
                                 " values for " + std::to_string(p->numel()) + " elements");
  }
  store_->set(*p, host);
  return Status::ok();
}

const std::vector<float>& KvCacheDecoder::feed(std::span<const int32_t> tokens) {
  const int vocab = model_->config().vocab_size;
  TRIDENT_CHECK_MSG(!tokens.empty(), "KvCacheDecoder::feed: no tokens");
  for (int32_t t : tokens) {
    TRIDENT_CHECK_MSG(t >= 0 && t < vocab, "token " + std::to_string(t) + " is not in [0, " +
                                               std::to_string(vocab) + ")");
  }
  model_->forward_cached(tokens.data(), 1, static_cast<int>(tokens.size()), cache_);
  logits_ = model_->cached_logits_to_host(cache_);
  return logits_;
}

}  // namespace trident
