// trident plan and expert parallelism (plan/plan.h): ep is enumerated for mixtures of
// experts only (over the divisors of dp that divide model.moe_experts); the all-to-all's
// bytes are the traffic model's (and, by hand, those of the trainer's five exchanges per
// MoE layer and micro-batch), its time is exposed on the ep group's link; a model whose
// experts fit nowhere at ep 1 gets an ep > 1 layout; the JSON and the table carry ep; and a
// mixture of experts' leading dense layers count as dense in the parameter counts and
// MFU's FLOPs (tests/plan/memory_plan_mpi_test.cpp holds the memory plan to the
// allocations with them, tests/plan/plan_ep_mpi_test.cpp the all-to-all bytes to the
// trainer's).
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "model/model_description.h"
#include "plan/partition.h"
#include "plan/plan.h"
#include "plan/traffic_model.h"

namespace trident {
namespace {

Config moe_config(const std::string& model, const std::string& parallel, int batch,
                  const std::string& training = "") {
  const bool mbs = parallel.find("micro_batch_size") != std::string::npos;
  auto c = parse_config("model: {" + model + "}\nparallel: {" + parallel +
                            (mbs ? "" : ", micro_batch_size: 1") +
                            "}\ndata: {train: x.bin}\ntraining: {global_batch_size: " +
                            std::to_string(batch) + training + "}\n",
                        {});
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.value();
}

// A small llama with 8 experts of top 2 (4 layers, the first dense).
const char* kSmallMoe =
    "arch: llama, vocab_size: 256, seq_len: 64, n_layers: 4, n_heads: 4, d_model: 64, "
    "d_ff: 128, moe_experts: 8, moe_top_k: 2, moe_d_ff: 96, moe_first_dense_layers: 1";

PlanOptions h100(int devices) {
  Result<HardwareTable> table =
      load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  EXPECT_TRUE(table.is_ok()) << table.status().message();
  PlanOptions o;
  o.devices = devices;
  o.gpus_per_node = 8;
  o.hardware = find_gpu(table.value(), "h100").value();
  o.attention_state_bytes = gpu_attention_state_bytes;
  return o;
}

TEST(PlanEp, EpDegreesOnlyForExpertsDividingDp) {
  const Config moe = moe_config(kSmallMoe, "dp: 8", 8);
  EXPECT_EQ(plan_ep_degrees(moe, 8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(plan_ep_degrees(moe, 12), (std::vector<int>{1, 2, 4}));  // 8 experts: not 3, 6, 12
  EXPECT_EQ(plan_ep_degrees(moe, 1), (std::vector<int>{1}));
  const Config dense = moe_config("arch: llama, vocab_size: 256, seq_len: 64, n_layers: 4, "
                                  "n_heads: 4, d_model: 64",
                                  "dp: 8", 8);
  EXPECT_EQ(plan_ep_degrees(dense, 8), (std::vector<int>{1}));
  int with_ep = 0;
  for (const PlanCandidate& l : enumerate_layouts(moe, 8)) {
    EXPECT_EQ(l.dp % l.ep, 0);
    with_ep += l.ep > 1;
  }
  EXPECT_GT(with_ep, 0);
  for (const PlanCandidate& l : enumerate_layouts(dense, 8)) EXPECT_EQ(l.ep, 1);
}

// By hand: per MoE layer and micro-batch of N tokens a rank sends the counts (E i32) and
// its N*K rows out, as many back (balanced), and the same rows' gradients out and back in
// backward; full recomputation reruns the forward's three exchanges.
TEST(PlanEp, AllToAllBytesAreTheTrainersExchanges) {
  for (const char* recompute : {"none", "selective", "full"}) {
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(recompute) + " " + precision);
      const Config c = moe_config(kSmallMoe, "dp: 4, ep: 2, micro_batch_size: 2", 16,
                                  std::string(", recompute: ") + recompute +
                                      ", precision: " + precision);
      const double N = 2 * 64, K = 2, C = 64, E = 8, micro = 16 / 4 / 2, moe_layers = 3;
      const double e = std::string(precision) == "bf16" ? 2 : 4;
      const double passes = std::string(recompute) == "full" ? 2 : 1;
      const double want = micro * moe_layers * (passes * (4 * E + 2 * N * K * C * e) + 2 * N * K * C * e);
      const ModelPartition part = stage_partition(c, 0, 0);
      const ParamLayout layout = describe_params(c.model, part);
      EXPECT_EQ(analytic_traffic(c, part, layout).ep.all_to_all, want);
      EXPECT_EQ(ep_all_to_all_bytes(c, moe_layers, micro * moe_layers * N * K), want);
      EXPECT_EQ(ep_all_to_all_calls_per_layer(c), 3 * passes + 2);
      const PlanResult r = evaluate_layout(c, h100(4));
      EXPECT_EQ(r.comm[ParallelDim::kEp], want);
      // In one node: 1/ep of it stays on the rank, the rest crosses NVLink; all exposed.
      const Hardware& hw = h100(4).hardware;
      const double nvlink = hw.intra_node.bytes_per_s * hw.intra_node.efficiency;
      const double calls = moe_layers * (3 * passes + 2);
      EXPECT_NEAR(r.ep_s, micro * (want / micro / 2 / nvlink + calls * hw.intra_node.latency_s),
                  1e-9 * r.ep_s);
      EXPECT_FALSE(r.crosses_nodes[ParallelDim::kEp]);
      double parts = r.compute_s + r.recompute_s + r.bubble_s + r.tp_s + r.pp_s + r.cp_s +
                     r.ep_s + r.dp_s + r.optimizer_s;
      EXPECT_NEAR(parts, r.step_time_s, 1e-12 * parts);
      // ep 1: no exchange; ep 4 of dp 4 (edp 1): no experts' reduction.
      Config one = c;
      one.parallel.ep = 1;
      EXPECT_EQ(evaluate_layout(one, h100(4)).comm[ParallelDim::kEp], 0);
      EXPECT_EQ(evaluate_layout(one, h100(4)).ep_s, 0);
      EXPECT_GT(r.expert_dp_comm, 0);
      Config four = c;
      four.parallel.ep = 4;
      EXPECT_EQ(evaluate_layout(four, h100(4)).expert_dp_comm, 0);
    }
  }
}

// Across nodes: an ep group of 16 adjacent ranks spans 2 nodes of 8; each rank sends
// 8/16 of its bytes over its own NIC and 7/16 over NVLink at once, the NIC's the longer.
TEST(PlanEp, AllToAllAcrossNodesUsesEachRanksNic) {
  const Config c = moe_config(
      "arch: llama, vocab_size: 256, seq_len: 64, n_layers: 4, n_heads: 4, d_model: 64, "
      "d_ff: 128, moe_experts: 16, moe_top_k: 2, moe_d_ff: 96",
      "dp: 16, ep: 16", 16);
  const PlanOptions o = h100(16);
  const PlanResult r = evaluate_layout(c, o);
  EXPECT_TRUE(r.crosses_nodes[ParallelDim::kEp]);
  const double bytes = r.comm[ParallelDim::kEp];
  const LinkSpec& nic = o.hardware.inter_node;
  const double calls = 4 * 5;
  EXPECT_NEAR(r.ep_s, bytes * 8 / 16 / (nic.bytes_per_s * nic.efficiency) + calls * nic.latency_s,
              1e-9 * r.ep_s);
}

// Two layers of 128 experts (d 4096, width 14336: 22.5G parameters a layer): at ep 1 every
// layout holds a whole layer's experts at once (ZeRO-3 gathers a group whole; tp and pp
// do not split a layer's experts), over 80 GB; split over ep ranks they fit.
TEST(PlanEp, RecommendsEpWhenExpertsFitNowhereAtEpOne) {
  const Config c = moe_config(
      "arch: llama, vocab_size: 32000, seq_len: 1024, n_layers: 2, n_heads: 32, "
      "n_kv_heads: 8, d_model: 4096, d_ff: 14336, moe_experts: 128, moe_top_k: 2",
      "dp: 16", 16, ", precision: bf16");
  auto plan = make_plan(c, h100(16));
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_GE(plan->recommended, 0);
  const PlanResult& best = plan->layouts[0];
  EXPECT_GT(best.candidate.ep, 1);
  EXPECT_GT(best.ep_s, 0);
  int ep1 = 0;
  for (const PlanResult& l : plan->layouts) {
    if (l.candidate.ep != 1) continue;
    ++ep1;
    EXPECT_FALSE(l.fits) << layout_name(l.candidate);
  }
  EXPECT_GT(ep1, 0);
  EXPECT_NE(layout_name(best.candidate).find(" ep" + std::to_string(best.candidate.ep)),
            std::string::npos);
  const nlohmann::json j = plan_json(plan.value());
  EXPECT_EQ(j["recommended"]["ep"], best.candidate.ep);
  EXPECT_EQ(j["recommended"]["comm_bytes_per_step"]["ep"].get<double>(),
            best.comm[ParallelDim::kEp]);
  EXPECT_EQ(j["recommended"]["comm_bytes_per_step"]["expert_dp"].get<double>(),
            best.expert_dp_comm);
  EXPECT_EQ(j["recommended"]["time_s"]["ep"].get<double>(), best.ep_s);
  const std::string table = plan_table(plan.value(), 3);
  EXPECT_NE(table.find("ep s"), std::string::npos);
  EXPECT_NE(table.find("# ep GB, ep s: the all-to-all"), std::string::npos);
}

// Leading dense layers: their MLP is the dense one (d_ff), wholly active.
TEST(PlanEp, LeadingDenseLayersCountAsDense) {
  const Config c = moe_config(kSmallMoe, "dp: 1", 1);
  const TransformerConfig& m = c.model;
  // Every parameter of the model's table (one stage, no tied copy).
  const ParamLayout layout = describe_params(m, stage_partition(c, 0, 0));
  int64_t all = 0;
  for (const ParamInfo& p : layout.params) all += p.shape.numel();
  EXPECT_EQ(m.num_parameters(), all);
  // By hand: attention 4 C^2 + 2 norms, dense MLP 3 C F, MoE E x 3 C Fe + router E C.
  const int64_t C = 64, F = 128, Fe = 96, E = 8, V = 256;
  const int64_t attention = 4 * C * C + 2 * C;
  const int64_t dense = attention + 3 * C * F, moe = attention + E * 3 * C * Fe + E * C;
  const int64_t outer = 2 * V * C + C;  // embedding, untied head, final norm
  EXPECT_EQ(m.num_parameters(), outer + dense + 3 * moe);
  EXPECT_EQ(m.active_parameters(), outer + dense + 3 * (moe - (E - 2) * 3 * C * Fe));
  EXPECT_DOUBLE_EQ(m.flops_per_token(),
                   6.0 * static_cast<double>(m.active_parameters()) + 12.0 * 4 * C * 64);
}

// The routed experts' groups are reduced by the expert_dp group's engine, the same
// DataParallel as dp's (trainer/trainer.cpp), so their calls follow dp's rule over the
// expert groups alone: ZeRO-3 two all-gathers and a reduce-scatter per group and
// micro-batch, ZeRO-1 a reduce-scatter and an all-gather per bucket; and the dense count
// leaves those groups out. kSmallMoe at ep 2 has 3 expert groups (layers 1-3) of one
// bucket each and 6 dense groups (embeddings, 4 layers, head).
TEST(PlanEp, ExpertDpCallsAreTheEngineRuleOverTheExpertGroups) {
  for (int zero : {1, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Config c = moe_config(kSmallMoe, "dp: 4, ep: 2, zero_stage: " + std::to_string(zero), 16);
    const ModelPartition part = stage_partition(c, 0, 0);
    const ParamLayout layout = describe_params(c.model, part);
    int expert_groups = 0, dense_groups = 0;
    for (const ParamGroup& g : layout.groups) {
      if (g.num_floats == 0) continue;
      (is_expert_group(c.model.n_layers, g.id) ? expert_groups : dense_groups) += 1;
    }
    ASSERT_EQ(expert_groups, 3);
    ASSERT_EQ(dense_groups, 6);
    const double micro = c.grad_accum_steps();  // 16 / 4
    const DpCalls e = dp_collective_calls(c, layout, false, /*experts=*/true);
    const DpCalls d = dp_collective_calls(c, layout, false);
    EXPECT_EQ(e.all_reduce, 0);
    EXPECT_EQ(e.reduce_scatter, zero == 3 ? 3 * micro : 3);
    EXPECT_EQ(e.all_gather, zero == 3 ? 2 * 3 * micro : 3);
    EXPECT_EQ(d.reduce_scatter, zero == 3 ? 6 * micro : 6);
    EXPECT_EQ(d.all_gather, zero == 3 ? 2 * 6 * micro : 6);
  }
  // One rank per expert_dp group: nothing to reduce.
  const Config alone = moe_config(kSmallMoe, "dp: 2, ep: 2, zero_stage: 3", 16);
  const ModelPartition part = stage_partition(alone, 0, 0);
  EXPECT_EQ(dp_collective_calls(alone, describe_params(alone.model, part), false, true).total(), 0);
}

}  // namespace
}  // namespace trident
