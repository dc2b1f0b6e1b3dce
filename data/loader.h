// DataLoader: a TokenDataset, or a blend of several (data/blend.h), read in the global
// sample order of data/sampler.h.
//
// load(first_counter, count, T, ...) fills `count` samples for global counters
// [first_counter, first_counter + count): each sample's T inputs and T targets (the same
// window shifted by one token). A training rank passes the first counter of its
// micro-batch (micro_batch_range in data/sampler.h); what it gets depends only on
// (datasets, weights, seed, shuffle, T, counter), never on dp/tp/pp.
//
// A blend maps counter c to (component i, the component's own counter j) by its
// BlendSchedule, then reads sample sampler_i.sample_index(j) of component i, where
// sampler_i is a GlobalSampler over that component's samples with its own seed
// (derived from data.seed and i) and its own epochs. Resuming from a consumed-samples
// counter therefore resumes the blend too: nothing but the counter is state.
//
// load_sequential() is for validation: samples first_sample, first_sample + 1, ... in
// stream order from the start of the dataset, wrapping around when the dataset holds
// fewer samples than asked for. Eval batch b of size B reads first_sample = b * B. A
// blend has no stream order: load_sequential on one is invalid_config.
//
// Errors (invalid_input): a dataset (or blend component) too short for one sample of
// T + 1 tokens, an id outside the vocabulary (file, position, id, vocab). Move-only;
// load is const and safe from many threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/blend.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace trident {

class DataLoader {
 public:
  DataLoader(TokenDataset dataset, uint64_t seed, bool shuffle) : seed_(seed), shuffle_(shuffle) {
    datasets_.push_back(std::move(dataset));
  }

  // Opens `spec` (file, glob, directory or Megatron prefix; data/dataset.h).
  static Result<DataLoader> open(const std::string& spec, int64_t vocab_size, uint64_t seed,
                                 bool shuffle);
  // Opens every source of a blend (each a spec as above) with the schedule of their
  // weights. Errors name the entry: "data.train[1] (path): ...".
  static Result<DataLoader> open_blend(const std::vector<BlendSource>& sources,
                                       int64_t vocab_size, uint64_t seed, bool shuffle);

  // The (first) dataset.
  const TokenDataset& dataset() const { return datasets_.front(); }
  // Every dataset: one, or a blend's components in the order listed.
  const std::vector<TokenDataset>& datasets() const { return datasets_; }
  const std::optional<BlendSchedule>& blend() const { return blend_; }
  // Samples of T + 1 tokens in the dataset (one epoch); for a blend, the sum over its
  // components (each must hold at least one).
  Result<uint64_t> num_samples(int T) const;

  Status load(uint64_t first_counter, int count, int T, int32_t* inputs /*[count*T]*/,
              int32_t* targets /*[count*T]*/) const;
  Status load_sequential(uint64_t first_sample, int count, int T,
                         int32_t* inputs /*[count*T]*/, int32_t* targets /*[count*T]*/) const;

 private:
  DataLoader() = default;
  // Reads sample `index` (tokens [index*T, index*T + T]) of dataset `d` into row `row`.
  Status load_sample(const TokenDataset& d, uint64_t index, int row, int T,
                     int32_t* window /*[T+1]*/, int32_t* inputs, int32_t* targets) const;
  // The seed of blend component i's sampler.
  uint64_t component_seed(int i) const;

  std::vector<TokenDataset> datasets_;
  std::optional<BlendSchedule> blend_;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
};

}  // namespace trident
