// Blends (data/blend.h, DataLoader::open_blend): the quotas, the greedy's bound on the
// mixture, and an order that depends only on the global counter (so not on dp, and
// resumable from it).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "data/blend.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

using testing::ScratchDir;

TEST(BlendQuotas, ExactDecimalRatios) {
  EXPECT_EQ(blend_quotas({0.7, 0.3}).value(), (std::vector<uint64_t>{7, 3}));
  EXPECT_EQ(blend_quotas({2, 2, 4}).value(), (std::vector<uint64_t>{1, 1, 2}));
  EXPECT_EQ(blend_quotas({0.25, 1e-5}).value(), (std::vector<uint64_t>{25000, 1}));
  // No small exact ratio: rounded at 2^20, every component keeps at least one.
  auto q = blend_quotas({0.123456789, 1, 1e-9}).value();
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[2], 1u);
  EXPECT_NEAR(static_cast<double>(q[0]) / q[1], 0.123456789, 1e-5);
}

TEST(BlendQuotas, BadWeightsNameTheEntry) {
  auto r = blend_quotas({1, 0});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(r.status().message().find("data.train[1].weight: must be a positive finite number"),
            std::string::npos)
      << r.status().message();
  EXPECT_FALSE(blend_quotas({}).is_ok());
}

// For every counter c over three periods: pick(c).index is the number of earlier picks
// of that component, and -1 < w_i·c - n_i(c) < k - 1 (< 1 for k = 2), checked exactly
// in integers (w_i = q_i / D).
void check_schedule(const std::vector<uint64_t>& quotas) {
  BlendSchedule s(quotas);
  const int64_t k = static_cast<int64_t>(quotas.size());
  const int64_t D = static_cast<int64_t>(s.period());
  std::vector<int64_t> n(quotas.size(), 0);
  for (int64_t c = 0; c <= 3 * D; ++c) {
    for (size_t i = 0; i < quotas.size(); ++i) {
      const int64_t scaled = static_cast<int64_t>(quotas[i]) * c - D * n[i];  // D·(w_i c - n_i)
      ASSERT_GT(scaled, -D) << "component " << i << " at " << c;
      ASSERT_LT(scaled, (k == 2 ? 1 : k - 1) * D) << "component " << i << " at " << c;
      if (c % D == 0) {
        ASSERT_EQ(scaled, 0);
      }
    }
    if (c == 3 * D) break;
    const BlendSchedule::Pick p = s.pick(static_cast<uint64_t>(c));
    ASSERT_EQ(p.index, static_cast<uint64_t>(n[static_cast<size_t>(p.component)])) << c;
    ++n[static_cast<size_t>(p.component)];
  }
}

TEST(BlendSchedule, MixtureWithinTheGreedysBound) {
  check_schedule({7, 3});
  check_schedule({1, 1});
  check_schedule({1, 999});
  check_schedule({1, 3, 1, 1, 95, 1, 1, 3, 3, 119, 3, 3});  // falls > 1 behind: still < k - 1
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint64_t> q(2 + rng() % 6);
    for (auto& v : q) v = 1 + rng() % 50;
    SCOPED_TRACE(trial);
    check_schedule(q);
  }
}

TEST(BlendSchedule, WeightsAsWrittenGiveTheirMixture) {
  auto s = BlendSchedule::from_weights({0.7, 0.3}).value();
  EXPECT_EQ(s.period(), 10u);
  int a = 0;
  for (uint64_t c = 0; c < 1000; ++c) a += s.pick(c).component == 0;
  EXPECT_EQ(a, 700);
}

class BlendLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    // Dataset a holds ids 0..99, b ids 100..199: a sample's first id says where it came from.
    std::vector<uint32_t> a(2000), b(3000);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint32_t>(i % 100);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint32_t>(100 + (i * 7) % 100);
    ASSERT_TRUE(write_token_file(dir_.file("a.bin"), a, 1).is_ok());
    ASSERT_TRUE(write_token_file(dir_.file("b.bin"), b, 7).is_ok());
  }
  DataLoader open(bool shuffle) {
    auto l = DataLoader::open_blend({{dir_.file("a.bin"), 0.7}, {dir_.file("b.bin"), 0.3}}, 256,
                                    1234, shuffle);
    EXPECT_TRUE(l.is_ok()) << l.status().message();
    return std::move(l).value();
  }
  ScratchDir dir_;
};

constexpr int kT = 8;

// Inputs of counters [first, first + count) read with load(first, count).
std::vector<int32_t> inputs(const DataLoader& l, uint64_t first, int count) {
  std::vector<int32_t> in(static_cast<size_t>(count) * kT), tg(in.size());
  EXPECT_TRUE(l.load(first, count, kT, in.data(), tg.data()).is_ok());
  return in;
}

TEST_F(BlendLoader, ProportionsMatchTheWeights) {
  for (bool shuffle : {false, true}) {
    DataLoader l = open(shuffle);
    EXPECT_EQ(l.num_samples(kT).value(), 1999u / kT + 2999u / kT);
    const int N = 1003;
    const std::vector<int32_t> in = inputs(l, 0, N);
    int from_a = 0;
    for (int i = 0; i < N; ++i) from_a += in[static_cast<size_t>(i) * kT] < 100;
    EXPECT_LT(std::abs(from_a - 0.7 * N), 1.0) << from_a;  // k = 2: |n - w·N| < 1
  }
}

TEST_F(BlendLoader, OrderIsTheSameForAnyDpAndResumesFromTheCounter) {
  DataLoader l = open(true);
  const uint64_t G = 8, mb = 2;
  const int steps = 60;  // past the end of a component's epoch (249 samples of a)
  std::vector<int32_t> single, dp2;
  for (int s = 0; s < steps; ++s) {
    for (uint64_t m = 0; m < G / mb; ++m) {
      const CounterRange r = micro_batch_range(s, G, 1, 0, mb, m);
      auto v = inputs(l, r.first, static_cast<int>(r.count));
      single.insert(single.end(), v.begin(), v.end());
    }
    for (int rank = 0; rank < 2; ++rank) {
      for (uint64_t m = 0; m < G / 2 / mb; ++m) {
        const CounterRange r = micro_batch_range(s, G, 2, rank, mb, m);
        auto v = inputs(l, r.first, static_cast<int>(r.count));
        dp2.insert(dp2.end(), v.begin(), v.end());
      }
    }
  }
  EXPECT_EQ(single, dp2);
  EXPECT_EQ(single, inputs(l, 0, steps * static_cast<int>(G)));
  // A loader opened afresh (a resumed run) continues at any counter.
  DataLoader resumed = open(true);
  const std::vector<int32_t> tail = inputs(resumed, 3 * G, static_cast<int>(G) * (steps - 3));
  EXPECT_EQ(tail, std::vector<int32_t>(single.begin() + 3 * G * kT, single.end()));
}

TEST_F(BlendLoader, ComponentErrorsNameTheEntry) {
  auto l = DataLoader::open_blend({{dir_.file("a.bin"), 1}, {dir_.file("missing.bin"), 1}}, 256, 1,
                                  true);
  ASSERT_FALSE(l.is_ok());
  EXPECT_NE(l.status().message().find("data.train[1] (" + dir_.file("missing.bin") + "): "),
            std::string::npos)
      << l.status().message();
  DataLoader ok = open(false);
  std::vector<int32_t> in(kT), tg(kT);
  Status st = ok.load_sequential(0, 1, kT, in.data(), tg.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidConfig);
}

}  // namespace
}  // namespace trident
