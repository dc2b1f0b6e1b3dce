// Context parallelism in the trainer beyond the training step (the step itself:
// tests/trainer/equivalence_mpi_test.cpp): evaluation. Each cp rank evaluates its rows of
// the same validation batches and the ranks' shares are summed, so the validation loss
// equals one process's, before training and after a few steps (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string data_file() {
  static const std::string path = test::write_test_tokens("cp_eval", 5, 61);
  return path;
}

std::string run_yaml(const std::string& arch, const ParallelLayout& l) {
  return test::small_model_yaml(arch) + test::parallel_yaml(l, 1) + "data: {train: " +
         data_file() + ", val: " + data_file() + "}\n" +
         "training: {global_batch_size: 8, max_steps: 3, lr: 0.001, eval_batches: 3}\n";
}

// The validation loss before training and after max_steps.
std::vector<double> val_losses(Trainer& trainer) {
  std::vector<double> out;
  Result<double> before = trainer.evaluate();
  EXPECT_TRUE(before.is_ok()) << before.status().message();
  const Status ran = trainer.run();
  EXPECT_TRUE(ran.is_ok()) << ran.message();
  Result<double> after = trainer.evaluate();
  EXPECT_TRUE(after.is_ok()) << after.status().message();
  if (before.is_ok() && after.is_ok()) out = {before.value(), after.value()};
  return out;
}

TEST(ContextParallel, EvaluationMatchesSingleProcess) {
  const int n = test::world().size();
  for (int cp : {2, 4}) {
    if (n % cp != 0) continue;
    ParallelLayout l;
    l.dp = n / cp;
    l.cp = cp;
    for (const std::string arch : {"gpt2", "llama"}) {
      SCOPED_TRACE(test::case_name(arch, l, 1));
      // The reference: one process (on every rank, each its own checkpoint directory).
      auto single_config = parse_config(
          run_yaml(arch, ParallelLayout{}) + "checkpoint: {dir: " + data_file() + ".ref" +
              std::to_string(test::world().rank()) + ", save_final: false}\n" +
              "logging: {metrics: ''}\n",
          {});
      ASSERT_TRUE(single_config.is_ok()) << single_config.status().message();
      auto single = testing::make_test_trainer(single_config.value());
      ASSERT_NE(single, nullptr);
      const std::vector<double> want = val_losses(*single);
      auto split = test::make_world_trainer(run_yaml(arch, l), data_file());
      ASSERT_NE(split, nullptr);
      const std::vector<double> got = val_losses(*split);
      ASSERT_EQ(want.size(), 2u);
      ASSERT_EQ(got.size(), 2u);
      EXPECT_LT(want[1], want[0]);  // it trained
      for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << i;
    }
  }
}

}  // namespace
}  // namespace trident
