// The per-step least waits of each group's members (the metrics' comm_exposed_least_ms,
// comm_total_least_ms, and per collective kind comm_kind_least_ms) over a real MPI world:
// checked against the minimum taken here over the ranks' own figures, against the
// collectives each layout makes, and read back from the metrics file of a run.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string least_data_file() {
  static const std::string path = test::write_test_tokens("least_waits", 5, 59);
  return path;
}

// tp 2 and dp over the rest of an even world (or `layout`), 2 micro-batches per dp rank
// and step; `logging`: the logging section's keys; `parallel`: more keys of the parallel
// section.
std::unique_ptr<Trainer> make_trainer(const std::string& logging,
                                      ParallelLayout layout = {test::world().size() / 2, 2, 1},
                                      int zero_stage = 0, const std::string& parallel = "") {
  static int trainers = 0;
  auto config = parse_config(
      test::small_model_yaml("gpt2") + test::parallel_yaml(layout, zero_stage, parallel) +
          "data: {train: " + least_data_file() +
          "}\ntraining: {global_batch_size: " + std::to_string(2 * layout.dp) +
          ", max_steps: 3}\ncheckpoint: {dir: " +
          least_data_file() + ".ckpt" + std::to_string(++trainers) +
          ", save_final: false}\nlogging: {" + logging + "}\n",
      {});
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  if (!config.is_ok()) return nullptr;
  return testing::make_test_trainer(config.value(), testing::test_trainer_options(&test::world()));
}

// The smallest of x over the ranks.
double world_min(double x) {
  double neg = -x;
  test::world().all_reduce(CommBuf::host(std::span<double>(&neg, 1)), ReduceOp::kMax);
  return -neg;
}

// The smallest over the ranks of each of this rank's per-kind figures, per group.
std::array<StepMetrics::KindMs, 7> world_min(const std::array<StepMetrics::KindMs, 7>& own) {
  std::array<double, 7 * StepMetrics::KindMs::kCount> neg;
  for (size_t g = 0; g < 7; ++g) {
    for (size_t k = 0; k < StepMetrics::KindMs::kCount; ++k) {
      neg[StepMetrics::KindMs::kCount * g + k] = -own[g].values()[k];
    }
  }
  test::world().all_reduce(CommBuf::host(std::span<double>(neg)), ReduceOp::kMax);
  std::array<StepMetrics::KindMs, 7> least;
  for (size_t g = 0; g < 7; ++g) {
    std::array<double, StepMetrics::KindMs::kCount> v;
    for (size_t k = 0; k < v.size(); ++k) v[k] = -neg[StepMetrics::KindMs::kCount * g + k];
    least[g] = StepMetrics::KindMs::of(v);
  }
  return least;
}

// The dp group's per-kind least figures (comm_kind_least_ms[1]) in each of three steps of
// a run at `zero_stage` on dp 2 (tp 2 at 4 ranks and more; dp 4 at 8) with overlap off:
// every dp collective is a blocking call of its own kind.
std::vector<StepMetrics::KindMs> dp_kind_least_of_steps(int zero_stage) {
  const int tp = test::world().size() > 2 ? 2 : 1;
  auto trainer = make_trainer(
      "metrics: " + least_data_file() + ".zero" + std::to_string(zero_stage) + ".jsonl",
      {test::world().size() / tp, tp, 1}, zero_stage,
      ", overlap_grad_reduce: false, overlap_param_gather: false");
  EXPECT_NE(trainer, nullptr);
  std::vector<StepMetrics::KindMs> steps;
  for (int s = 1; trainer && s <= 3; ++s) {
    const Result<StepMetrics> step = trainer->train_step();
    EXPECT_TRUE(step.is_ok()) << step.status().message();
    if (!step.is_ok()) break;
    EXPECT_TRUE(step.value().has_least);
    steps.push_back(step.value().comm_kind_least_ms[1]);
  }
  EXPECT_EQ(steps.size(), 3u);
  return steps;
}

TEST(LeastWaits, AreTheMinimumOverTheRanksOfEachRanksOwn) {
  Communicator& world = test::world();
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even world (tp 2)";
  auto trainer = make_trainer("metrics: " + least_data_file() + ".least.jsonl");
  ASSERT_NE(trainer, nullptr);
  for (int s = 1; s <= 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    const Result<StepMetrics> step = trainer->train_step();
    ASSERT_TRUE(step.is_ok()) << step.status().message();
    const StepMetrics& m = step.value();
    ASSERT_TRUE(m.has_least);
    const double tp = m.comm_exposed_ms.tp;
    EXPECT_GT(world_min(tp), 0.0);  // every rank waits in its tp all-reduces
    EXPECT_DOUBLE_EQ(m.comm_exposed_least_ms.tp, world_min(tp));
    EXPECT_DOUBLE_EQ(m.comm_total_least_ms.tp, world_min(tp + m.comm_hidden_ms.tp));
    EXPECT_LE(m.comm_exposed_least_ms.tp, tp);
    const double dp = m.comm_exposed_ms.dp;
    EXPECT_DOUBLE_EQ(m.comm_exposed_least_ms.dp, world.size() > 2 ? world_min(dp) : 0.0);
    EXPECT_EQ(m.comm_exposed_least_ms.pp, 0.0);  // no pipeline group of more than one rank
    // Per collective kind: each call's least over the group's ranks, summed. At most the
    // least of the ranks' own sums of the kind (the least of a sum is at least the sum of
    // the least), and in all at most the least total; each rank's own split is part of
    // its total.
    const RankStats& stats = trainer->last_step_stats();
    const std::array<StepMetrics::KindMs, 7>& own = stats.comm_kind_ms;
    const std::array<StepMetrics::KindMs, 7> least = world_min(own);
    const std::array<double, 7> exposed = m.comm_exposed_ms.values();
    const std::array<double, 7> hidden = m.comm_hidden_ms.values();
    const std::array<double, 7> total_least = m.comm_total_least_ms.values();
    for (size_t g = 0; g < 7; ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      double sum = 0, least_sum = 0;
      for (size_t k = 0; k < StepMetrics::KindMs::kCount; ++k) {
        EXPECT_LE(m.comm_kind_least_ms[g].values()[k], least[g].values()[k] + 1e-9) << "kind " << k;
        EXPECT_GE(m.comm_kind_least_ms[g].values()[k], 0.0) << "kind " << k;
        EXPECT_GE(own[g].values()[k], 0.0) << "kind " << k;
        sum += own[g].values()[k];
        least_sum += m.comm_kind_least_ms[g].values()[k];
      }
      EXPECT_LE(sum, exposed[g] + hidden[g] + 1e-6);
      EXPECT_LE(least_sum, total_least[g] + 1e-6);
    }
    // On 2 ranks the tp group is the world: its all-reduce figure is the sum over the
    // calls of the two ranks' least, taken here from each rank's own calls.
    const std::vector<CommTimes::Call>& calls = stats.comm_calls[0];
    if (world.size() == 2) {
      std::vector<double> neg(calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(calls[i].kind, CollectiveKind::kAllReduce);
        neg[i] = -calls[i].seconds;
      }
      world.all_reduce(CommBuf::host(std::span<double>(neg)), ReduceOp::kMax);
      double expect = 0;
      for (const double x : neg) expect -= x * 1e3;
      EXPECT_NEAR(m.comm_kind_least_ms[0].all_reduce, expect, 1e-9 * expect);
      EXPECT_GT(calls.size(), 4u);  // per layer, micro-batch and pass, and the loss's
    }
    EXPECT_GT(m.comm_kind_least_ms[0].all_reduce, 0.0);  // tp 2 without sequence parallelism
    EXPECT_EQ(m.comm_kind_least_ms[2].all_reduce, 0.0);  // no pipeline group
  }
}

// ZeRO-1 reduce-scatters the gradients and all-gathers the parameters over dp: no dp
// all-reduce (the norm and the loss go over the world). ZeRO-0 all-reduces the gradients
// over dp, nothing else.
TEST(LeastWaits, PerKindFollowTheZeroStagesCollectives) {
  if (test::world().size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  for (const StepMetrics::KindMs& dp : dp_kind_least_of_steps(1)) {
    EXPECT_GT(dp.reduce_scatter, 0.0);
    EXPECT_GT(dp.all_gather, 0.0);
    EXPECT_EQ(dp.all_reduce, 0.0);
  }
  for (const StepMetrics::KindMs& dp : dp_kind_least_of_steps(0)) {
    EXPECT_GT(dp.all_reduce, 0.0);
    EXPECT_EQ(dp.reduce_scatter, 0.0);
    EXPECT_EQ(dp.all_gather, 0.0);
  }
}

TEST(LeastWaits, TheMetricsFileHoldsThemForEveryStep) {
  Communicator& world = test::world();
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even world (tp 2)";
  const std::string metrics = least_data_file() + ".file.jsonl";
  if (world.rank() == 0) std::remove(metrics.c_str());
  world.barrier();  // removed before any rank's trainer opens it
  auto trainer = make_trainer("metrics: " + metrics);
  ASSERT_NE(trainer, nullptr);
  ASSERT_TRUE(trainer->run().is_ok());
  if (world.rank() != 0) return;
  std::ifstream in(metrics);
  std::string line;
  int records = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("step_ms")) continue;
    ++records;
    ASSERT_TRUE(j.contains("comm_exposed_least_ms")) << line;
    ASSERT_TRUE(j.contains("comm_total_least_ms")) << line;
    const double least = j["comm_exposed_least_ms"]["tp"].get<double>();
    EXPECT_GT(least, 0.0) << line;
    EXPECT_LE(least, j["comm_exposed_ms"]["tp"].get<double>()) << line;
    EXPECT_GE(j["comm_total_least_ms"]["tp"].get<double>(), least) << line;
    // Per group and collective kind, in GroupMs' order; tp 2 all-reduces.
    ASSERT_TRUE(j.contains("comm_kind_least_ms")) << line;
    const nlohmann::json& kinds = j["comm_kind_least_ms"];
    ASSERT_EQ(kinds.size(), 7u) << line;
    for (const char* group : {"tp", "dp", "pp", "embedding", "cp", "ep", "expert_dp"}) {
      ASSERT_TRUE(kinds.contains(group)) << group << ": " << line;
      ASSERT_EQ(kinds[group].size(), 3u) << group << ": " << line;
      for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) {
        ASSERT_TRUE(kinds[group].contains(kind)) << group << " " << kind << ": " << line;
        EXPECT_GE(kinds[group][kind].get<double>(), 0.0) << group << " " << kind << ": " << line;
      }
    }
    EXPECT_GT(kinds["tp"]["all_reduce"].get<double>(), 0.0) << line;
  }
  EXPECT_EQ(records, 3);
}

}  // namespace
}  // namespace trident
