// ParallelLayout::world_size_wide (comm/parallel_layout.h), the one product of the degrees
// that the config's size check, `trident plan` and validate_layout read: every dimension
// of kDimensions counts but ep (which folds into dp: its ranks are dp ranks), it equals
// world_size() wherever that fits an int, and past 64 bits it saturates instead of wrapping.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "comm/parallel_layout.h"

namespace trident {
namespace {

TEST(LayoutSize, EveryDimensionCounts) {
  const ParallelLayout l{.dp = 22, .tp = 3, .pp = 5, .cp = 7, .ep = 11};
  EXPECT_EQ(l.world_size_wide(), int64_t{22} * 3 * 5 * 7);
  EXPECT_EQ(l.world_size_wide(), l.world_size());
  // Each degree alone (ep alone spans no ranks).
  for (const DimensionInfo& d : kDimensions) {
    SCOPED_TRACE(d.name);
    ParallelLayout one;
    one.*d.degree = 13;
    EXPECT_EQ(one.world_size_wide(), d.dim == ParallelDim::kEp ? 1 : 13);
  }
}

TEST(LayoutSize, PastAnIntItIsExactAndPast64BitsItSaturates) {
  const ParallelLayout over_int{.dp = 65536, .tp = 65536};
  EXPECT_EQ(over_int.world_size_wide(), int64_t{1} << 32);
  const ParallelLayout huge{.dp = INT_MAX, .tp = INT_MAX, .pp = INT_MAX, .cp = INT_MAX,
                            .ep = INT_MAX};
  EXPECT_EQ(huge.world_size_wide(), INT64_MAX);
  // 2^62 fits; times 2 would be 2^63, one past INT64_MAX.
  const ParallelLayout edge{.dp = 1 << 30, .tp = 1 << 30, .pp = 4};
  EXPECT_EQ(edge.world_size_wide(), int64_t{1} << 62);
  const ParallelLayout past{.dp = 1 << 30, .tp = 1 << 30, .pp = 4, .cp = 2};
  EXPECT_EQ(past.world_size_wide(), INT64_MAX);
}

}  // namespace
}  // namespace trident
