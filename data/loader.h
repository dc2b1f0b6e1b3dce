// DataLoader: a TokenDataset read in the global sample order of data/sampler.h.
//
// load(first_counter, count, T, ...) fills `count` samples for global counters
// [first_counter, first_counter + count): each sample's T inputs and T targets (the same
// window shifted by one token). A training rank passes the first counter of its
// micro-batch (micro_batch_range in data/sampler.h); what it gets depends only on
// (dataset, seed, shuffle, T, counter), never on dp/tp/pp.
//
// load_sequential() is for validation: samples first_sample, first_sample + 1, ... in
// stream order from the start of the dataset, wrapping around when the dataset holds
// fewer samples than asked for. Eval batch b of size B reads first_sample = b * B.
//
// Errors (invalid_input): a dataset too short for one sample of T + 1 tokens, an id
// outside the vocabulary (file, position, id, vocab). Move-only; load is const and safe
// from many threads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "core/status.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace trident {

class DataLoader {
 public:
  DataLoader(TokenDataset dataset, uint64_t seed, bool shuffle)
      : dataset_(std::move(dataset)), seed_(seed), shuffle_(shuffle) {}

  // Opens `spec` (file, glob or directory; data/dataset.h).
  static Result<DataLoader> open(const std::string& spec, int64_t vocab_size, uint64_t seed,
                                 bool shuffle);

  const TokenDataset& dataset() const { return dataset_; }
  // Samples of T + 1 tokens in the dataset (one epoch).
  Result<uint64_t> num_samples(int T) const;

  Status load(uint64_t first_counter, int count, int T, int32_t* inputs /*[count*T]*/,
              int32_t* targets /*[count*T]*/) const;
  Status load_sequential(uint64_t first_sample, int count, int T,
                         int32_t* inputs /*[count*T]*/, int32_t* targets /*[count*T]*/) const;

 private:
  // Reads sample `index` (tokens [index*T, index*T + T]) into row `row` of the outputs.
  Status load_sample(uint64_t index, int row, int T, int32_t* window /*[T+1]*/,
                     int32_t* inputs, int32_t* targets) const;

  TokenDataset dataset_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace trident
