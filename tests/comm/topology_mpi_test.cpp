// Topology without communication: the rank formula and the group lists against the
// brute-force grid of mpi_test_util.h, for many layouts (not only those of the world).
// Every rank runs these alike; they call no collective.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "tests/common/mpi_test_util.h"

namespace trident::test {
namespace {

std::vector<ParallelLayout> sample_layouts() {
  std::vector<ParallelLayout> layouts;
  for (int n : {1, 2, 4, 6, 8, 12, 16, 30}) {
    for (const ParallelLayout& l : all_layouts(n)) layouts.push_back(l);
  }
  return layouts;
}

TEST(Topology, RankFormulaAndInverse) {
  const Topology t(ParallelLayout{2, 3, 4});  // dp=2 tp=3 pp=4
  EXPECT_EQ(t.world_size(), 24);
  // rank = (pp_rank * dp + dp_rank) * tp + tp_rank
  EXPECT_EQ(t.rank_of({.pp_rank = 0, .dp_rank = 0, .tp_rank = 0}), 0);
  EXPECT_EQ(t.rank_of({.pp_rank = 0, .dp_rank = 0, .tp_rank = 2}), 2);
  EXPECT_EQ(t.rank_of({.pp_rank = 0, .dp_rank = 1, .tp_rank = 0}), 3);
  EXPECT_EQ(t.rank_of({.pp_rank = 1, .dp_rank = 0, .tp_rank = 0}), 6);
  EXPECT_EQ(t.rank_of({.pp_rank = 3, .dp_rank = 1, .tp_rank = 2}), 23);
  const RankCoords c = t.coords_of(17);  // 17 = (2*2 + 1)*3 + 2
  EXPECT_EQ(c, (RankCoords{.pp_rank = 2, .dp_rank = 1, .tp_rank = 2}));
}

TEST(Topology, CoordsMatchTheEnumeratedGrid) {
  for (const ParallelLayout& layout : sample_layouts()) {
    const Topology t(layout);
    const std::vector<GridRank> grid = enumerate_grid(layout);
    ASSERT_EQ(t.world_size(), static_cast<int>(grid.size()));
    for (int r = 0; r < t.world_size(); ++r) {
      const RankCoords c = t.coords_of(r);
      EXPECT_EQ(c.pp_rank, grid[r].pp);
      EXPECT_EQ(c.dp_rank, grid[r].dp);
      EXPECT_EQ(c.tp_rank, grid[r].tp);
      EXPECT_EQ(t.rank_of(c), r);
      EXPECT_EQ(t.is_first_stage(r), grid[r].pp == 0);
      EXPECT_EQ(t.is_last_stage(r), grid[r].pp == layout.pp - 1);
    }
  }
}

TEST(Topology, GroupsMatchTheEnumeratedGridAndPartitionTheWorld) {
  for (const ParallelLayout& layout : sample_layouts()) {
    const Topology t(layout);
    for (bool tied : {false, true}) {
      std::set<std::vector<int>> tp_groups, dp_groups, pp_groups, emb_groups;
      for (int r = 0; r < t.world_size(); ++r) {
        EXPECT_EQ(t.tp_group(r), expected_members(layout, r, GroupKind::kTp, tied));
        EXPECT_EQ(t.dp_group(r), expected_members(layout, r, GroupKind::kDp, tied));
        EXPECT_EQ(t.pp_group(r), expected_members(layout, r, GroupKind::kPp, tied));
        EXPECT_EQ(t.embedding_group(r, tied),
                  expected_members(layout, r, GroupKind::kEmbedding, tied));
        tp_groups.insert(t.tp_group(r));
        dp_groups.insert(t.dp_group(r));
        pp_groups.insert(t.pp_group(r));
        if (!t.embedding_group(r, tied).empty()) emb_groups.insert(t.embedding_group(r, tied));
      }
      EXPECT_EQ(tp_groups.size(), static_cast<std::size_t>(layout.dp * layout.pp));
      EXPECT_EQ(dp_groups.size(), static_cast<std::size_t>(layout.tp * layout.pp));
      EXPECT_EQ(pp_groups.size(), static_cast<std::size_t>(layout.dp * layout.tp));
      EXPECT_EQ(emb_groups.size(),
                tied && layout.pp > 1 ? static_cast<std::size_t>(layout.dp * layout.tp) : 0u);
    }
  }
}

TEST(Topology, EmbeddingGroupOf2x2x2) {
  const Topology t(ParallelLayout{2, 2, 2});  // stages are ranks 0-3 and 4-7
  EXPECT_EQ(t.embedding_group(1, true), (std::vector<int>{1, 5}));
  EXPECT_EQ(t.embedding_group(6, true), (std::vector<int>{2, 6}));
  EXPECT_TRUE(t.embedding_group(6, false).empty());
  const Topology t4(ParallelLayout{1, 2, 4});  // stages 0..3 of two ranks each
  EXPECT_EQ(t4.embedding_group(1, true), (std::vector<int>{1, 7}));
  EXPECT_TRUE(t4.embedding_group(3, true).empty());  // a middle stage
  EXPECT_TRUE(t4.embedding_group(5, true).empty());
}

TEST(Topology, ValidateLayout) {
  EXPECT_TRUE(validate_layout(ParallelLayout{2, 2, 2}, 8).is_ok());
  const Status s = validate_layout(ParallelLayout{2, 2, 1}, 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_EQ(s.message().rfind("parallel: dp*tp*pp = 4 but the world size is 8", 0), 0u)
      << s.message();
  const Status bad = validate_layout(ParallelLayout{1, -1, 1}, 1);
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_NE(bad.message().find("parallel.tp"), std::string::npos) << bad.message();
}

// The hand-written formulas the generic RankGenerator replaced, kept here as the
// reference: today's rank order and groups must not change.
struct OldGrid {
  int dp, tp, pp;
  int rank(int pp_rank, int dp_rank, int tp_rank) const {
    return (pp_rank * dp + dp_rank) * tp + tp_rank;
  }
  RankCoords coords(int rank) const {
    RankCoords c;
    c.tp_rank = rank % tp;
    c.dp_rank = (rank / tp) % dp;
    c.pp_rank = rank / (tp * dp);
    return c;
  }
  std::vector<int> group(ParallelDim d, int r) const {
    const RankCoords c = coords(r);
    std::vector<int> g;
    if (d == ParallelDim::kTp) {
      for (int t = 0; t < tp; ++t) g.push_back(rank(c.pp_rank, c.dp_rank, t));
    } else if (d == ParallelDim::kDp) {
      for (int x = 0; x < dp; ++x) g.push_back(rank(c.pp_rank, x, c.tp_rank));
    } else {
      for (int p = 0; p < pp; ++p) g.push_back(rank(p, c.dp_rank, c.tp_rank));
    }
    return g;
  }
  // The split colors make_process_groups used.
  int color(ParallelDim d, int r) const {
    const RankCoords c = coords(r);
    if (d == ParallelDim::kTp) return c.pp_rank * dp + c.dp_rank;
    if (d == ParallelDim::kDp) return c.pp_rank * tp + c.tp_rank;
    return c.dp_rank * tp + c.tp_rank;
  }
};

TEST(RankGenerator, MatchesTheOldFormulasForEveryLayoutUpTo64Ranks) {
  int layouts = 0;
  for (int n = 1; n <= 64; ++n) {
    for (const ParallelLayout& layout : all_layouts(n)) {
      ++layouts;
      const OldGrid old{layout.dp, layout.tp, layout.pp};
      const Topology t(layout);
      const RankGenerator& g = t.ranks();
      ASSERT_EQ(g.world_size(), n);
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE("dp" + std::to_string(layout.dp) + " tp" + std::to_string(layout.tp) + " pp" +
                     std::to_string(layout.pp) + " rank " + std::to_string(r));
        const RankCoords c = old.coords(r);
        ASSERT_EQ(t.coords_of(r), c);
        ASSERT_EQ(t.rank_of(c), r);
        ASSERT_EQ(t.tp_group(r), old.group(ParallelDim::kTp, r));
        ASSERT_EQ(t.dp_group(r), old.group(ParallelDim::kDp, r));
        ASSERT_EQ(t.pp_group(r), old.group(ParallelDim::kPp, r));
        for (ParallelDim d : {ParallelDim::kTp, ParallelDim::kDp, ParallelDim::kPp}) {
          ASSERT_EQ(g.group_color(d, r), old.color(d, r)) << dim_name(d);
        }
        // The degree-1 dimensions: every rank alone, coordinate 0.
        for (ParallelDim d : {ParallelDim::kCp, ParallelDim::kEp}) {
          ASSERT_EQ(g.group(d, r), std::vector<int>{r}) << dim_name(d);
          ASSERT_EQ(c.at(d), 0);
        }
      }
    }
  }
  EXPECT_GT(layouts, 400);  // every (dp, tp, pp) with dp*tp*pp <= 64
}

TEST(RankGenerator, ContextParallelSitsBetweenTpAndDp) {
  // cp = 2 between tp and dp.
  const ParallelLayout layout{.dp = 3, .tp = 2, .pp = 2, .cp = 2};
  const RankGenerator g(layout);
  EXPECT_EQ(g.world_size(), 24);
  EXPECT_EQ(g.stride(ParallelDim::kTp), 1);  // tp still innermost
  EXPECT_EQ(g.stride(ParallelDim::kCp), 2);  // then cp
  EXPECT_EQ(g.stride(ParallelDim::kEp), 4);
  EXPECT_EQ(g.stride(ParallelDim::kDp), 4);  // then dp
  EXPECT_EQ(g.stride(ParallelDim::kPp), 12);
  for (int r = 0; r < g.world_size(); ++r) {
    const RankCoords c = g.coords_of(r);
    EXPECT_EQ(r, ((c.pp_rank * 3 + c.dp_rank) * 2 + c.cp_rank) * 2 + c.tp_rank);
    EXPECT_EQ(g.rank_of(c), r);
  }
  // Rank 15 = pp 1, dp 0, cp 1, tp 1.
  EXPECT_EQ(g.coords_of(15), (RankCoords{.pp_rank = 1, .dp_rank = 0, .tp_rank = 1, .cp_rank = 1}));
  EXPECT_EQ(g.group(ParallelDim::kTp, 15), (std::vector<int>{14, 15}));
  EXPECT_EQ(g.group(ParallelDim::kCp, 15), (std::vector<int>{13, 15}));
  EXPECT_EQ(g.group(ParallelDim::kDp, 15), (std::vector<int>{15, 19, 23}));
  EXPECT_EQ(g.group(ParallelDim::kPp, 15), (std::vector<int>{3, 15}));
  // Each dimension's groups partition the world, and a group shares one color.
  for (const DimensionInfo& d : kDimensions) {
    std::set<int> colors;
    std::vector<int> seen(24, 0);
    for (int r = 0; r < g.world_size(); ++r) {
      const std::vector<int> group = g.group(d.dim, r);
      EXPECT_EQ(static_cast<int>(group.size()), g.degree(d.dim));
      for (int m : group) EXPECT_EQ(g.group_color(d.dim, m), g.group_color(d.dim, r));
      if (group[0] == r) {
        colors.insert(g.group_color(d.dim, r));
        for (int m : group) ++seen[m];
      }
    }
    EXPECT_EQ(static_cast<int>(colors.size()), 24 / g.degree(d.dim)) << d.name;
    EXPECT_EQ(seen, std::vector<int>(24, 1)) << d.name;
  }
}

TEST(RankGenerator, FollowsTheOrderItIsGiven) {
  // pp innermost instead: rank = (tp_rank * dp + dp_rank) * pp + pp_rank.
  const ParallelDim order[] = {ParallelDim::kPp, ParallelDim::kDp, ParallelDim::kCp,
                               ParallelDim::kEp, ParallelDim::kTp};
  const RankGenerator g(ParallelLayout{.dp = 2, .tp = 3, .pp = 4}, order);
  for (int r = 0; r < g.world_size(); ++r) {
    const RankCoords c = g.coords_of(r);
    EXPECT_EQ(r, (c.tp_rank * 2 + c.dp_rank) * 4 + c.pp_rank);
  }
  EXPECT_EQ(g.group(ParallelDim::kTp, 0), (std::vector<int>{0, 8, 16}));
}

TEST(Topology, ValidateLayoutTakesCpAndEpDividingDp) {
  EXPECT_TRUE(validate_layout(ParallelLayout{.dp = 1, .tp = 2, .pp = 1, .cp = 2}, 4).is_ok());
  const Status cp = validate_layout(ParallelLayout{.dp = 2, .tp = 2, .pp = 1, .cp = 2}, 4);
  EXPECT_EQ(cp.code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(cp.message(),
            "parallel: dp*cp*tp*pp = 8 but the world size is 4 (parallel.dp=2, parallel.cp=2, "
            "parallel.tp=2, parallel.pp=1; launch dp*cp*tp*pp processes)");
  // ep folds into dp: the world is dp*cp*tp*pp, and ep must divide dp.
  EXPECT_TRUE(validate_layout(ParallelLayout{.dp = 4, .ep = 2}, 4).is_ok());
  const Status ep = validate_layout(ParallelLayout{.dp = 2, .ep = 4}, 2);
  EXPECT_EQ(ep.exit_code(), 2);
  EXPECT_EQ(ep.message(),
            "parallel.ep: 4 must divide parallel.dp=2 (expert parallelism splits the "
            "data-parallel ranks)");
  EXPECT_EQ(validate_degrees(ParallelLayout{.cp = 0}).message(),
            "parallel.cp: must be >= 1, got 0");
}

// The dp x cp group: the ranks sharing tp and pp, ordered by dp * cp + cp, spelled out
// from the rank formula ((pp * dp + d) * cp + c) * tp + t.
TEST(Topology, DpCpGroupOf2x2x2x2) {
  const Topology t(ParallelLayout{.dp = 2, .tp = 2, .pp = 2, .cp = 2});
  auto rank = [](int pp, int d, int c, int tp) { return ((pp * 2 + d) * 2 + c) * 2 + tp; };
  for (int r = 0; r < 16; ++r) {
    const RankCoords c = t.coords_of(r);
    std::vector<int> want;
    for (int d = 0; d < 2; ++d) {
      for (int k = 0; k < 2; ++k) want.push_back(rank(c.pp_rank, d, k, c.tp_rank));
    }
    EXPECT_EQ(t.dp_cp_group(r), want) << "rank " << r;
    EXPECT_EQ(t.dp_cp_rank(c), c.dp_rank * 2 + c.cp_rank);
    EXPECT_EQ(want[static_cast<size_t>(t.dp_cp_rank(c))], r);
    EXPECT_EQ(t.cp_group(r), (std::vector<int>{rank(c.pp_rank, c.dp_rank, 0, c.tp_rank),
                                               rank(c.pp_rank, c.dp_rank, 1, c.tp_rank)}));
  }
  EXPECT_EQ(t.dp_cp_group(13), (std::vector<int>{9, 11, 13, 15}));  // pp 1, tp 1
}

}  // namespace
}  // namespace trident::test

namespace trident {
namespace {

// Expert parallelism folds into dp (comm/topology.h "ep", "expert_dp"): spelled out from
// dp_rank = edp_rank * ep + ep_rank, the ep group of a rank is the ep adjacent dp ranks of
// its block, the expert dp group the dp ranks with its dp_rank % ep; both in the dp
// group's order of world ranks, and the world generator's ranks are those of ep 1.
TEST(Topology, ExpertGroupsFoldIntoDp) {
  Communicator& world = test::world();
  const int n = world.size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world";
  for (const int pp : {1, 2}) {
    if (n % (2 * pp) != 0) continue;
    const int dp = n / pp, ep = 2;
    const ParallelLayout layout{.dp = dp, .tp = 1, .pp = pp, .ep = ep};
    SCOPED_TRACE("dp " + std::to_string(dp) + " pp " + std::to_string(pp));
    auto groups = make_process_groups(world, layout, false);
    ASSERT_TRUE(groups.is_ok()) << groups.status().message();
    const Topology& t = groups->topology;
    EXPECT_EQ(t.world_size(), n);
    const RankCoords c = groups->coords;
    EXPECT_EQ(t.rank_of(c), world.rank());
    EXPECT_EQ(world.rank(), c.pp_rank * dp + c.dp_rank);  // tp = cp = 1: ep adds no stride
    EXPECT_EQ(c.ep_rank, 0);  // the world generator's coordinates: ep folds into dp
    EXPECT_EQ(groups->ep_rank, c.dp_rank % ep);
    EXPECT_EQ(groups->expert_dp_rank, c.dp_rank / ep);
    std::vector<int> want_ep, want_edp;
    for (int j = 0; j < ep; ++j) want_ep.push_back(c.pp_rank * dp + c.dp_rank / ep * ep + j);
    for (int k = 0; k < dp / ep; ++k) want_edp.push_back(c.pp_rank * dp + k * ep + c.dp_rank % ep);
    ASSERT_TRUE(groups->ep && groups->expert_dp);
    EXPECT_EQ(groups->ep->size(), ep);
    EXPECT_EQ(groups->ep->rank(), groups->ep_rank);
    EXPECT_EQ(groups->expert_dp->size(), dp / ep);
    EXPECT_EQ(groups->expert_dp->rank(), c.dp_rank / ep);
    const std::vector<int> ep_members = groups->ep->world_ranks();
    if (!ep_members.empty()) {
      EXPECT_EQ(ep_members, want_ep);
    }
    const std::vector<int> edp_members = groups->expert_dp->world_ranks();
    if (!edp_members.empty()) {
      EXPECT_EQ(edp_members, want_edp);
    }
  }
}

}  // namespace
}  // namespace trident
