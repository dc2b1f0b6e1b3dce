// parallel/expert_parallel.h: a layout subset keeps its groups' tensors, compacted from
// offset 0, under the parameter indices of the whole layout; the split store serves each
// group from the store that holds it.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "parallel/expert_parallel.h"
#include "tests/common/param_layout.h"

namespace trident {
namespace {

ParamLayout four_groups() {
  return testing::make_test_layout({{"a", Shape({3, 5}), 0},
                                    {"b", Shape({7}), 1},
                                    {"c", Shape({2, 9}), 2},
                                    {"d", Shape({4}), 2},
                                    {"e", Shape({17}), 3}},
                                   4);
}

TEST(ExpertParallel, LayoutSubsetCompactsItsGroupsUnderTheSameIndices) {
  const ParamLayout all = four_groups();
  const ParamLayout low = layout_subset(all, 0, 2);
  ASSERT_EQ(low.groups.size(), 2u);
  EXPECT_EQ(low.total_floats(), all.groups[2].offset);  // groups 0 and 1 as they were
  EXPECT_EQ(low.params[1].offset, all.params[1].offset);
  const ParamLayout high = layout_subset(all, 2, 4);
  ASSERT_EQ(high.groups.size(), 4u);
  EXPECT_TRUE(high.groups[0].params.empty() && high.groups[1].params.empty());
  EXPECT_EQ(high.groups[0].num_floats + high.groups[1].num_floats, 0u);
  EXPECT_EQ(high.groups[2].offset, 0u);
  EXPECT_EQ(high.groups[2].params, (std::vector<int>{2, 3}));
  EXPECT_EQ(high.groups[3].params, (std::vector<int>{4}));
  // Each tensor keeps its place inside its group; the groups sit back to back from 0.
  for (int p : {2, 3, 4}) {
    const ParamInfo& was = all.params[static_cast<size_t>(p)];
    const ParamInfo& now = high.params[static_cast<size_t>(p)];
    EXPECT_EQ(now.offset - high.groups[static_cast<size_t>(now.group)].offset,
              was.offset - all.groups[static_cast<size_t>(was.group)].offset);
  }
  EXPECT_EQ(high.groups[3].offset, all.groups[2].num_floats);
  EXPECT_EQ(high.total_floats(), all.groups[2].num_floats + all.groups[3].num_floats);
}

TEST(ExpertParallel, SplitStoreServesEachGroupFromItsStore) {
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const ParamLayout all = four_groups();
  const ParamLayout low = layout_subset(all, 0, 2), high = layout_subset(all, 2, 4);
  ResidentParamStore a(low, *ops), b(high, *ops);
  SplitParamStore split(a, b, 2);
  for (int g = 0; g < 4; ++g) {
    ParamStore& want = g < 2 ? static_cast<ParamStore&>(a) : b;
    split.acquire(g, Phase::kBackward);
    EXPECT_EQ(split.params(g).raw(), want.params(g).raw()) << g;
    EXPECT_EQ(split.grads(g).raw(), want.grads(g).raw()) << g;
    split.release(g, Phase::kBackward);
  }
}

}  // namespace
}  // namespace trident
