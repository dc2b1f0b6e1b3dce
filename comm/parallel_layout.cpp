#include "comm/parallel_layout.h"

#include <string>

#include "core/check.h"

namespace trident {

namespace {

const DimensionInfo& info(ParallelDim d) {
  const DimensionInfo& i = kDimensions[dim_index(d)];
  TRIDENT_CHECK(i.dim == d);
  return i;
}

}  // namespace

const char* dim_name(ParallelDim d) { return info(d).name; }

int ParallelLayout::degree(ParallelDim d) const { return this->*info(d).degree; }

int ParallelLayout::world_size() const {
  int n = 1;
  for (const DimensionInfo& i : kDimensions) {
    if (i.dim != ParallelDim::kEp) n *= this->*i.degree;  // ep folds into dp
  }
  return n;
}

ParallelLayout world_generator_layout(const ParallelLayout& layout) {
  ParallelLayout l = layout;
  l.ep = 1;
  return l;
}

ParallelLayout expert_generator_layout(const ParallelLayout& layout) {
  TRIDENT_CHECK_MSG(layout.ep >= 1 && layout.dp % layout.ep == 0,
                    "parallel.ep=" + std::to_string(layout.ep) + " does not divide parallel.dp=" +
                        std::to_string(layout.dp));
  ParallelLayout l = layout;
  l.dp = layout.dp / layout.ep;
  return l;
}

int& RankCoords::at(ParallelDim d) { return this->*info(d).coord; }
int RankCoords::at(ParallelDim d) const { return this->*info(d).coord; }

RankGenerator::RankGenerator(const ParallelLayout& degrees, std::span<const ParallelDim> order) {
  TRIDENT_CHECK_MSG(order.size() == static_cast<size_t>(kNumParallelDims),
                    "rank order of " + std::to_string(order.size()) + " dimensions");
  PerDim<bool> seen;
  for (size_t k = 0; k < order.size(); ++k) {
    const ParallelDim d = order[k];
    TRIDENT_CHECK_MSG(!seen[d], std::string("rank order names ") + dim_name(d) + " twice");
    seen[d] = true;
    const int n = degrees.degree(d);
    TRIDENT_CHECK_MSG(n >= 1,
                      std::string("parallel degree ") + dim_name(d) + "=" + std::to_string(n));
    order_[k] = d;
    degree_[d] = n;
    stride_[d] = world_size_;
    world_size_ *= n;
  }
}

int RankGenerator::rank_of(const RankCoords& coords) const {
  int rank = 0;
  for (const ParallelDim d : order_) {
    const int c = coords.at(d);
    TRIDENT_CHECK_MSG(c >= 0 && c < degree_[d], std::string(dim_name(d)) + " coordinate " +
                                                    std::to_string(c) + " of " +
                                                    std::to_string(degree_[d]));
    rank += c * stride_[d];
  }
  return rank;
}

RankCoords RankGenerator::coords_of(int rank) const {
  TRIDENT_CHECK_MSG(rank >= 0 && rank < world_size_,
                    "rank " + std::to_string(rank) + " of " + std::to_string(world_size_));
  RankCoords coords;
  for (const ParallelDim d : order_) coords.at(d) = rank / stride_[d] % degree_[d];
  return coords;
}

std::vector<int> RankGenerator::group(ParallelDim d, int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.at(d) = 0; c.at(d) < degree_[d]; ++c.at(d)) ranks.push_back(rank_of(c));
  return ranks;
}

int RankGenerator::group_color(ParallelDim d, int rank) const {
  const RankCoords c = coords_of(rank);
  int color = 0, stride = 1;
  for (const ParallelDim o : order_) {
    if (o == d) continue;
    color += c.at(o) * stride;
    stride *= degree_[o];
  }
  return color;
}

}  // namespace trident
