// A mixture-of-experts model follows the single-process trajectory under data
// parallelism (ZeRO 1 and 3) and pipeline parallelism: at ep = 1 the experts are ordinary
// replicated parameters and each micro-batch is routed on the rank that holds it, so
// every layout gives the single-process losses and final parameters within rounding
// (1e-5 relative on losses, 1e-4 per tensor), as docs/ARCHITECTURE.md "Numerics and
// determinism" asks of the dense model. The auxiliary losses the metrics report agree too.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "tests/common/mpi_test_util.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

std::string data_file() {
  static const std::string path = test::write_test_tokens("moe_equiv", 7, 61);
  return path;
}

struct MoeRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // world rank 0 only
};

MoeRun train(int dp, int pp, int zero, Communicator* world) {
  const std::string yaml =
      testing::tiny_model_yaml(Arch::kLlama, {.vocab_size = 64, .seq_len = 16, .n_layers = 2,
                                              .d_model = 32},
                               ", moe_experts: 4, moe_top_k: 2, moe_d_ff: 48") +
      "parallel: {dp: " + std::to_string(dp) + ", pp: " + std::to_string(pp) +
      ", zero_stage: " + std::to_string(zero) + ", micro_batch_size: 1}\n"
      "data: {train: " + data_file() + "}\n"
      "training: {global_batch_size: 8, max_steps: 6, lr: 0.003, warmup_steps: 1,"
      " moe_z_loss_coef: 0.001}\n"
      "checkpoint: {dir: " + data_file() + ".ckpt, save_final: false}\n"
      "logging: {metrics: ''}\n";
  auto config = parse_config(yaml, {});
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  if (!config.is_ok()) return {};
  const auto trainer =
      testing::make_test_trainer(config.value(), testing::test_trainer_options(world));
  if (!trainer) return {};
  EXPECT_TRUE(trainer->run().is_ok());
  return {trainer->losses(), trainer->gather_parameters()};
}

TEST(MoeEquivalence, DataAndPipelineParallelMatchSingleProcess) {
  Communicator& world = test::world();
  const int n = world.size();
  if (n > 8) GTEST_SKIP() << "global batch 8";
  const MoeRun ref = train(1, 1, 0, nullptr);
  ASSERT_EQ(ref.losses.size(), 6u);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  struct Layout {
    int dp, pp, zero;
  };
  std::vector<Layout> layouts = {{n, 1, 1}, {n, 1, 3}};
  if (n % 2 == 0) layouts.push_back({n / 2, 2, 0});
  for (const Layout& l : layouts) {
    SCOPED_TRACE("dp " + std::to_string(l.dp) + " pp " + std::to_string(l.pp) + " zero " +
                 std::to_string(l.zero));
    const MoeRun got = train(l.dp, l.pp, l.zero, &world);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s + 1;
    }
    if (world.rank() != 0) continue;
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (const auto& [name, values] : ref.params) {
      auto it = got.params.find(name);
      ASSERT_NE(it, got.params.end()) << name;
      EXPECT_LT(test::rel_diff(it->second, values), 1e-4) << name;
    }
  }
}

}  // namespace
}  // namespace trident
