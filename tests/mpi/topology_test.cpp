// Topology without communication: the rank formula and the group lists against the
// brute-force grid of mpi_test_util.h, for many layouts (not only those of the world).
// Every rank runs these alike; they call no collective.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "mpi_test_util.h"

namespace trident::test {
namespace {

std::vector<Layout> sample_layouts() {
  std::vector<Layout> layouts;
  for (int n : {1, 2, 4, 6, 8, 12, 16, 30}) {
    for (const Layout& l : all_layouts(n)) layouts.push_back(l);
  }
  return layouts;
}

TEST(Topology, RankFormulaAndInverse) {
  const Topology t(Layout{2, 3, 4});  // dp=2 tp=3 pp=4
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
  for (const Layout& layout : sample_layouts()) {
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
  for (const Layout& layout : sample_layouts()) {
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
  const Topology t(Layout{2, 2, 2});  // stages are ranks 0-3 and 4-7
  EXPECT_EQ(t.embedding_group(1, true), (std::vector<int>{1, 5}));
  EXPECT_EQ(t.embedding_group(6, true), (std::vector<int>{2, 6}));
  EXPECT_TRUE(t.embedding_group(6, false).empty());
  const Topology t4(Layout{1, 2, 4});  // stages 0..3 of two ranks each
  EXPECT_EQ(t4.embedding_group(1, true), (std::vector<int>{1, 7}));
  EXPECT_TRUE(t4.embedding_group(3, true).empty());  // a middle stage
  EXPECT_TRUE(t4.embedding_group(5, true).empty());
}

TEST(Topology, ValidateLayout) {
  EXPECT_TRUE(validate_layout(Layout{2, 2, 2}, 8).is_ok());
  const Status s = validate_layout(Layout{2, 2, 1}, 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_EQ(s.message().rfind("parallel: dp*tp*pp = 4 but the world size is 8", 0), 0u)
      << s.message();
  const Status bad = validate_layout(Layout{1, -1, 1}, 1);
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_NE(bad.message().find("parallel.tp"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace trident::test
