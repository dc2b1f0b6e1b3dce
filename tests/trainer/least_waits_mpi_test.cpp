// The per-step least waits of each group's members (the metrics' comm_exposed_least_ms,
// comm_total_least_ms) over a real MPI world: checked against the minimum taken here over
// the ranks' own figures, and read back from the metrics file of a run.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string least_data_file() {
  static const std::string path = test::write_test_tokens("least_waits", 5, 59);
  return path;
}

// tp 2 and dp over the rest of an even world, 2 micro-batches per dp rank and step;
// `logging`: the logging section's keys.
std::unique_ptr<Trainer> make_trainer(const std::string& logging) {
  static int trainers = 0;
  const ParallelLayout layout{test::world().size() / 2, 2, 1};
  auto config = parse_config(
      test::small_model_yaml("gpt2") + test::parallel_yaml(layout, 0) + "data: {train: " +
          least_data_file() + "}\ntraining: {global_batch_size: " + std::to_string(2 * layout.dp) +
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
  }
  EXPECT_EQ(records, 3);
}

}  // namespace
}  // namespace trident
