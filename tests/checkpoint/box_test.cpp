// Box geometry: intersection, N-D region copies against a brute-force element loop, and
// the exact-cover check (gaps, overlaps, boxes leaving the tensor) with exact messages.
#include "checkpoint/box.h"

#include <gtest/gtest.h>

#include <vector>

namespace trident {
namespace {

TEST(Box, VolumeAndString) {
  EXPECT_EQ(volume(std::vector<int64_t>{}), 1);
  EXPECT_EQ(volume(std::vector<int64_t>{3, 0, 2}), 0);
  EXPECT_EQ(volume(std::vector<int64_t>{3, 4, 2}), 24);
  EXPECT_EQ(dims_to_string(std::vector<int64_t>{2, 3}), "[2, 3]");
}

TEST(Box, Intersect) {
  std::vector<int64_t> s, e;
  ASSERT_TRUE(intersect_boxes(std::vector<int64_t>{0, 2}, std::vector<int64_t>{4, 4},
                              std::vector<int64_t>{3, 0}, std::vector<int64_t>{5, 3}, &s, &e));
  EXPECT_EQ(s, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(e, (std::vector<int64_t>{1, 1}));
  // Touching boxes do not intersect.
  EXPECT_FALSE(intersect_boxes(std::vector<int64_t>{0}, std::vector<int64_t>{4},
                               std::vector<int64_t>{4}, std::vector<int64_t>{2}, &s, &e));
}

// copy_region against an element-by-element reference on a 3-D tensor.
TEST(Box, CopyRegionMatchesElementLoop) {
  const std::vector<int64_t> shape = {4, 5, 6};
  auto global = [&](int64_t i, int64_t j, int64_t k) {
    return static_cast<float>((i * shape[1] + j) * shape[2] + k);
  };
  const std::vector<int64_t> src_start = {1, 0, 2}, src_extent = {3, 5, 3};
  const std::vector<int64_t> dst_start = {0, 1, 1}, dst_extent = {3, 3, 4};
  std::vector<float> src(volume(src_extent));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 0; k < 3; ++k)
        src[(i * 5 + j) * 3 + k] = global(i + 1, j, k + 2);
  std::vector<int64_t> s, e;
  ASSERT_TRUE(intersect_boxes(src_start, src_extent, dst_start, dst_extent, &s, &e));
  EXPECT_EQ(s, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(e, (std::vector<int64_t>{2, 3, 3}));
  std::vector<float> dst(volume(dst_extent), -1.0f);
  copy_region(src.data(), src_start, src_extent, dst.data(), dst_start, dst_extent, s, e,
              sizeof(float));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t gi = i, gj = j + 1, gk = k + 1;
        const bool inside = gi >= 1 && gi < 3 && gj >= 1 && gj < 4 && gk >= 2 && gk < 5;
        EXPECT_EQ(dst[(i * 3 + j) * 4 + k], inside ? global(gi, gj, gk) : -1.0f)
            << i << "," << j << "," << k;
      }
}

TEST(Box, ExactCoverAcceptsTiling) {
  const std::vector<int64_t> shape = {4, 6};
  std::vector<BoxSpan> boxes = {{{0, 0}, {4, 2}, "a"}, {{0, 2}, {1, 4}, "b"},
                                {{1, 2}, {3, 4}, "c"}, {{2, 2}, {0, 4}, "empty"}};
  EXPECT_TRUE(check_exact_cover("w", shape, boxes).is_ok());
  // A scalar: one box with no dimensions.
  EXPECT_TRUE(check_exact_cover("s", std::vector<int64_t>{}, {{{}, {}, "a"}}).is_ok());
}

TEST(Box, ExactCoverReportsGap) {
  const std::vector<int64_t> shape = {4, 6};
  std::vector<BoxSpan> boxes = {{{0, 0}, {4, 2}, "rank_0.bin"}, {{0, 2}, {3, 4}, "rank_1.bin"}};
  Status st = check_exact_cover("w", shape, boxes);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(),
            "tensor 'w' shape [4, 6]: element [3, 2] is not covered by any box (boxes cover 20 of "
            "24 elements)");
}

TEST(Box, ExactCoverReportsOverlap3D) {
  const std::vector<int64_t> shape = {2, 3, 4};
  std::vector<BoxSpan> boxes = {{{0, 0, 0}, {2, 3, 2}, "rank_0.bin"},
                                {{1, 2, 1}, {1, 1, 3}, "rank_1.bin"},
                                {{0, 0, 2}, {2, 3, 2}, "rank_2.bin"}};
  Status st = check_exact_cover("m", shape, boxes);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(),
            "tensor 'm': boxes in rank_0.bin start [0, 0, 0] extent [2, 3, 2] and rank_1.bin start "
            "[1, 2, 1] extent [1, 1, 3] overlap at element [1, 2, 1]");
}

TEST(Box, ExactCoverReportsBoxOutsideShape) {
  Status st = check_exact_cover("v", std::vector<int64_t>{5}, {{{3}, {3}, "rank_1.bin"}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(), "rank_1.bin: tensor 'v': box start [3] extent [3] leaves shape [5]");
  st = check_exact_cover("v", std::vector<int64_t>{5, 2}, {{{0}, {5}, "rank_0.bin"}});
  EXPECT_EQ(st.message(),
            "rank_0.bin: tensor 'v': box start [0] extent [5] has a different rank than shape [5, 2]");
}

}  // namespace
}  // namespace trident
