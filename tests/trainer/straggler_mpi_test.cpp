// The step's slowest rank (trainer/straggler.h) over a real MPI world: the last rank, made
// slow by a sleep inside its compute (an Ops wrapper), is every step's slowest; its busy
// time holds the sleep and the median rank's does not (the others' wait for it is exposed
// communication, which the busy time leaves out); every rank gets the same figures; one
// rank has no record; and gathering the busy times changes no training bit.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kernels/forwarding_ops.h"
#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

constexpr double kSleepMs = 100;

std::string straggler_data_file() {
  static const std::string path = test::write_test_tokens("straggler", 7, 61);
  return path;
}

// Owns the inner backend before ForwardingOps refers to it (base-from-member).
struct InnerOps {
  std::unique_ptr<Ops> inner = make_cpu_ops(1);
};

// Sleeps kSleepMs in every embedding forward (once per micro-batch on a first stage).
class SlowOps final : private InnerOps, public testing::ForwardingOps {
 public:
  SlowOps() : ForwardingOps(*inner) {}
  void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T, int C,
                         int vocab_begin, int vocab_local) override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kSleepMs));
    ForwardingOps::embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
  }
};

// dp over the whole world (or `layout`), one micro-batch per dp rank and step; `logging`
// the keys of the logging section; `slow`: this rank computes through SlowOps.
std::unique_ptr<Trainer> make_trainer(const std::string& logging, bool slow,
                                      ParallelLayout layout = {}) {
  static int trainers = 0;
  const int n = test::world().size();
  if (layout.world_size() == 1) layout = {n, 1, 1};
  auto config = parse_config(
      test::small_model_yaml("gpt2") + test::parallel_yaml(layout, 0) + "data: {train: " +
          straggler_data_file() + "}\ntraining: {global_batch_size: " + std::to_string(layout.dp) +
          ", max_steps: 3}\ncheckpoint: {dir: " + straggler_data_file() + ".ckpt" +
          std::to_string(++trainers) + ", save_final: false}\nlogging: {metrics: ''" + logging +
          "}\n",
      {});
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  if (!config.is_ok()) return nullptr;
  TrainerOptions options = testing::test_trainer_options(&test::world());
  if (slow) {
    options.make_ops = []() -> Result<std::unique_ptr<Ops>> {
      return std::unique_ptr<Ops>(new SlowOps());
    };
  }
  return testing::make_test_trainer(config.value(), options);
}

// The largest and the smallest of x over the ranks.
std::pair<double, double> world_range(double x) {
  double hi = x, neg = -x;
  test::world().all_reduce(CommBuf::host(std::span<double>(&hi, 1)), ReduceOp::kMax);
  test::world().all_reduce(CommBuf::host(std::span<double>(&neg, 1)), ReduceOp::kMax);
  return {hi, -neg};
}

TEST(Straggler, TheSleepingRankIsTheSlowestOfEveryStep) {
  Communicator& world = test::world();
  const int n = world.size();
  const int slow_rank = n - 1;
  auto trainer = make_trainer("", world.rank() == slow_rank);
  ASSERT_NE(trainer, nullptr);
  for (int s = 1; s <= 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const Result<StepMetrics> step = trainer->train_step();
    ASSERT_TRUE(step.is_ok()) << step.status().message();
    const StepMetrics& m = step.value();
    if (n == 1) {
      EXPECT_FALSE(m.has_slowest);  // nobody to be slower than
      continue;
    }
    ASSERT_TRUE(m.has_slowest);
    EXPECT_EQ(m.slowest_rank, slow_rank);
    EXPECT_EQ(m.slowest_host, "");  // no watchdog, no host names
    EXPECT_GE(m.slowest_busy_ms, kSleepMs);
    // Its own step holds its busy time (each rank times its own step, from its own start).
    if (world.rank() == slow_rank) {
      EXPECT_LE(m.slowest_busy_ms, m.step_ms + 1e-9);
    }
    // The median rank is a fast one: its step lasted as long, but it spent the sleep
    // waiting in the data-parallel reduction, which is not busy time.
    EXPECT_LT(m.median_busy_ms, m.slowest_busy_ms - kSleepMs / 2);
    EXPECT_GE(m.median_busy_ms, 0.0);
    EXPECT_DOUBLE_EQ(m.slowest_ratio, m.slowest_busy_ms / m.median_busy_ms);
    if (world.rank() != slow_rank) {
      EXPECT_GT(m.comm_exposed_ms.dp, kSleepMs / 2);  // it waited for the slow one
    }
    // Gathered to every rank: the same figures everywhere.
    const auto [hi, lo] = world_range(m.slowest_busy_ms);
    EXPECT_EQ(hi, lo);
    const auto [mhi, mlo] = world_range(m.median_busy_ms);
    EXPECT_EQ(mhi, mlo);
  }
}

// Context parallelism: the fast cp ranks wait for the slow one in the ring's exchanges
// (and in the dp x cp gradient reduction); those waits are communication, not busy time,
// so the slow rank is still the slowest by about its sleep.
TEST(Straggler, RingWaitsAreNotBusyTime) {
  Communicator& world = test::world();
  const int n = world.size();
  if (n < 2) GTEST_SKIP() << "needs cp 2";
  ParallelLayout l{n == 8 ? 2 : 1, 1, 1};
  l.cp = n / l.dp;
  const int slow_rank = n - 1;
  auto trainer = make_trainer("", world.rank() == slow_rank, l);
  ASSERT_NE(trainer, nullptr);
  for (int s = 1; s <= 2; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const Result<StepMetrics> step = trainer->train_step();
    ASSERT_TRUE(step.is_ok()) << step.status().message();
    const StepMetrics& m = step.value();
    ASSERT_TRUE(m.has_slowest);
    EXPECT_EQ(m.slowest_rank, slow_rank);
    EXPECT_GE(m.slowest_busy_ms, kSleepMs);
    EXPECT_LT(m.median_busy_ms, m.slowest_busy_ms - kSleepMs / 2);
    // The slow rank's ring neighbour waited for it in the ring (its layer-0 receive).
    if (world.rank() == (slow_rank + 1) % l.cp + (slow_rank / l.cp) * l.cp) {
      EXPECT_GT(m.comm_exposed_ms.cp, kSleepMs / 2);
    }
  }
}

TEST(Straggler, GatheringTheBusyTimesChangesNoTrainingBit) {
  // Off: no metrics file and no warning, so no gather; on: the default factor.
  auto off = make_trainer(", straggler_factor: 0", false);
  ASSERT_NE(off, nullptr);
  std::vector<StepMetrics> without;
  for (int s = 0; s < 3; ++s) {
    auto m = off->train_step();
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    EXPECT_FALSE(m.value().has_slowest);
    without.push_back(m.value());
  }
  off.reset();
  auto on = make_trainer("", false);
  ASSERT_NE(on, nullptr);
  for (int s = 0; s < 3; ++s) {
    auto m = on->train_step();
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    EXPECT_EQ(m.value().has_slowest, test::world().size() > 1);
    EXPECT_EQ(m.value().loss, without[static_cast<size_t>(s)].loss) << "step " << s + 1;
    EXPECT_EQ(m.value().grad_norm, without[static_cast<size_t>(s)].grad_norm) << "step " << s + 1;
  }
}

}  // namespace
}  // namespace trident
