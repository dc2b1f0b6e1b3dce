#include "comm/topology.h"

#include <string>
#include <utility>

#include "core/check.h"

namespace trident {

Status validate_layout(const Layout& layout, int world_size) {
  const std::pair<const char*, int> degrees[] = {
      {"parallel.dp", layout.dp}, {"parallel.tp", layout.tp}, {"parallel.pp", layout.pp}};
  for (const auto& [key, value] : degrees) {
    if (value < 1) {
      return Status::invalid_config(std::string(key) + ": must be >= 1, got " +
                                    std::to_string(value));
    }
  }
  const long long product = 1LL * layout.dp * layout.tp * layout.pp;
  if (product != world_size) {
    return Status::invalid_config(
        "parallel: dp*tp*pp = " + std::to_string(product) + " but the world size is " +
        std::to_string(world_size) + " (parallel.dp=" + std::to_string(layout.dp) +
        ", parallel.tp=" + std::to_string(layout.tp) +
        ", parallel.pp=" + std::to_string(layout.pp) + "; launch dp*tp*pp processes)");
  }
  return Status::ok();
}

Topology::Topology(Layout layout) : layout_(layout) {
  TRIDENT_CHECK_MSG(layout.dp >= 1 && layout.tp >= 1 && layout.pp >= 1,
                    "layout dp=" + std::to_string(layout.dp) + " tp=" + std::to_string(layout.tp) +
                        " pp=" + std::to_string(layout.pp));
}

int Topology::rank_of(const RankCoords& c) const {
  TRIDENT_CHECK(c.pp_rank >= 0 && c.pp_rank < layout_.pp && c.dp_rank >= 0 &&
                c.dp_rank < layout_.dp && c.tp_rank >= 0 && c.tp_rank < layout_.tp);
  return (c.pp_rank * layout_.dp + c.dp_rank) * layout_.tp + c.tp_rank;
}

RankCoords Topology::coords_of(int rank) const {
  TRIDENT_CHECK_MSG(rank >= 0 && rank < world_size(),
                    "rank " + std::to_string(rank) + " of " + std::to_string(world_size()));
  RankCoords c;
  c.tp_rank = rank % layout_.tp;
  c.dp_rank = (rank / layout_.tp) % layout_.dp;
  c.pp_rank = rank / (layout_.tp * layout_.dp);
  return c;
}

std::vector<int> Topology::tp_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.tp_rank = 0; c.tp_rank < layout_.tp; ++c.tp_rank) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> Topology::dp_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.dp_rank = 0; c.dp_rank < layout_.dp; ++c.dp_rank) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> Topology::pp_group(int rank) const {
  RankCoords c = coords_of(rank);
  std::vector<int> ranks;
  for (c.pp_rank = 0; c.pp_rank < layout_.pp; ++c.pp_rank) ranks.push_back(rank_of(c));
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

Result<ProcessGroups> make_process_groups(Communicator& world, const Layout& layout,
                                          bool tied_embeddings) {
  TRIDENT_RETURN_IF_ERROR(validate_layout(layout, world.size()));
  TRIDENT_CHECK_MSG(world.space() == MemSpace::kHost,
                    "make_process_groups: world '" + world.name() + "' serves " +
                        mem_space_name(world.space()) + " memory; it must serve host memory");
  ProcessGroups groups;
  groups.topology = Topology(layout);
  groups.world = &world;
  const RankCoords c = groups.topology.coords_of(world.rank());
  groups.coords = c;
  const int tp = layout.tp;
  const int dp = layout.dp;

  constexpr MemSpace kDevice = MemSpace::kDevice;
  // Colors number the groups of each kind; keys order a group by its own coordinate.
  // Every rank runs the same four splits in the same order (communicator contract).
  groups.tp =
      world.split(c.pp_rank * dp + c.dp_rank, c.tp_rank, "tp", kDevice, {.label = "tp group"});
  groups.dp =
      world.split(c.pp_rank * tp + c.tp_rank, c.dp_rank, "dp", kDevice, {.label = "dp group"});
  groups.pp =
      world.split(c.dp_rank * tp + c.tp_rank, c.pp_rank, "pp", kDevice, {.label = "pp group"});
  const bool in_embedding = !groups.topology.embedding_group(world.rank(), tied_embeddings).empty();
  groups.embedding = world.split(in_embedding ? c.dp_rank * tp + c.tp_rank : kNoGroup, c.pp_rank,
                                 "embedding", kDevice, {.label = "embedding group"});

  // The splits must agree with the formula; a mismatch is a bug here, not bad input.
  TRIDENT_CHECK(groups.tp && groups.tp->size() == tp && groups.tp->rank() == c.tp_rank);
  TRIDENT_CHECK(groups.dp && groups.dp->size() == dp && groups.dp->rank() == c.dp_rank);
  TRIDENT_CHECK(groups.pp && groups.pp->size() == layout.pp && groups.pp->rank() == c.pp_rank);
  if (in_embedding) {
    TRIDENT_CHECK(groups.embedding && groups.embedding->size() == 2 &&
                  groups.embedding->rank() == (c.pp_rank == 0 ? 0 : 1));
  } else {
    TRIDENT_CHECK(groups.embedding == nullptr);
  }
  return groups;
}

}  // namespace trident
