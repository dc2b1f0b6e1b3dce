// Expert parallelism in `trident plan` against the trainer: the all-to-all bytes each ep
// rank really sends in a step (its ep communicator's counters) equal the traffic model's
// volume for the step's routing (ep_all_to_all_bytes with the rows its experts received,
// from the step's expert loads), and summed over the ep group they equal ep times the
// plan's figure (comm_bytes_per_step.ep, balanced routing: over a group the received rows
// sum to the dispatched ones), with and without full recomputation (which reruns the
// forward's exchanges), in fp32 and bf16, with a leading dense layer (no exchange). The
// experts' reduction over expert_dp and the dense one over dp equal the traffic model's
// at 4 ranks (ep 2: two ranks hold each expert).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "plan/plan.h"
#include "plan/traffic_model.h"
#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

constexpr int kExperts = 4, kTopK = 2, kSeqLen = 16, kLayers = 3, kBatch = 8;

std::string ep_data_file() {
  static const std::string path = test::write_test_tokens("plan_ep", 7, 61);
  return path;
}

struct Case {
  int dp = 2, ep = 2, zero = 0, first_dense = 0;
  const char* recompute = "none";
  const char* precision = "fp32";
};

std::string case_yaml(const Case& c) {
  return testing::tiny_model_yaml(Arch::kLlama,
                                  {.vocab_size = 61, .seq_len = kSeqLen, .n_layers = kLayers,
                                   .d_model = 32},
                                  ", moe_experts: " + std::to_string(kExperts) +
                                      ", moe_top_k: " + std::to_string(kTopK) +
                                      ", moe_d_ff: 48, moe_first_dense_layers: " +
                                      std::to_string(c.first_dense)) +
         "parallel: {dp: " + std::to_string(c.dp) + ", ep: " + std::to_string(c.ep) +
         ", zero_stage: " + std::to_string(c.zero) + ", micro_batch_size: 1}\n" +
         "data: {train: " + ep_data_file() + "}\n" +
         "training: {global_batch_size: " + std::to_string(kBatch) +
         ", max_steps: 2, recompute: " + c.recompute + ", precision: " + c.precision + "}\n";
}

void check_case(const Case& c) {
  SCOPED_TRACE("dp " + std::to_string(c.dp) + " ep " + std::to_string(c.ep) + " zero " +
               std::to_string(c.zero) + " first_dense " + std::to_string(c.first_dense) + " " +
               c.recompute + " " + c.precision);
  auto trainer = test::make_world_trainer(case_yaml(c), ep_data_file());
  ASSERT_NE(trainer, nullptr);
  ASSERT_TRUE(trainer->train_step().is_ok());
  auto step = trainer->train_step();
  ASSERT_TRUE(step.is_ok()) << step.status().message();
  const Config& config = trainer->config();
  const RankStats& st = trainer->last_step_stats();

  // This rank's experts' rows in the step: each ep group routes its own tokens; with
  // dp == ep there is one group, whose loads are the step's.
  ASSERT_EQ(c.dp, c.ep) << "the routing of one group is read from the step's loads";
  const int local = kExperts / c.ep, first = trainer->partition().ep_rank * local;
  const double assignments = double(kBatch) * kSeqLen * kTopK;  // per layer, the step's
  double received = 0;
  for (const std::vector<double>& layer : step.value().moe_fractions) {
    for (int e = first; e < first + local; ++e) {
      received += std::llround(layer[static_cast<size_t>(e)] * assignments);
    }
  }
  const double moe_layers = kLayers - c.first_dense;
  EXPECT_EQ(moe_local_layers(config, trainer->partition()), moe_layers);
  EXPECT_EQ(st.traffic.ep.all_to_all, ep_all_to_all_bytes(config, moe_layers, received));
  EXPECT_GT(st.traffic.ep.all_to_all, 0);
  EXPECT_EQ(st.traffic.ep.total(), st.traffic.ep.all_to_all);

  // The group's total against the plan's balanced per-rank figure.
  double sent = st.traffic.ep.all_to_all;
  test::world().all_reduce(CommBuf::host(std::span<double>(&sent, 1)), ReduceOp::kSum,
                           {.label = "ep bytes"});
  PlanOptions options;
  options.devices = test::world().size();
  options.gpus_per_node = options.devices;
  options.hardware = cpu_hardware(1e9, 1e12);
  const std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  options.attention_state_bytes = [&cpu](int B, int T, int NH, int NKV, int HD, DType dtype) {
    return cpu->attention_state_bytes(B, T, NH, NKV, HD, dtype);
  };
  const PlanResult plan = evaluate_layout(config, options);
  EXPECT_EQ(sent, c.ep * plan.comm[ParallelDim::kEp]);
  EXPECT_EQ(st.analytic.ep.all_to_all, plan.comm[ParallelDim::kEp]);
  EXPECT_GT(plan.ep_s, 0);

  // The dense groups over dp, the experts over expert_dp (dp / ep ranks), as analysed.
  EXPECT_EQ(st.traffic.dp.total(), st.analytic.dp.total());
  EXPECT_GT(st.traffic.dp.total(), 0);
  EXPECT_EQ(st.traffic.expert_dp.total(), st.analytic.expert_dp.total());
  EXPECT_EQ(st.traffic.expert_dp.total() > 0, c.dp / c.ep > 1);
  EXPECT_EQ(plan.expert_dp_comm, st.analytic.expert_dp.total());
}

TEST(PlanEpMpi, AllToAllAndExpertReductionBytesAreThePlans) {
  const int n = test::world().size();
  if (n != 2) GTEST_SKIP() << "needs 2 ranks";
  check_case({});
  check_case({.recompute = "full"});
  check_case({.zero = 1, .first_dense = 1, .precision = "bf16"});
  check_case({.first_dense = 1, .recompute = "full", .precision = "bf16"});
}

TEST(PlanEpMpi, ExpertDataParallelBytesAreThePlans) {
  if (test::world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  // ep 2 of dp 4: two ep groups route their own tokens, so only the byte counts of the
  // two data-parallel engines are checked here (the all-to-all at 2 ranks above).
  for (int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Case c{.dp = 4, .ep = 2, .zero = zero, .first_dense = 1};
    auto trainer = test::make_world_trainer(case_yaml(c), ep_data_file());
    ASSERT_NE(trainer, nullptr);
    ASSERT_TRUE(trainer->train_step().is_ok());
    ASSERT_TRUE(trainer->train_step().is_ok());
    const RankStats& st = trainer->last_step_stats();
    EXPECT_EQ(st.traffic.dp.total(), st.analytic.dp.total());
    EXPECT_EQ(st.traffic.expert_dp.total(), st.analytic.expert_dp.total());
    EXPECT_GT(st.traffic.expert_dp.total(), 0);
    double sent = st.traffic.ep.all_to_all;
    test::world().all_reduce(CommBuf::host(std::span<double>(&sent, 1)), ReduceOp::kSum,
                             {.label = "ep bytes"});
    EXPECT_EQ(sent, 4 * st.analytic.ep.all_to_all);  // balanced over the two groups together
  }
}

}  // namespace
}  // namespace trident
