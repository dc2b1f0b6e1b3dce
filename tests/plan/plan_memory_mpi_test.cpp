// `trident plan --gpu cpu` predicts what a rank really allocates: for at least six
// layouts per world size (dp / tp / pp / ZeRO stages / recompute / sequence
// parallelism), the plan's device bytes of each rank (plan/plan.h plan_rank_memory,
// the figure `plan --gpu cpu` reports per kind) are within 10% of the rank's measured
// peak (Ops::allocation_counts().peak_live_bytes after two optimizer steps), and the
// layout's plan (evaluate_layout, the most loaded rank) is at least every rank's peak
// less 10%. The model is big enough that weights, optimizer state and activations
// dominate (about 1.2M parameters, 128-token micro-batches) and small enough for a
// few seconds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "plan/plan.h"
#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string plan_data_file() {
  static const std::string path = test::write_test_tokens("plan_memory", 7, 500);
  return path;
}

struct Case {
  ParallelLayout layout;
  int zero;
  const char* recompute;
  bool sp;
  int virtual_stages = 1;  // interleaved 1F1B when > 1
};

std::vector<Case> cases_for_world(int n) {
  if (n == 1) {
    return {{{1, 1, 1}, 0, "none", false},      {{1, 1, 1}, 0, "selective", false},
            {{1, 1, 1}, 0, "full", false}};
  }
  if (n == 2) {
    return {{{2, 1, 1}, 0, "none", false}, {{2, 1, 1}, 1, "none", false},
            {{2, 1, 1}, 2, "none", false}, {{2, 1, 1}, 3, "none", false},
            {{1, 2, 1}, 0, "none", false}, {{1, 2, 1}, 0, "selective", true},
            {{1, 1, 2}, 0, "none", false}, {{1, 1, 2}, 0, "full", false},
            {{1, 1, 2}, 0, "none", false, 2}};
  }
  if (n == 4) {
    return {{{2, 2, 1}, 1, "none", false}, {{2, 1, 2}, 2, "none", false},
            {{1, 2, 2}, 0, "full", false}, {{4, 1, 1}, 3, "selective", false},
            {{1, 2, 2}, 0, "selective", true},  {{1, 1, 4}, 0, "none", false},
            {{2, 1, 2}, 1, "none", false, 2},   {{1, 2, 2}, 0, "none", true, 2}};
  }
  return {};
}

TEST(PlanMemoryMpi, PlanPredictsMeasuredPeakWithinTenPercent) {
  const std::vector<Case> cases = cases_for_world(test::world().size());
  if (cases.empty()) GTEST_SKIP() << "needs 1, 2 or 4 ranks";
  const std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  PlanOptions options;
  options.devices = test::world().size();
  options.gpus_per_node = options.devices;
  options.hardware = cpu_hardware(1e9, 1e12);
  options.attention_state_bytes = [&cpu](int B, int T, int NH, int NKV, int HD, DType dtype) {
    return cpu->attention_state_bytes(B, T, NH, NKV, HD, dtype);
  };
  for (const Case& c : cases) {
    const std::string name = test::case_name("llama", c.layout, c.zero) + " " + c.recompute +
                             (c.sp ? " sp" : "") +
                             (c.virtual_stages > 1 ? " v" + std::to_string(c.virtual_stages) : "");
    SCOPED_TRACE(name);
    const std::string yaml =
        "model: {arch: llama, vocab_size: 512, seq_len: 64, n_layers: 4, n_heads: 4, "
        "n_kv_heads: 2, d_model: 128, d_ff: 512}\n"
        "parallel: {dp: " + std::to_string(c.layout.dp) + ", tp: " + std::to_string(c.layout.tp) +
        ", pp: " + std::to_string(c.layout.pp) + ", zero_stage: " + std::to_string(c.zero) +
        ", micro_batch_size: 2, sequence_parallel: " + (c.sp ? "true" : "false") +
        ", virtual_stages: " + std::to_string(c.virtual_stages) + "}\n" +
        "data: {train: " + plan_data_file() + "}\n" +
        "training: {global_batch_size: " + std::to_string(4 * c.layout.dp) +
        ", max_steps: 2, recompute: " + c.recompute + "}\n";
    auto trainer = test::make_world_trainer(yaml, plan_data_file());
    ASSERT_NE(trainer, nullptr);
    ASSERT_TRUE(trainer->train_step().is_ok());
    ASSERT_TRUE(trainer->train_step().is_ok());
    const double measured = static_cast<double>(trainer->ops().allocation_counts().peak_live_bytes);
    const PlanMemory mine =
        plan_rank_memory(trainer->config(), trainer->partition(), trainer->coords().dp_rank, options);
    const PlanResult layout = evaluate_layout(trainer->config(), options);
    std::printf("[rank %d] %-34s measured %9.0f  plan %9.0f  (%+.2f%%)  layout plan %9.0f\n",
                test::world().rank(), name.c_str(), measured, mine.device(),
                100 * (mine.device() - measured) / measured, layout.memory.device());
    EXPECT_NEAR(mine.device(), measured, 0.10 * measured);
    EXPECT_GE(layout.memory.device(), 0.9 * measured);
    // Not vacuous: state and activations are most of it.
    EXPECT_GT(mine.params + mine.grads + mine.optimizer + mine.activations, 0.5 * measured);
  }
}

}  // namespace
}  // namespace trident
