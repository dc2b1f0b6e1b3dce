#include "data/loader.h"

#include <cstring>
#include <vector>

#include "core/rng.h"

namespace trident {

Result<DataLoader> DataLoader::open(const std::string& spec, int64_t vocab_size, uint64_t seed,
                                    bool shuffle) {
  TRIDENT_ASSIGN_OR_RETURN(TokenDataset dataset, TokenDataset::open(spec, vocab_size));
  return DataLoader(std::move(dataset), seed, shuffle);
}

Result<DataLoader> DataLoader::open_blend(const std::vector<BlendSource>& sources,
                                          int64_t vocab_size, uint64_t seed, bool shuffle) {
  std::vector<double> weights;
  for (const BlendSource& s : sources) weights.push_back(s.weight);
  TRIDENT_ASSIGN_OR_RETURN(BlendSchedule schedule, BlendSchedule::from_weights(weights));
  DataLoader loader;
  loader.seed_ = seed;
  loader.shuffle_ = shuffle;
  for (size_t i = 0; i < sources.size(); ++i) {
    auto dataset = TokenDataset::open(sources[i].path, vocab_size);
    if (!dataset.is_ok()) {
      return Status(dataset.status().code(), "data.train[" + std::to_string(i) + "] (" +
                                                 sources[i].path + "): " +
                                                 dataset.status().message());
    }
    loader.datasets_.push_back(std::move(dataset).value());
  }
  loader.blend_.emplace(std::move(schedule));
  return loader;
}

uint64_t DataLoader::component_seed(int i) const {
  return rng_key(seed_, hash_name("trident.data.blend") + static_cast<uint64_t>(i));
}

Result<uint64_t> DataLoader::num_samples(int T) const {
  if (!blend_) return num_samples_for(datasets_[0].num_tokens(), T, datasets_[0].spec());
  uint64_t total = 0;
  for (size_t i = 0; i < datasets_.size(); ++i) {
    auto n = num_samples_for(datasets_[i].num_tokens(), T, datasets_[i].spec());
    if (!n.is_ok()) {
      return Status(n.status().code(), "data.train[" + std::to_string(i) + "] " + n.status().message());
    }
    total += n.value();
  }
  return total;
}

Status DataLoader::load_sample(const TokenDataset& d, uint64_t index, int row, int T,
                               int32_t* window, int32_t* inputs, int32_t* targets) const {
  const size_t t = static_cast<size_t>(T);
  TRIDENT_RETURN_IF_ERROR(d.read(index * t, t + 1, window));
  std::memcpy(inputs + static_cast<size_t>(row) * t, window, t * sizeof(int32_t));
  std::memcpy(targets + static_cast<size_t>(row) * t, window + 1, t * sizeof(int32_t));
  return Status::ok();
}

Status DataLoader::load(uint64_t first_counter, int count, int T, int32_t* inputs,
                        int32_t* targets) const {
  TRIDENT_RETURN_IF_ERROR(num_samples(T).status());
  // One sampler per dataset; a GlobalSampler is a few words, built per call.
  std::vector<GlobalSampler> samplers;
  for (size_t i = 0; i < datasets_.size(); ++i) {
    const uint64_t n = num_samples_for(datasets_[i].num_tokens(), T, datasets_[i].spec()).value();
    samplers.emplace_back(n, blend_ ? component_seed(static_cast<int>(i)) : seed_, shuffle_);
  }
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);
  for (int i = 0; i < count; ++i) {
    const uint64_t counter = first_counter + static_cast<uint64_t>(i);
    BlendSchedule::Pick pick{0, counter};
    if (blend_) pick = blend_->pick(counter);
    const size_t c = static_cast<size_t>(pick.component);
    const uint64_t index = samplers[c].sample_index(pick.index);
    TRIDENT_RETURN_IF_ERROR(load_sample(datasets_[c], index, i, T, window.data(), inputs, targets));
  }
  return Status::ok();
}

Status DataLoader::load_sequential(uint64_t first_sample, int count, int T, int32_t* inputs,
                                   int32_t* targets) const {
  if (blend_) return Status::invalid_config("a blend has no sequential order (validation data must be one spec)");
  TRIDENT_ASSIGN_OR_RETURN(uint64_t n, num_samples(T));
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);
  for (int i = 0; i < count; ++i) {
    const uint64_t index = (first_sample + static_cast<uint64_t>(i)) % n;
    TRIDENT_RETURN_IF_ERROR(
        load_sample(datasets_[0], index, i, T, window.data(), inputs, targets));
  }
  return Status::ok();
}

}  // namespace trident
