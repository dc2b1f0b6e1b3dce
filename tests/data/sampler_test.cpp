#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

namespace trident {
namespace {

std::vector<uint64_t> epoch_order(const GlobalSampler& s, uint64_t epoch) {
  std::vector<uint64_t> order(s.num_samples());
  for (uint64_t p = 0; p < s.num_samples(); ++p) {
    order[p] = s.sample_index(epoch * s.num_samples() + p);
  }
  return order;
}

bool is_permutation_of_range(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  for (uint64_t i = 0; i < v.size(); ++i) {
    if (v[i] != i) return false;
  }
  return true;
}

TEST(NumSamples, FollowsTheWindowDefinition) {
  EXPECT_EQ(num_samples_for(1025, 64, "d").value(), 16u);  // last window ends at token 1024
  EXPECT_EQ(num_samples_for(1024, 64, "d").value(), 15u);  // token 1024 missing: 15 windows
  EXPECT_EQ(num_samples_for(65, 64, "d").value(), 1u);
  auto none = num_samples_for(64, 64, "train.bin");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(none.status().message().rfind("train.bin: ", 0), 0u);
  EXPECT_FALSE(num_samples_for(0, 64, "d").is_ok());
}

TEST(GlobalSampler, UnshuffledIsTheIdentityAcrossEpochs) {
  GlobalSampler s(7, 123, false);
  for (uint64_t g = 0; g < 50; ++g) {
    EXPECT_EQ(s.sample_index(g), g % 7);
    EXPECT_EQ(s.epoch(g), g / 7);
  }
}

TEST(GlobalSampler, ShuffledIsAPermutationEveryEpoch) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 16u, 17u, 100u, 1000u, 1024u, 1025u, 4097u}) {
    GlobalSampler s(n, 42, true);
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      EXPECT_TRUE(is_permutation_of_range(epoch_order(s, epoch))) << "n=" << n;
    }
  }
}

TEST(GlobalSampler, OrderDependsOnlyOnSeedAndEpoch) {
  const uint64_t n = 1000;
  GlobalSampler a(n, 42, true), b(n, 42, true), other_seed(n, 43, true);
  const auto a0 = epoch_order(a, 0), a1 = epoch_order(a, 1);
  EXPECT_EQ(a0, epoch_order(b, 0));  // same seed, separate instance
  EXPECT_EQ(a1, epoch_order(b, 1));
  EXPECT_NE(a0, a1);                 // epochs differ
  EXPECT_NE(a0, epoch_order(other_seed, 0));
  // Actually shuffled, not a near-identity: few fixed points.
  std::vector<uint64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  int fixed = 0;
  for (uint64_t i = 0; i < n; ++i) fixed += a0[i] == i;
  EXPECT_LT(fixed, 10);
  // Random access: counters read out of order give the same answer.
  for (uint64_t g : {5000u, 17u, 2999u, 0u}) EXPECT_EQ(a.sample_index(g), b.sample_index(g));
}

TEST(GlobalSampler, FirstPositionIsRoughlyUniformOverEpochs) {
  // Where sample position 0 lands, over many epochs: each of 10 slots about 1/10.
  const uint64_t n = 10, epochs = 4000;
  GlobalSampler s(n, 7, true);
  std::vector<int> hits(n, 0);
  for (uint64_t e = 0; e < epochs; ++e) ++hits[s.sample_index(e * n)];
  for (uint64_t j = 0; j < n; ++j) {
    EXPECT_GT(hits[j], 300) << j;  // expected 400, sd 19
    EXPECT_LT(hits[j], 500) << j;
  }
}

TEST(GlobalSampler, WorksForBillionsOfSamples) {
  const uint64_t n = 3'000'000'017ull;
  GlobalSampler s(n, 1, true);
  std::set<uint64_t> seen;
  for (uint64_t g = 0; g < 2000; ++g) {
    const uint64_t idx = s.sample_index(g);
    ASSERT_LT(idx, n);
    seen.insert(idx);
  }
  EXPECT_EQ(seen.size(), 2000u);  // a permutation has no repeats
  const uint64_t huge = (1ull << 63) + 5;
  GlobalSampler h(huge, 1, true);
  EXPECT_LT(h.sample_index(123456789), huge);
}

TEST(DataParallelSlices, UnionIsTheGlobalBatchForEveryDp) {
  const uint64_t global_batch = 8;
  for (int dp : {1, 2, 4}) {
    for (uint64_t step = 0; step < 5; ++step) {
      std::vector<uint64_t> from_ranks;
      for (int r = 0; r < dp; ++r) {
        CounterRange slice = dp_slice(step, global_batch, dp, r);
        EXPECT_EQ(slice.count, global_batch / dp);
        // Micro-batches of 1 and of the whole slice walk the slice in order.
        std::vector<uint64_t> by_micro;
        for (uint64_t m = 0; m < slice.count; ++m) {
          CounterRange mb = micro_batch_range(step, global_batch, dp, r, 1, m);
          by_micro.push_back(mb.first);
        }
        for (uint64_t i = 0; i < slice.count; ++i) {
          EXPECT_EQ(by_micro[i], slice.first + i);
          from_ranks.push_back(slice.first + i);
        }
      }
      CounterRange global = global_batch_range(step, global_batch);
      std::vector<uint64_t> expected(global.count);
      std::iota(expected.begin(), expected.end(), global.first);
      EXPECT_EQ(from_ranks, expected) << "dp=" << dp << " step=" << step;
    }
  }
  EXPECT_EQ(micro_batch_range(3, 8, 2, 1, 2, 1), (CounterRange{3 * 8 + 4 + 2, 2}));
}

}  // namespace
}  // namespace trident
