// Straggler detection (trainer/straggler.h): the slowest rank of a step and its ratio to
// the median rank, and the per-window warning, against figures worked out by hand.
#include "trainer/straggler.h"

#include <gtest/gtest.h>

#include <vector>

namespace trident {
namespace {

TEST(Straggler, SlowestRankAndMedian) {
  // Odd count: the median is the middle value.
  SlowestRank s = slowest_rank(std::vector<double>{10, 30, 20});
  EXPECT_EQ(s.rank, 1);
  EXPECT_DOUBLE_EQ(s.busy_ms, 30);
  EXPECT_DOUBLE_EQ(s.median_ms, 20);
  EXPECT_DOUBLE_EQ(s.ratio, 1.5);
  // Even count: the lower middle value (8 9 [10] 12 40 40), one rank's own; ties go to the
  // lower rank.
  s = slowest_rank(std::vector<double>{9, 40, 12, 10, 40, 8});
  EXPECT_EQ(s.rank, 1);
  EXPECT_DOUBLE_EQ(s.busy_ms, 40);
  EXPECT_DOUBLE_EQ(s.median_ms, 10);
  EXPECT_DOUBLE_EQ(s.ratio, 4);
  // Two ranks: the median is the faster one, so a rank 3x slower shows as 3x (the mean of
  // the two would say 1.5x, and no factor of 2 or more could ever be reached).
  s = slowest_rank(std::vector<double>{30, 10});
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.median_ms, 10);
  EXPECT_DOUBLE_EQ(s.ratio, 3);
  // One rank: itself.
  s = slowest_rank(std::vector<double>{7});
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.ratio, 1);
  // A median of 0 (nothing measured): ratio 1, not a division by zero.
  s = slowest_rank(std::vector<double>{0, 0, 5});
  EXPECT_EQ(s.rank, 2);
  EXPECT_DOUBLE_EQ(s.median_ms, 0);
  EXPECT_DOUBLE_EQ(s.ratio, 1);
  EXPECT_EQ(slowest_rank(std::vector<double>{}).rank, -1);
}

// Busy times of 4 ranks where `slow` ranks take `times` x the others' 10 ms.
std::vector<double> step(std::vector<int> slow, double times) {
  std::vector<double> v(4, 10.0);
  for (int r : slow) v[static_cast<size_t>(r)] = 10.0 * times;
  return v;
}

TEST(Straggler, WarnsOncePerWindowForARankSlowInHalfItsSteps) {
  StragglerDetector d(1.5, 4);
  EXPECT_TRUE(d.enabled());
  // Window 1: rank 2 is 3x, then 4x slower in 2 of 4 steps (= ceil(4/2)): a straggler.
  EXPECT_FALSE(d.push(step({2}, 3)));
  EXPECT_FALSE(d.push(step({}, 1)));
  EXPECT_FALSE(d.push(step({2}, 4)));
  auto w = d.push(step({}, 1));
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 1u);
  EXPECT_EQ((*w)[0].rank, 2);
  EXPECT_EQ((*w)[0].slow_steps, 2);
  // Its ratios in the slow steps were 3 and 4: the median rank's of the two, 3.
  EXPECT_DOUBLE_EQ((*w)[0].slow_ratio, 3.0);
  // Window 2: slow in only 1 of 4 steps: none (the window still ends with an answer).
  EXPECT_FALSE(d.push(step({2}, 3)));
  EXPECT_FALSE(d.push(step({}, 1)));
  EXPECT_FALSE(d.push(step({}, 1)));
  w = d.push(step({}, 1));
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->empty());
  // Window 3 starts afresh: window 2's slow step does not carry over. An odd window of 3
  // needs ceil(3/2) = 2 slow steps.
  StragglerDetector odd(1.5, 3);
  EXPECT_FALSE(odd.push(step({1}, 2)));
  EXPECT_FALSE(odd.push(step({}, 1)));
  w = odd.push(step({}, 1));
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->empty());
  EXPECT_FALSE(odd.push(step({1}, 2)));
  EXPECT_FALSE(odd.push(step({}, 1)));
  w = odd.push(step({1}, 2));
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 1u);
  EXPECT_EQ((*w)[0].rank, 1);
}

TEST(Straggler, TheFactorIsStrictAndEveryRankOverItCounts) {
  StragglerDetector d(2.0, 2);
  // Exactly 2x is not more than the factor 2.
  EXPECT_FALSE(d.push(step({1}, 2)));
  auto w = d.push(step({1}, 2));
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->empty());
  // Ranks 0 and 3 (one node's two tp ranks) both count, not only the slowest. Step 1:
  // busy 50, 10, 10, 45 -> median 10 (10 [10] 45 50), ratios 5 and 4.5. Step 2: 45, 10,
  // 10, 10 -> median 10, rank 0 at 4.5x, rank 3 at 1x. Over ceil(2/2) = 1 step each: both
  // are stragglers, the one slow more often first.
  StragglerDetector e(1.5, 2);
  EXPECT_FALSE(e.push(std::vector<double>{50, 10, 10, 45}));
  w = e.push(std::vector<double>{45, 10, 10, 10});
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].rank, 0);
  EXPECT_EQ((*w)[0].slow_steps, 2);
  EXPECT_DOUBLE_EQ((*w)[0].slow_ratio, 4.5);  // of 5 and 4.5, the lower middle
  EXPECT_EQ((*w)[1].rank, 3);
  EXPECT_EQ((*w)[1].slow_steps, 1);
  EXPECT_DOUBLE_EQ((*w)[1].slow_ratio, 4.5);
  // Equal counts keep rank order.
  StragglerDetector f(1.5, 1);
  w = f.push(std::vector<double>{10, 30, 10, 20});
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].rank, 1);
  EXPECT_EQ((*w)[1].rank, 3);
  EXPECT_DOUBLE_EQ((*w)[1].slow_ratio, 2.0);
}

TEST(Straggler, EvenRanksNoneSlow) {
  // Equal ranks, and noise under the factor: a window with no straggler, every time.
  StragglerDetector d(2.0, 3);
  EXPECT_FALSE(d.push(std::vector<double>{10, 11, 9, 12}));
  EXPECT_FALSE(d.push(std::vector<double>{10, 10, 10, 10}));
  auto w = d.push(std::vector<double>{19, 10, 10, 10});  // 1.9x: under 2
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->empty());
}

TEST(Straggler, AHostPeerThatWaitedInsideItsHostIsNotNamed) {
  // Ranks 0, 1 on host 0; 2, 3 on host 1 (slowed); 4, 5 on host 2. Busy times (waits
  // inside the host counted as busy): host 1's ranks at 100 and 90, rank 1 at 60 because it
  // waited 55 ms in its host's tp all-reduce for rank 0, which itself waited on host 1
  // (in pp: not busy). Median (lower middle of 5 8 9 10 60 90 100 -> 6 values:
  // 5 8 [9] 60 90 100) 9, limit 3 x 9 = 27.
  const std::vector<double> busy = {9, 60, 100, 90, 8, 5};
  const std::vector<double> own = {9, 5, 40, 30, 8, 5};
  StragglerDetector d(3, 1);
  d.set_hosts({0, 0, 1, 1, 2, 2});
  auto w = d.push(busy, own);
  ASSERT_TRUE(w);
  // Rank 1 is over the limit only by its wait inside host 0, whose rank 0 is not over it:
  // not named. Host 1's ranks are both over it: both named (rank 3's own 30 would do too).
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].rank, 2);
  EXPECT_DOUBLE_EQ((*w)[0].slow_ratio, 100.0 / 9);
  EXPECT_EQ((*w)[1].rank, 3);
  // A slowed host whose ranks compute little and wait for each other (own times under the
  // limit): every rank of it is over, so both still count.
  w = d.push(busy, std::vector<double>{9, 5, 20, 10, 8, 5});
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].rank, 2);
  EXPECT_EQ((*w)[1].rank, 3);
  // One slow rank among host peers that are not (a slow device, its peers in groups across
  // hosts): its own time is over the limit, so it counts alone.
  w = d.push(std::vector<double>{9, 60, 9, 10, 8, 5}, std::vector<double>{9, 60, 9, 10, 8, 5});
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 1u);
  EXPECT_EQ((*w)[0].rank, 1);
  // Without hosts (one host, or none known) every rank is its own unit: rank 1's 60 counts
  // as it did before hosts were looked at.
  StragglerDetector alone(3, 1);
  w = alone.push(busy, own);
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 3u);
  EXPECT_EQ((*w)[0].rank, 1);
  // Mismatched counts are a programming error: an abort that names them.
  StragglerDetector bad(3, 1);
  bad.set_hosts({0, 1});
  EXPECT_DEATH(bad.push(busy, own), "2 hosts for 6 ranks");
}

TEST(Straggler, OffAndText) {
  StragglerDetector off(0, 1);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.push(step({0}, 100)));
  EXPECT_FALSE(off.push(step({0}, 100)));
  const std::vector<Straggler> found = {{4, 18, 3.14}, {5, 12, 2.0}};
  EXPECT_EQ(straggler_text(found, {"a", "b", "c", "d", "node3", ""}, 1.5, 20),
            "rank 4 on node3 exceeded 1.5x the median rank's busy time in 18 of the last 20 "
            "steps (by 3.1x in the median of those); rank 5 exceeded 1.5x the median rank's "
            "busy time in 12 of the last 20 steps (by 2.0x in the median of those)");
  // No hosts known (a trainer without a watchdog): no "on HOST".
  EXPECT_EQ(straggler_text({{0, 1, 2.5}}, {}, 2, 1),
            "rank 0 exceeded 2x the median rank's busy time in 1 of the last 1 steps (by 2.5x "
            "in the median of those)");
}

}  // namespace
}  // namespace trident
