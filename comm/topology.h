// Topology: where a world rank sits in the dp x cp x tp x pp grid, and the process groups
// made from it (docs/ARCHITECTURE.md "Parallel layout").
//
// Rank order (comm/parallel_layout.h kRankOrder, the one RankGenerator) puts tp
// innermost (a TP group sits inside one machine), then cp, then dp, then pp (ep folds
// into dp and adds no stride; its groups come from a second generator, see ep below):
//   rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
// Groups (RankGenerator::group: each ordered by its own coordinate, so group rank ==
// that coordinate):
//   tp         same (pp_rank, dp_rank, cp_rank), ordered by tp_rank   (size tp)
//   dp         same (pp_rank, cp_rank, tp_rank), ordered by dp_rank   (size dp)
//   pp         same (dp_rank, cp_rank, tp_rank), ordered by pp_rank   (size pp)
//   embedding  first and last stage with the same (dp_rank, cp_rank, tp_rank): group rank
//              0 is stage 0, rank 1 is stage pp-1. Only when pp > 1 and embeddings are
//              tied (the two stages all-reduce the tied weight's gradient); middle stages
//              and untied or pp == 1 layouts have none.
//   cp         (cp > 1 only) same (pp_rank, dp_rank, tp_rank), ordered by cp_rank: the
//              ring of ring attention (parallel/context_parallel.h).
//   dp_cp      (cp > 1 only) same (pp_rank, tp_rank), ordered by dp_rank * cp + cp_rank
//              (size dp * cp; contiguous ranks at stride tp): the ranks holding the same
//              parameters, over which the gradients are reduced and ZeRO shards
//              (parallel/data_parallel.h). At cp 1 it would be the dp group itself, so
//              none is made and data_parallel() answers dp.
//   ep         (ep > 1 only) expert parallelism, folded into dp: the dp ranks with the same
//              dp_rank / ep, ordered by ep_rank = dp_rank % ep (size ep; adjacent dp
//              ranks). Tokens travel to their experts' ranks over it (all_to_all).
//   expert_dp  (ep > 1 only) the dp ranks holding the same experts: same dp_rank % ep,
//              ordered by dp_rank / ep (size dp / ep). Expert parameters are reduced and
//              ZeRO-sharded over it, the dense ones over dp. Both come from the second
//              generator (expert_ranks(): tp, cp, ep, dp / ep, pp; comm/parallel_layout.h).
// Memory spaces (communicator.h): every group serves DEVICE memory (they carry
// activations, gradients and parameters). Host values (stop flags, losses, the grad-norm
// and status scalars, agreement on a checkpoint, stats, strings) go over the host-space
// world, and the few that must travel within a group over host twins of the groups:
// make_process_groups with MemSpace::kHost splits the same groups (the same members,
// ranks and order) serving host memory (the trainer's per-call least waits of its
// metrics, trainer/metrics.h comm_kind_least_ms).
// Topology is a pure function of the layout (no communication, cheap to copy).
// make_process_groups is a collective over `world` (four splits in a fixed order, two
// more when cp > 1, two more when ep > 1). A layout that does not match the world is an expected failure: Status,
// exit 2.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/parallel_layout.h"
#include "core/status.h"

namespace trident {

// Ok when every degree is >= 1 and ep divides dp; else invalid_config naming the
// parallel.* key ("parallel.tp: must be >= 1, got 0").
Status validate_degrees(const ParallelLayout& layout);
// validate_degrees, and dp*cp*tp*pp == world_size; else invalid_config naming the keys.
Status validate_layout(const ParallelLayout& layout, int world_size);

class Topology {
 public:
  // Degrees must be >= 1 (CHECK; validate_layout first for user input).
  explicit Topology(const ParallelLayout& layout);

  const ParallelLayout& layout() const { return layout_; }
  const RankGenerator& ranks() const { return ranks_; }
  // The expert layers' generator (degrees tp, cp, ep, dp / ep, pp): its dp coordinate is
  // the expert-data-parallel rank.
  const RankGenerator& expert_ranks() const { return expert_ranks_; }
  int world_size() const { return ranks_.world_size(); }

  int rank_of(const RankCoords& coords) const { return ranks_.rank_of(coords); }
  RankCoords coords_of(int rank) const { return ranks_.coords_of(rank); }

  bool is_first_stage(int rank) const { return coords_of(rank).pp_rank == 0; }
  bool is_last_stage(int rank) const { return coords_of(rank).pp_rank == layout_.pp - 1; }

  // World ranks of the group holding `rank`, in group-rank order.
  std::vector<int> tp_group(int rank) const { return ranks_.group(ParallelDim::kTp, rank); }
  std::vector<int> dp_group(int rank) const { return ranks_.group(ParallelDim::kDp, rank); }
  std::vector<int> pp_group(int rank) const { return ranks_.group(ParallelDim::kPp, rank); }
  std::vector<int> cp_group(int rank) const { return ranks_.group(ParallelDim::kCp, rank); }
  // The dp x cp group of `rank` (see the header comment), ordered by dp_cp_rank.
  std::vector<int> dp_cp_group(int rank) const;
  // A rank's place in its dp x cp group: dp_rank * cp + cp_rank.
  int dp_cp_rank(const RankCoords& c) const;
  // Empty when `rank` is in no embedding group (see the header comment).
  std::vector<int> embedding_group(int rank, bool tied_embeddings) const;

 private:
  ParallelLayout layout_;
  RankGenerator ranks_;
  RankGenerator expert_ranks_;
};

// This rank's communicators. world is borrowed (it must outlive the groups) and serves
// host memory; the others are owned and serve device memory (host twins: host). embedding is null where
// this rank is in no embedding group; cp and dp_cp are null at cp 1.
struct ProcessGroups {
  Topology topology{ParallelLayout{}};
  RankCoords coords;
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> embedding;
  std::unique_ptr<Communicator> cp;
  std::unique_ptr<Communicator> dp_cp;
  // ep > 1 only (else null, ranks 0): the ep and expert_dp groups, and this rank's place
  // in each (dp_rank % ep, dp_rank / ep). coords are the world generator's, whose ep
  // coordinate is always 0 (ep folds into dp).
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> expert_dp;
  int ep_rank = 0;
  int expert_dp_rank = 0;
  // The group of the data-parallel machinery (gradient reduction, ZeRO): dp x cp.
  Communicator& data_parallel() const { return dp_cp ? *dp_cp : *dp; }
};

// Splits world into the device-space tp, dp, pp and embedding groups of `layout`, then
// (cp > 1) cp and dp_cp, then (ep > 1) ep and expert_dp, in that order on every rank.
// Collective over world, which must serve host memory (CHECK). Fails with invalid_config
// ("parallel: dp*tp*pp = X but the world size is Y", dp*cp*tp*pp when cp > 1) before any
// communication when the layout does not fit, so every rank fails alike. `space`
// kHost: the same groups serving host memory (host twins; above).
Result<ProcessGroups> make_process_groups(Communicator& world, const ParallelLayout& layout,
                                          bool tied_embeddings, MemSpace space = MemSpace::kDevice);

}  // namespace trident
