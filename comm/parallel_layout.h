// The parallel layout: one degree per parallel dimension, and the one generic rank
// generator that places world ranks on the grid those degrees span (Megatron-Core's
// RankGenerator over its order string).
//
// Dimensions, innermost first (the rank order; kRankOrder): tp, cp, ep, dp, pp.
//   tp innermost (a tensor-parallel group sits inside one machine), cp next (context
//   parallelism's ring also moves activations every layer), ep between cp and dp (as in
//   Megatron-Core's "tp-cp-ep-dp-pp"), then dp, and pp outermost (its point-to-point
//   sends are the cheapest traffic to put across nodes). With cp = ep = 1 this is the
//   order tp, dp, pp: rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
// Expert parallelism folds into dp (as Megatron-Core and torchtitan do): ep does not
// multiply the world (world_size() is dp * cp * tp * pp) and must divide dp. The world's
// generator runs with ep's degree taken as 1 (world_generator_layout); the expert layers'
// groups come from a second generator over the same world (expert_generator_layout), whose
// degrees are tp, cp, ep, dp / ep ("expert data parallel", edp), pp in the same order,
// so a rank's dp coordinate splits as dp_rank = edp_rank * ep + ep_rank: the ep ranks of
// an ep group are adjacent dp ranks, and the edp group is the dp ranks holding the same
// experts (Megatron-Core's expert RankGenerator, ep inside edp).
//
// A new dimension is: an enum value, its degree field in ParallelLayout and coordinate
// field in RankCoords, one row of kDimensions, and the code that uses its group.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace trident {

enum class ParallelDim { kTp, kCp, kEp, kDp, kPp };
inline constexpr int kNumParallelDims = 5;

inline constexpr int dim_index(ParallelDim d) { return static_cast<int>(d); }

// One value per dimension, indexed by ParallelDim.
template <typename T>
struct PerDim {
  std::array<T, kNumParallelDims> values{};
  T& operator[](ParallelDim d) { return values[static_cast<std::size_t>(dim_index(d))]; }
  const T& operator[](ParallelDim d) const {
    return values[static_cast<std::size_t>(dim_index(d))];
  }
  bool operator==(const PerDim&) const = default;
};

// The degrees and the layout-wide choices every layer of the stack reads. Config keys:
// parallel.dp, .cp, .tp, .pp, .ep, .virtual_stages, .zero_stage, .sequence_parallel.
struct ParallelLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int cp = 1;  // context parallelism (parallel/context_parallel.h)
  int ep = 1;  // expert parallelism: divides dp, not a factor of the world (see above)
  // Interleaved 1F1B: model chunks per pipeline rank (1 = the plain schedules).
  int virtual_stages = 1;
  int zero_stage = 0;  // 0..3
  // Megatron sequence parallelism (tp > 1): norms, residuals and the pipeline boundary on
  // sequence shards of each tp rank; all-gather / reduce-scatter replace the all-reduces.
  bool sequence_parallel = false;

  int degree(ParallelDim d) const;
  int world_size() const;  // the product of every degree but ep's (ep folds into dp)
  // The same product in 64 bits, saturated at INT64_MAX: for degrees (each >= 1) not yet
  // known to fit an int's world (config/config.cpp's size check, trident plan).
  int64_t world_size_wide() const;
  bool operator==(const ParallelLayout&) const = default;
};

// A rank's coordinate in each dimension (0 <= coordinate < degree).
struct RankCoords {
  int pp_rank = 0;
  int dp_rank = 0;
  int tp_rank = 0;
  int cp_rank = 0;
  int ep_rank = 0;
  int& at(ParallelDim d);
  int at(ParallelDim d) const;
  bool operator==(const RankCoords&) const = default;
};

// The dimension table: name (the config key after "parallel."), degree and coordinate.
struct DimensionInfo {
  ParallelDim dim;
  const char* name;
  int ParallelLayout::*degree;
  int RankCoords::*coord;
};
inline constexpr DimensionInfo kDimensions[kNumParallelDims] = {
    {ParallelDim::kTp, "tp", &ParallelLayout::tp, &RankCoords::tp_rank},
    {ParallelDim::kCp, "cp", &ParallelLayout::cp, &RankCoords::cp_rank},
    {ParallelDim::kEp, "ep", &ParallelLayout::ep, &RankCoords::ep_rank},
    {ParallelDim::kDp, "dp", &ParallelLayout::dp, &RankCoords::dp_rank},
    {ParallelDim::kPp, "pp", &ParallelLayout::pp, &RankCoords::pp_rank},
};
const char* dim_name(ParallelDim d);  // "tp", "cp", ...

inline int64_t ParallelLayout::world_size_wide() const {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t n = 1;
  for (const DimensionInfo& i : kDimensions) {
    if (i.dim == ParallelDim::kEp) continue;  // ep folds into dp
    const int64_t d = this->*i.degree;
    n = n > kMax / d ? kMax : n * d;
  }
  return n;
}

// The rank order, innermost (stride 1) first.
inline constexpr std::array<ParallelDim, kNumParallelDims> kRankOrder = {
    ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp, ParallelDim::kDp, ParallelDim::kPp};

// Places ranks on the grid of `degrees` in `order` (innermost first; every dimension
// once): rank = sum over dimensions of coordinate * (product of the degrees inside it).
// Pure and cheap to copy; degrees must be >= 1 and order a permutation (CHECK).
class RankGenerator {
 public:
  explicit RankGenerator(const ParallelLayout& degrees,
                         std::span<const ParallelDim> order = kRankOrder);

  int world_size() const { return world_size_; }
  int degree(ParallelDim d) const { return degree_[d]; }
  // Distance between ranks one apart in d.
  int stride(ParallelDim d) const { return stride_[d]; }
  // The ranks a group of d spans: d's degree times the degrees of every dimension inside
  // it (a group of d fits in one node of n ranks when span(d) <= n).
  int span(ParallelDim d) const { return stride_[d] * degree_[d]; }

  int rank_of(const RankCoords& coords) const;
  RankCoords coords_of(int rank) const;
  // World ranks sharing every coordinate of `rank` but d's, ordered by d's coordinate
  // (so group rank == that coordinate).
  std::vector<int> group(ParallelDim d, int rank) const;
  // The index of that group among the groups of d: the rank with d's coordinate removed
  // (the other dimensions in order). Every member of a group has the same color.
  int group_color(ParallelDim d, int rank) const;

 private:
  std::array<ParallelDim, kNumParallelDims> order_{};
  PerDim<int> degree_;
  PerDim<int> stride_;
  int world_size_ = 1;
};

// The degrees of the world's generator: `layout` with ep taken as 1 (dp spans ep).
ParallelLayout world_generator_layout(const ParallelLayout& layout);
// The degrees of the expert layers' generator over the same world: tp, cp, ep, dp / ep (in
// the dp field: the expert-data-parallel degree), pp. ep must divide dp (CHECK).
ParallelLayout expert_generator_layout(const ParallelLayout& layout);

}  // namespace trident
