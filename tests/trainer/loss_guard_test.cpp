// The loss-spike guard (trainer/loss_guard.h): when it fires, what it says, what its
// window holds.
#include "trainer/loss_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace trident {
namespace {

TEST(LossSpikeGuard, FiresAboveFactorTimesTheMedianAndSaysSo) {
  LossSpikeGuard guard(3, 50);
  // 36 healthy steps; the median of 1..36 / 10 + 0.65 is 2.5.
  for (int s = 1; s <= 36; ++s) ASSERT_TRUE(guard.push(s, 0.65 + s / 10.0).is_ok()) << s;
  EXPECT_TRUE(guard.push(37, 7.4).is_ok());  // 2.96 x the median: within the factor
  Status st = guard.push(38, 1.2e17);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 1);
  EXPECT_EQ(st.message(),
            "loss 1.2e+17 at step 38 exceeds training.loss_spike_factor 3 x the median 2.55 of "
            "the last 37 steps");
  // The spike did not join the window: the reference is still the healthy run's.
  EXPECT_EQ(guard.recent_losses().size(), 37u);
  EXPECT_FALSE(guard.push(39, 8.0).is_ok());
}

TEST(LossSpikeGuard, WaitsForMinWindowOrTenSteps) {
  LossSpikeGuard guard(10, 50);
  for (int s = 1; s <= 9; ++s) ASSERT_TRUE(guard.push(s, s == 5 ? 1e9 : 1.0).is_ok()) << s;
  ASSERT_TRUE(guard.push(10, 1.0).is_ok());  // 10 in the window now; median 1
  EXPECT_FALSE(guard.push(11, 10.5).is_ok());
  // A window shorter than 10 is full sooner.
  LossSpikeGuard small(10, 3);
  for (int s = 1; s <= 3; ++s) ASSERT_TRUE(small.push(s, 1.0).is_ok());
  EXPECT_FALSE(small.push(4, 11.0).is_ok());
}

TEST(LossSpikeGuard, TheMedianIsOfTheNewestWindowLosses) {
  LossSpikeGuard guard(2, 4);
  for (double l : {100.0, 100.0, 100.0, 100.0, 1.0, 1.0, 2.0, 3.0}) ASSERT_TRUE(guard.push(0, l).is_ok());
  EXPECT_EQ(guard.recent_losses(), (std::vector<double>{1.0, 1.0, 2.0, 3.0}));
  // Median of {1, 1, 2, 3} is 1.5 (mean of the middle two): 3.0 passes, 3.01 does not.
  EXPECT_TRUE(LossSpikeGuard(guard).push(9, 3.0).is_ok());
  Status st = guard.push(9, 3.01);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("the median 1.5 of the last 4 steps"), std::string::npos) << st.message();
}

TEST(LossSpikeGuard, NearZeroLossesNeedAnExcessOfOneNat) {
  LossSpikeGuard guard(10, 50);
  for (int s = 1; s <= 20; ++s) ASSERT_TRUE(guard.push(s, 0.02).is_ok());
  EXPECT_TRUE(guard.push(21, 0.5).is_ok());   // 25 x the median, but only 0.48 above it
  EXPECT_TRUE(guard.push(22, 1.0).is_ok());   // 50 x, 0.98 above
  EXPECT_FALSE(guard.push(23, 1.1).is_ok());
}

TEST(LossSpikeGuard, OffNeverFiresButKeepsTheWindow) {
  LossSpikeGuard guard(0, 5);
  EXPECT_FALSE(guard.enabled());
  for (int s = 1; s <= 20; ++s) ASSERT_TRUE(guard.push(s, s == 20 ? 1e30 : 1.0).is_ok());
  EXPECT_EQ(guard.recent_losses().size(), 5u);
  EXPECT_EQ(guard.recent_losses().back(), 1e30);
}

TEST(LossSpikeGuard, RestoreKeepsTheNewestWindow) {
  LossSpikeGuard guard(10, 3);
  guard.restore({5.0, 4.0, 3.0, 2.0, 1.0});
  EXPECT_EQ(guard.recent_losses(), (std::vector<double>{3.0, 2.0, 1.0}));
  EXPECT_FALSE(guard.push(6, 20.1).is_ok());  // a reference right after the restore
  guard.restore({});
  EXPECT_TRUE(guard.push(7, 1e9).is_ok());
}

TEST(LossSpikeGuard, AFallingHealthyCurveNeverFires) {
  // Loss from ln(256) down towards 1 with +-20% noise: the median lags above the loss.
  LossSpikeGuard guard(10, 50);
  for (int s = 1; s <= 2000; ++s) {
    const double loss = 1.0 + 4.55 * std::exp(-s / 300.0);
    ASSERT_TRUE(guard.push(s, loss * (s % 7 == 0 ? 1.2 : 0.9)).is_ok()) << s;
  }
}

// From the first step: a non-finite loss or gradient norm fails, even with the guard off.
TEST(LossSpikeGuard, NonFiniteFailsFromTheFirstStep) {
  for (double factor : {10.0, 0.0}) {
    LossSpikeGuard guard(factor, 50, 256);
    Status st = guard.push(1, std::nan(""), 3.0);
    ASSERT_FALSE(st.is_ok()) << factor;
    EXPECT_EQ(st.exit_code(), 1);
    EXPECT_EQ(st.message(), "loss nan (gradient norm 3) at step 1 is not finite");
    st = guard.push(1, 5.5, INFINITY);
    ASSERT_FALSE(st.is_ok()) << factor;
    EXPECT_EQ(st.message(), "loss 5.5 (gradient norm inf) at step 1 is not finite");
    EXPECT_TRUE(guard.recent_losses().empty());  // neither joined the window
  }
}

// Before the window holds its 10 losses: 3 x ln(vocab_size) bounds the loss.
TEST(LossSpikeGuard, AbsoluteBoundUntilTheWindowFills) {
  LossSpikeGuard guard(10, 50, 256);  // 3 x ln(256) = 16.6
  ASSERT_TRUE(guard.push(1, 5.6).is_ok());
  ASSERT_TRUE(guard.push(2, 16.5).is_ok());
  Status st = guard.push(3, 1e7);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 1);
  EXPECT_EQ(st.message(),
            "loss 1e+07 at step 3 exceeds 3 x ln(model.vocab_size) = 16.6, the bound while the "
            "guard has fewer than 10 steps in its window");
  for (int s = 3; s <= 10; ++s) ASSERT_TRUE(guard.push(s, 5.0).is_ok()) << s;
  // Now the median (5) is the reference: 17 is above the bound but within 10 x.
  EXPECT_TRUE(guard.push(11, 17.0).is_ok());
  // The guard off: no bound either. No vocabulary size: no bound.
  EXPECT_TRUE(LossSpikeGuard(0, 50, 256).push(1, 1e7).is_ok());
  EXPECT_TRUE(LossSpikeGuard(10, 50).push(1, 1e7).is_ok());
}

TEST(LossSpikeGuard, ResetRestartsTheWindowWithTheBound) {
  LossSpikeGuard guard(10, 50, 256);
  for (int s = 1; s <= 20; ++s) ASSERT_TRUE(guard.push(s, 0.2).is_ok());
  EXPECT_FALSE(LossSpikeGuard(guard).push(21, 4.0).is_ok());  // 20 x the old median
  guard.reset();
  EXPECT_TRUE(guard.recent_losses().empty());
  EXPECT_TRUE(guard.push(21, 4.0).is_ok());  // a new level, under the bound
  EXPECT_FALSE(guard.push(22, 1e7).is_ok());
}

}  // namespace
}  // namespace trident
