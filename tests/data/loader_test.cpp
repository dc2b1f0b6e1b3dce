#include "data/loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "data/token_file.h"

#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

using TempDir = testing::ScratchDir;

constexpr int64_t kVocab = 97;

// A stream with no repeating structure, split into three shards of uneven size.
std::vector<uint32_t> write_stream(const TempDir& dir, size_t n) {
  std::vector<uint32_t> stream(n);
  for (size_t i = 0; i < n; ++i) stream[i] = static_cast<uint32_t>((i * i * 31 + i * 7 + 3) % kVocab);
  const size_t cut1 = n / 3 + 1, cut2 = n / 2 + 5;
  EXPECT_TRUE(write_token_file(dir.file("t_0.bin"),
                               {stream.begin(), stream.begin() + cut1}, 1).is_ok());
  EXPECT_TRUE(write_token_file(dir.file("t_1.bin"),
                               {stream.begin() + cut1, stream.begin() + cut2}, 7).is_ok());
  EXPECT_TRUE(write_token_file(dir.file("t_2.bin"), {stream.begin() + cut2, stream.end()}, 1)
                  .is_ok());
  return stream;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch load(const DataLoader& loader, uint64_t first, int count, int T) {
  Batch b{std::vector<int32_t>(static_cast<size_t>(count) * T),
          std::vector<int32_t>(static_cast<size_t>(count) * T)};
  Status st = loader.load(first, count, T, b.inputs.data(), b.targets.data());
  EXPECT_TRUE(st.is_ok()) << st.message();
  return b;
}

TEST(DataLoader, SequentialSamplesFollowTheDesignDefinition) {
  TempDir dir;
  const int T = 8;
  const std::vector<uint32_t> stream = write_stream(dir, 203);  // (203-1)/8 = 25 samples
  auto loader = DataLoader::open(dir.path(), kVocab, 1234, /*shuffle=*/false);
  ASSERT_TRUE(loader.is_ok()) << loader.status().message();
  ASSERT_EQ(loader->num_samples(T).value(), 25u);

  // 60 counters: two full epochs and a bit; counter g reads sample g % 25.
  const int count = 60;
  Batch b = load(loader.value(), 0, count, T);
  for (int g = 0; g < count; ++g) {
    const size_t k = static_cast<size_t>(g % 25);
    for (int j = 0; j < T; ++j) {
      ASSERT_EQ(b.inputs[g * T + j], static_cast<int32_t>(stream[k * T + j])) << g << "," << j;
      ASSERT_EQ(b.targets[g * T + j], static_cast<int32_t>(stream[k * T + j + 1])) << g << "," << j;
    }
  }
}

TEST(DataLoader, ShuffledEpochCoversEveryWindowOnce) {
  TempDir dir;
  const int T = 4;
  const std::vector<uint32_t> stream = write_stream(dir, 401);  // 100 samples
  auto loader = DataLoader::open(dir.path(), kVocab, 99, /*shuffle=*/true);
  ASSERT_TRUE(loader.is_ok());
  GlobalSampler sampler(100, 99, true);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    Batch b = load(loader.value(), epoch * 100, 100, T);
    std::set<uint64_t> seen;
    for (int i = 0; i < 100; ++i) {
      const uint64_t k = sampler.sample_index(epoch * 100 + i);
      seen.insert(k);
      for (int j = 0; j < T; ++j) {
        ASSERT_EQ(b.inputs[i * T + j], static_cast<int32_t>(stream[k * T + j]));
        ASSERT_EQ(b.targets[i * T + j], static_cast<int32_t>(stream[k * T + j + 1]));
      }
    }
    EXPECT_EQ(seen.size(), 100u);
  }
}

TEST(DataLoader, DataParallelRanksTogetherReadTheGlobalBatch) {
  TempDir dir;
  const int T = 5;
  write_stream(dir, 1000);
  auto loader = DataLoader::open(dir.path(), kVocab, 5, /*shuffle=*/true);
  ASSERT_TRUE(loader.is_ok());
  const uint64_t global_batch = 8;
  for (uint64_t step = 0; step < 30; ++step) {  // crosses an epoch (199 samples)
    Batch global = load(loader.value(), step * global_batch, global_batch, T);
    for (int dp : {1, 2, 4}) {
      const uint64_t micro = global_batch / dp / (dp == 4 ? 1 : 2);
      std::vector<int32_t> inputs, targets;
      for (int r = 0; r < dp; ++r) {
        const uint64_t n_micro = global_batch / dp / micro;
        for (uint64_t m = 0; m < n_micro; ++m) {
          CounterRange mb = micro_batch_range(step, global_batch, dp, r, micro, m);
          Batch b = load(loader.value(), mb.first, static_cast<int>(mb.count), T);
          inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
          targets.insert(targets.end(), b.targets.begin(), b.targets.end());
        }
      }
      EXPECT_EQ(inputs, global.inputs) << "dp=" << dp << " step=" << step;
      EXPECT_EQ(targets, global.targets) << "dp=" << dp << " step=" << step;
    }
  }
}

TEST(DataLoader, ResumingFromConsumedSamplesContinuesTheSameOrder) {
  TempDir dir;
  const int T = 6;
  write_stream(dir, 500);
  const uint64_t global_batch = 12, steps = 20, stop_at = 7;
  std::vector<int32_t> uninterrupted;
  {
    auto loader = DataLoader::open(dir.path(), kVocab, 77, true);
    ASSERT_TRUE(loader.is_ok());
    for (uint64_t s = 0; s < steps; ++s) {
      Batch b = load(loader.value(), s * global_batch, global_batch, T);
      uninterrupted.insert(uninterrupted.end(), b.inputs.begin(), b.inputs.end());
    }
  }
  // A fresh process that knows only the consumed-samples counter of its checkpoint.
  const uint64_t consumed = stop_at * global_batch;
  std::vector<int32_t> resumed(uninterrupted.begin(),
                               uninterrupted.begin() + static_cast<long>(consumed * T));
  auto loader = DataLoader::open(dir.path(), kVocab, 77, true);
  ASSERT_TRUE(loader.is_ok());
  for (uint64_t counter = consumed; counter < steps * global_batch; counter += global_batch) {
    Batch b = load(loader.value(), counter, global_batch, T);
    resumed.insert(resumed.end(), b.inputs.begin(), b.inputs.end());
  }
  EXPECT_EQ(resumed, uninterrupted);
  // A different seed would not have continued the same way.
  auto other = DataLoader::open(dir.path(), kVocab, 78, true);
  EXPECT_NE(load(other.value(), consumed, global_batch, T).inputs,
            load(loader.value(), consumed, global_batch, T).inputs);
}

TEST(DataLoader, ValidationReadsFromTheStartAndWraps) {
  TempDir dir;
  const int T = 10;
  const std::vector<uint32_t> stream = write_stream(dir, 31);  // 3 samples
  auto loader = DataLoader::open(dir.path(), kVocab, 1, /*shuffle=*/true);  // ignored
  ASSERT_TRUE(loader.is_ok());
  std::vector<int32_t> in(5 * T), tg(5 * T);
  ASSERT_TRUE(loader->load_sequential(0, 5, T, in.data(), tg.data()).is_ok());
  for (int i = 0; i < 5; ++i) {
    const size_t k = static_cast<size_t>(i % 3);
    for (int j = 0; j < T; ++j) {
      ASSERT_EQ(in[i * T + j], static_cast<int32_t>(stream[k * T + j]));
      ASSERT_EQ(tg[i * T + j], static_cast<int32_t>(stream[k * T + j + 1]));
    }
  }
}

TEST(DataLoader, ErrorsNameTheData) {
  TempDir dir;
  write_stream(dir, 31);
  auto loader = DataLoader::open(dir.path(), kVocab, 1, false);
  ASSERT_TRUE(loader.is_ok());
  std::vector<int32_t> in(64), tg(64);
  Status st = loader->load(0, 1, 30, in.data(), tg.data());  // needs 31 tokens: ok
  EXPECT_TRUE(st.is_ok()) << st.message();
  st = loader->load(0, 1, 31, in.data(), tg.data());  // needs 32 tokens
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message().rfind(dir.path() + ": ", 0), 0u) << st.message();

  // A model with a smaller vocabulary than the data.
  auto small = DataLoader::open(dir.path(), 10, 1, false);
  ASSERT_TRUE(small.is_ok());
  st = small->load(0, 1, 8, in.data(), tg.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("t_0.bin: token at position"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(">= vocab size 10"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trident
