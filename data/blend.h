// A blend: one training stream mixed from several datasets by weight (config
// `data.train` as a list of {path, weight}; docs/DATA.md "Blends").
//
// Which dataset global counter c reads is the error-minimizing greedy of Megatron's
// BlendedDataset: counter c goes to the component whose count is furthest behind its
// target w_i·(c+1) (ties: the first listed). Computed in exact integer arithmetic on
// integer quotas q_i with w_i = q_i / D, D = sum q_i: the weights as written, when their
// shortest decimal forms are exact ratios with D <= kMaxBlendPeriod (0.7 and 0.3 give
// 7:3, D = 10); otherwise rounded to q_i = max(1, round(w_i / sum · 2^20)). The greedy
// with integer quotas is periodic with period D (after D counters every component holds
// exactly q_i, so the state is the one at 0), so one period is tabulated at start-up:
// 6 bytes per counter of the period, about 6 MiB at most — memory that does not grow with the
// length of the run. pick(c) is then O(1): component comp[c mod D], index within it
// (c div D)·q_comp + rank[c mod D].
//
// Guarantee: with n_i(c) the samples of component i among counters [0, c),
//   -1 < w_i·c - n_i(c) < k - 1   for all i and c (k components),
// and |w_i·c - n_i(c)| < 1 when k = 2; n_i(c) = q_i·c/D exactly at multiples of D.
// (Never more than one sample ahead of its share; with many components a small one can
// fall more than one behind for a while, as in Megatron's greedy.)
//
// The schedule depends only on the weights: not on the seed, the epoch or the layout.
// Each component reads its own index within itself through its own GlobalSampler
// (data/sampler.h: its epochs, its shuffle).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

// One entry of a blend: a dataset spec (data/dataset.h) and its weight (> 0; the
// weights of a blend are normalized by their sum).
struct BlendSource {
  std::string path;
  double weight = 1.0;
  bool operator==(const BlendSource&) const = default;
};

inline constexpr uint64_t kMaxBlendPeriod = uint64_t{1} << 20;
inline constexpr int kMaxBlendComponents = 65535;

// The integer quotas q_i of `weights` (see above); invalid_config naming the entry
// ("data.train[1].weight") for a weight that is not positive and finite.
Result<std::vector<uint64_t>> blend_quotas(const std::vector<double>& weights);

class BlendSchedule {
 public:
  // 1 <= quotas.size() <= kMaxBlendComponents, every quota >= 1, sum <= 2^21.
  explicit BlendSchedule(std::vector<uint64_t> quotas);
  static Result<BlendSchedule> from_weights(const std::vector<double>& weights);

  struct Pick {
    int component = 0;
    uint64_t index = 0;  // the component's own counter: samples of it before this one
    bool operator==(const Pick&) const = default;
  };
  Pick pick(uint64_t counter) const;

  int num_components() const { return static_cast<int>(quotas_.size()); }
  const std::vector<uint64_t>& quotas() const { return quotas_; }
  uint64_t period() const { return period_; }

 private:
  std::vector<uint64_t> quotas_;
  uint64_t period_ = 0;
  std::vector<uint16_t> component_;  // [period]
  std::vector<uint32_t> rank_;       // [period]: samples of that component earlier in the period
};

}  // namespace trident
