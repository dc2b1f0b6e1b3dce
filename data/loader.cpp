#include "data/loader.h"

#include <cstring>
#include <vector>

namespace trident {

Result<DataLoader> DataLoader::open(const std::string& spec, int64_t vocab_size, uint64_t seed,
                                    bool shuffle) {
  TRIDENT_ASSIGN_OR_RETURN(TokenDataset dataset, TokenDataset::open(spec, vocab_size));
  return DataLoader(std::move(dataset), seed, shuffle);
}

Result<uint64_t> DataLoader::num_samples(int T) const {
  return num_samples_for(dataset_.num_tokens(), T, dataset_.spec());
}

Status DataLoader::load_sample(uint64_t index, int row, int T, int32_t* window,
                               int32_t* inputs, int32_t* targets) const {
  const size_t t = static_cast<size_t>(T);
  TRIDENT_RETURN_IF_ERROR(dataset_.read(index * t, t + 1, window));
  std::memcpy(inputs + static_cast<size_t>(row) * t, window, t * sizeof(int32_t));
  std::memcpy(targets + static_cast<size_t>(row) * t, window + 1, t * sizeof(int32_t));
  return Status::ok();
}

Status DataLoader::load(uint64_t first_counter, int count, int T, int32_t* inputs,
                        int32_t* targets) const {
  TRIDENT_ASSIGN_OR_RETURN(uint64_t n, num_samples(T));
  GlobalSampler sampler(n, seed_, shuffle_);
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);
  for (int i = 0; i < count; ++i) {
    const uint64_t index = sampler.sample_index(first_counter + static_cast<uint64_t>(i));
    TRIDENT_RETURN_IF_ERROR(load_sample(index, i, T, window.data(), inputs, targets));
  }
  return Status::ok();
}

Status DataLoader::load_sequential(uint64_t first_sample, int count, int T, int32_t* inputs,
                                   int32_t* targets) const {
  TRIDENT_ASSIGN_OR_RETURN(uint64_t n, num_samples(T));
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);
  for (int i = 0; i < count; ++i) {
    const uint64_t index = (first_sample + static_cast<uint64_t>(i)) % n;
    TRIDENT_RETURN_IF_ERROR(load_sample(index, i, T, window.data(), inputs, targets));
  }
  return Status::ok();
}

}  // namespace trident
