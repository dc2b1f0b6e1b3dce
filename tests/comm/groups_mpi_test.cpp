// Process groups over MPI: for every dp x tp x pp layout of the launched world (2x2x2,
// 4x1x2, 1x2x4, ... at 8 ranks; 2x1x1, 1x2x1, 1x1x2 at 2), each group's members, found
// by all-gathering world ranks inside the group, must equal the brute-force enumeration
// of mpi_test_util.h, and a sum inside the group must sum exactly its members.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tests/common/mpi_test_util.h"

namespace trident::test {
namespace {

std::string layout_name(const ParallelLayout& l) {
  return "dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) +
         " pp=" + std::to_string(l.pp);
}

// World ranks of `group`'s members in group-rank order, by communication. `group` is
// the host twin of the group under test (check_group): these are host values.
std::vector<int> members_of(Communicator& group) {
  const std::int64_t me = world().rank();
  std::vector<std::byte> out(sizeof(me) * group.size());
  group.all_gather(CommBuf::host(std::as_bytes(std::span(&me, 1))), CommBuf::host(std::span(out)));
  std::vector<int> members(group.size());
  for (int r = 0; r < group.size(); ++r) {
    std::int64_t v;
    std::memcpy(&v, out.data() + r * sizeof(v), sizeof(v));
    members[r] = static_cast<int>(v);
  }
  return members;
}

void check_group(Communicator* group, const char* name, const std::vector<int>& expected,
                 const std::string& where) {
  if (expected.empty()) {
    EXPECT_EQ(group, nullptr) << where << ": rank should be in no " << name << " group";
    return;
  }
  ASSERT_NE(group, nullptr) << where << ": missing " << name << " group";
  EXPECT_EQ(group->name(), name) << where;
  EXPECT_EQ(group->size(), static_cast<int>(expected.size())) << where;
  // make_process_groups' groups serve device memory; host values travel on a host twin,
  // a split of the group that keeps every member at its group rank.
  const std::unique_ptr<Communicator> twin =
      group->split(0, group->rank(), group->name(), MemSpace::kHost);
  EXPECT_EQ(members_of(*twin), expected) << where << " " << name << " members";
  // A reduction stays inside the group.
  std::vector<std::int64_t> v = {world().rank()};
  twin->all_reduce(CommBuf::host(std::span<std::int64_t>(v)), ReduceOp::kSum);
  EXPECT_EQ(v[0], std::accumulate(expected.begin(), expected.end(), std::int64_t{0}))
      << where << " " << name << " sum";
}

TEST(ProcessGroups, EveryLayoutOfTheWorldMatchesTheGrid) {
  Communicator& w = world();
  for (const ParallelLayout& layout : all_layouts(w.size())) {
    for (bool tied : {false, true}) {
      const std::string where = layout_name(layout) + (tied ? " tied" : " untied") +
                                " world rank " + std::to_string(w.rank());
      auto groups = make_process_groups(w, layout, tied);
      ASSERT_TRUE(groups.is_ok()) << where << ": " << groups.status().message();
      const RankCoords& c = groups->coords;
      const GridRank g = enumerate_grid(layout)[w.rank()];
      EXPECT_EQ(c.pp_rank, g.pp) << where;
      EXPECT_EQ(c.dp_rank, g.dp) << where;
      EXPECT_EQ(c.tp_rank, g.tp) << where;
      EXPECT_EQ(groups->world, &w);
      // Every rank has all four checks' collectives in the same order; a rank with no
      // embedding group simply skips that one (it belongs to no such group).
      check_group(groups->tp.get(), "tp", expected_members(layout, w.rank(), GroupKind::kTp, tied),
                  where);
      check_group(groups->dp.get(), "dp", expected_members(layout, w.rank(), GroupKind::kDp, tied),
                  where);
      check_group(groups->pp.get(), "pp", expected_members(layout, w.rank(), GroupKind::kPp, tied),
                  where);
      check_group(groups->embedding.get(), "embedding",
                  expected_members(layout, w.rank(), GroupKind::kEmbedding, tied), where);
      // Splits inherit the parent's default timeout.
      EXPECT_EQ(groups->tp->default_timeout(), w.default_timeout());
    }
  }
}

// Context parallelism: every layout of the world with cp > 1 (4 ranks: cp 2 with dp, tp
// or pp 2, and cp 4; 8 ranks: cp 2 with the layouts of 4, cp 4 with one of 2, ...). The
// expected members come from the rank formula ((pp * dp + d) * cp + c) * tp + t, spelled
// out here: cp over c, dp_cp over (d, c) in that order; dp and pp keep their cp coordinate.
TEST(ProcessGroups, ContextParallelGroupsMatchTheRankFormula) {
  Communicator& w = world();
  for (int cp = 2; cp <= w.size(); cp *= 2) {
    if (w.size() % cp != 0) continue;
    for (ParallelLayout layout : all_layouts(w.size() / cp)) {
      layout.cp = cp;
      const std::string where = layout_name(layout) + " cp=" + std::to_string(cp) +
                                " world rank " + std::to_string(w.rank());
      auto groups = make_process_groups(w, layout, /*tied_embeddings=*/false);
      ASSERT_TRUE(groups.is_ok()) << where << ": " << groups.status().message();
      const RankCoords& c = groups->coords;
      auto rank = [&](int pp, int d, int k, int t) {
        return ((pp * layout.dp + d) * cp + k) * layout.tp + t;
      };
      ASSERT_EQ(rank(c.pp_rank, c.dp_rank, c.cp_rank, c.tp_rank), w.rank()) << where;
      std::vector<int> cp_members, dp_cp_members, dp_members;
      for (int k = 0; k < cp; ++k) cp_members.push_back(rank(c.pp_rank, c.dp_rank, k, c.tp_rank));
      for (int d = 0; d < layout.dp; ++d) {
        dp_members.push_back(rank(c.pp_rank, d, c.cp_rank, c.tp_rank));
        for (int k = 0; k < cp; ++k) dp_cp_members.push_back(rank(c.pp_rank, d, k, c.tp_rank));
      }
      check_group(groups->cp.get(), "cp", cp_members, where);
      check_group(groups->dp_cp.get(), "dp_cp", dp_cp_members, where);
      check_group(groups->dp.get(), "dp", dp_members, where);
      EXPECT_EQ(&groups->data_parallel(), groups->dp_cp.get()) << where;
    }
  }
  // At cp 1 there is neither, and the data-parallel group is dp.
  auto plain = make_process_groups(w, ParallelLayout{w.size(), 1, 1}, false);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->cp, nullptr);
  EXPECT_EQ(plain->dp_cp, nullptr);
  EXPECT_EQ(&plain->data_parallel(), plain->dp.get());
}

TEST(ProcessGroups, WorldSizeMismatchIsInvalidConfigWithExitCode2) {
  Communicator& w = world();
  // Too many and too few ranks; no split runs, so no rank waits on another.
  for (const ParallelLayout& layout :
       {ParallelLayout{w.size() + 1, 1, 1}, ParallelLayout{2, 2, 2 * w.size()}}) {
    auto groups = make_process_groups(w, layout, /*tied_embeddings=*/true);
    ASSERT_FALSE(groups.is_ok());
    EXPECT_EQ(groups.status().code(), StatusCode::kInvalidConfig);
    EXPECT_EQ(groups.status().exit_code(), 2);
    const std::string expected = "parallel: dp*tp*pp = " + std::to_string(layout.world_size()) +
                                 " but the world size is " + std::to_string(w.size());
    EXPECT_EQ(groups.status().message().rfind(expected, 0), 0u) << groups.status().message();
  }
  auto zero = make_process_groups(w, ParallelLayout{0, 1, w.size()}, false);
  ASSERT_FALSE(zero.is_ok());
  EXPECT_EQ(zero.status().exit_code(), 2);
  EXPECT_NE(zero.status().message().find("parallel.dp"), std::string::npos);
}

TEST(ProcessGroups, SplitWithNoGroupReturnsNull) {
  Communicator& w = world();
  // Even ranks form "evens"; odd ranks join nothing.
  auto evens = w.split(w.rank() % 2 == 0 ? 0 : kNoGroup, w.rank(), "evens");
  if (w.rank() % 2 == 1) {
    EXPECT_EQ(evens, nullptr);
    return;
  }
  ASSERT_NE(evens, nullptr);
  EXPECT_EQ(evens->size(), (w.size() + 1) / 2);
  EXPECT_EQ(evens->rank(), w.rank() / 2);
  // The key reorders: reverse order by key = -rank.
  auto reversed = evens->split(0, -evens->rank(), "reversed");
  ASSERT_NE(reversed, nullptr);
  EXPECT_EQ(reversed->rank(), evens->size() - 1 - evens->rank());
  EXPECT_EQ(reversed->name(), "reversed");
}

}  // namespace
}  // namespace trident::test
