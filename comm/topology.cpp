#include "comm/topology.h"

#include <string>
#include <utility>

#include "core/check.h"

namespace trident {

Status validate_degrees(const ParallelLayout& layout) {
  for (const DimensionInfo& d : kDimensions) {
    const int value = layout.*d.degree;
    const std::string key = std::string("parallel.") + d.name;
    if (value < 1) {
      return Status::invalid_config(key + ": must be >= 1, got " + std::to_string(value));
    }
  }
  // Expert parallelism folds into dp: its ranks are dp ranks.
  if (layout.dp % layout.ep != 0) {
    return Status::invalid_config("parallel.ep: " + std::to_string(layout.ep) +
                                  " must divide parallel.dp=" + std::to_string(layout.dp) +
                                  " (expert parallelism splits the data-parallel ranks)");
  }
  return Status::ok();
}

Status validate_layout(const ParallelLayout& layout, int world_size) {
  TRIDENT_RETURN_IF_ERROR(validate_degrees(layout));
  const int64_t product = layout.world_size_wide();
  if (product != world_size) {
    // cp is named only when it is used (the message of the layouts without it unchanged).
    const bool cp = layout.cp > 1;
    const std::string product_name = cp ? "dp*cp*tp*pp" : "dp*tp*pp";
    return Status::invalid_config(
        "parallel: " + product_name + " = " + std::to_string(product) +
        " but the world size is " + std::to_string(world_size) +
        " (parallel.dp=" + std::to_string(layout.dp) +
        (cp ? ", parallel.cp=" + std::to_string(layout.cp) : std::string()) +
        ", parallel.tp=" + std::to_string(layout.tp) +
        ", parallel.pp=" + std::to_string(layout.pp) + "; launch " + product_name +
        " processes)");
  }
  return Status::ok();
}

Topology::Topology(const ParallelLayout& layout)
    : layout_(layout),
      ranks_(world_generator_layout(layout)),
      expert_ranks_(layout.ep >= 1 && layout.dp % layout.ep == 0 ? expert_generator_layout(layout)
                                                                 : world_generator_layout(layout)) {
  TRIDENT_CHECK(expert_ranks_.world_size() == ranks_.world_size());
}

int Topology::dp_cp_rank(const RankCoords& c) const { return c.dp_rank * layout_.cp + c.cp_rank; }

std::vector<int> Topology::dp_cp_group(int rank) const {
  std::vector<int> ranks;
  RankCoords c = coords_of(rank);
  for (c.dp_rank = 0; c.dp_rank < layout_.dp; ++c.dp_rank) {
    for (c.cp_rank = 0; c.cp_rank < layout_.cp; ++c.cp_rank) ranks.push_back(rank_of(c));
  }
  return ranks;
}

std::vector<int> Topology::embedding_group(int rank, bool tied_embeddings) const {
  RankCoords c = coords_of(rank);
  if (!tied_embeddings || layout_.pp == 1) return {};
  if (c.pp_rank != 0 && c.pp_rank != layout_.pp - 1) return {};
  RankCoords first = c, last = c;
  first.pp_rank = 0;
  last.pp_rank = layout_.pp - 1;
  return {rank_of(first), rank_of(last)};
}

Result<ProcessGroups> make_process_groups(Communicator& world, const ParallelLayout& layout,
                                          bool tied_embeddings, MemSpace space) {
  TRIDENT_RETURN_IF_ERROR(validate_layout(layout, world.size()));
  TRIDENT_CHECK_MSG(world.space() == MemSpace::kHost,
                    "make_process_groups: world '" + world.name() + "' serves " +
                        mem_space_name(world.space()) + " memory; it must serve host memory");
  ProcessGroups groups;
  groups.topology = Topology(layout);
  groups.world = &world;
  const RankGenerator& ranks = groups.topology.ranks();
  const int rank = world.rank();
  const RankCoords c = ranks.coords_of(rank);
  groups.coords = c;

  const MemSpace kDevice = space;  // the groups' memory space (device, but for host twins)
  // Colors number the groups of each kind; keys order a group by its own coordinate.
  // Every rank runs the same four splits in the same order (communicator contract): tp,
  // dp, pp, embedding. A new dimension's group is split after these.
  auto split = [&](ParallelDim d) {
    const std::string name = dim_name(d);
    std::unique_ptr<Communicator> group =
        world.split(ranks.group_color(d, rank), c.at(d), name, kDevice, {.label = name + " group"});
    // The split must agree with the generator; a mismatch is a bug here, not bad input.
    TRIDENT_CHECK(group && group->size() == ranks.degree(d) && group->rank() == c.at(d));
    return group;
  };
  groups.tp = split(ParallelDim::kTp);
  groups.dp = split(ParallelDim::kDp);
  groups.pp = split(ParallelDim::kPp);
  // The embedding group: the pp group's first and last member (same color as pp).
  const bool in_embedding = !groups.topology.embedding_group(rank, tied_embeddings).empty();
  groups.embedding =
      world.split(in_embedding ? ranks.group_color(ParallelDim::kPp, rank) : kNoGroup, c.pp_rank,
                  "embedding", kDevice, {.label = "embedding group"});
  if (in_embedding) {
    TRIDENT_CHECK(groups.embedding && groups.embedding->size() == 2 &&
                  groups.embedding->rank() == (c.pp_rank == 0 ? 0 : 1));
  } else {
    TRIDENT_CHECK(groups.embedding == nullptr);
  }
  if (layout.cp > 1) {
    groups.cp = split(ParallelDim::kCp);
    // dp x cp: the ranks sharing every coordinate but dp's and cp's. Its color is the cp
    // group's color with the dp coordinate dropped: the pp group's color of any member
    // once dp and cp are both 0.
    RankCoords base = c;
    base.dp_rank = base.cp_rank = 0;
    const int key = groups.topology.dp_cp_rank(c);
    groups.dp_cp = world.split(ranks.group_color(ParallelDim::kCp, ranks.rank_of(base)), key,
                               "dp_cp", kDevice, {.label = "dp x cp group"});
    TRIDENT_CHECK(groups.dp_cp && groups.dp_cp->size() == layout.dp * layout.cp &&
                  groups.dp_cp->rank() == key);
  }
  if (layout.ep > 1) {
    // The expert layers' groups, from the second generator over the same world.
    const RankGenerator& experts = groups.topology.expert_ranks();
    const RankCoords e = experts.coords_of(rank);
    TRIDENT_CHECK(e.dp_rank * layout.ep + e.ep_rank == c.dp_rank && e.tp_rank == c.tp_rank &&
                  e.pp_rank == c.pp_rank && e.cp_rank == c.cp_rank);
    groups.ep_rank = e.ep_rank;
    groups.expert_dp_rank = e.dp_rank;
    groups.ep = world.split(experts.group_color(ParallelDim::kEp, rank), e.ep_rank, "ep", kDevice,
                            {.label = "ep group"});
    TRIDENT_CHECK(groups.ep && groups.ep->size() == layout.ep && groups.ep->rank() == e.ep_rank);
    groups.expert_dp = world.split(experts.group_color(ParallelDim::kDp, rank), e.dp_rank,
                                   "expert_dp", kDevice, {.label = "expert dp group"});
    TRIDENT_CHECK(groups.expert_dp && groups.expert_dp->size() == layout.dp / layout.ep &&
                  groups.expert_dp->rank() == e.dp_rank);
  }
  return groups;
}

}  // namespace trident
