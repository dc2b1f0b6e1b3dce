// exp_fast (kernels/cpu/cpu_util.h), used by the softmaxes: accuracy against double exp.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

TEST(CpuExpFast, WithinAFewUlpOfExp) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;  // [-87, 88]
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_fast(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_EQ(exp_fast(-100.0f), 0.0f);
  EXPECT_EQ(exp_fast(-1e30f), 0.0f);
}

}  // namespace
}  // namespace trident::cpu
