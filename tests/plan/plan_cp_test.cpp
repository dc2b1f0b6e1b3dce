// trident plan and context parallelism (plan/plan.h): cp is enumerated only for long
// sequences, a long-context model that fits nowhere at cp 1 gets a cp > 1 layout, a short
// one keeps cp 1, the cp ring's time is its analytic bytes over the cp group's link less
// what the block attention it overlaps hides, and the JSON carries the cp degree.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "config/config.h"
#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "plan/plan.h"
#include "plan/traffic_model.h"

namespace trident {
namespace {

// configs/llama-8b.yaml's model (Llama 3 8B: 32 layers, 32 heads, 8 kv heads, d 4096) at
// `seq_len`, 8 sequences per step, bf16.
Config llama8b(int seq_len) {
  auto loaded = load_config(std::string(TRIDENT_SOURCE_DIR) + "/configs/llama-8b.yaml",
                            {"model.seq_len=" + std::to_string(seq_len), "parallel.dp=8",
                             "parallel.tp=1", "training.global_batch_size=8"});
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
  return loaded.value();
}

// 8 H100s in one node (configs/hardware.yaml).
PlanOptions h100x8() {
  Result<HardwareTable> table =
      load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  EXPECT_TRUE(table.is_ok()) << table.status().message();
  PlanOptions o;
  o.devices = 8;
  o.gpus_per_node = 8;
  o.hardware = find_gpu(table.value(), "h100").value();
  o.attention_state_bytes = gpu_attention_state_bytes;
  return o;
}

TEST(PlanCp, CpDegreesOnlyForLongSequences) {
  EXPECT_EQ(plan_cp_degrees(llama8b(8192), 8), (std::vector<int>{1}));
  // 2 x 8192 tokens per cp rank at least: 131072 / 16 = 8192.
  EXPECT_EQ(plan_cp_degrees(llama8b(131072), 8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(plan_cp_degrees(llama8b(32768), 8), (std::vector<int>{1, 2, 4}));
  // seq_len must divide by 2 cp: 40000 does by 4, not by 6 or 12.
  EXPECT_EQ(plan_cp_degrees(llama8b(40000), 6), (std::vector<int>{1, 2}));
}

// 8 H200s, and the same at `devices` CPU ranks of `gib_per_rank` each.
PlanOptions h200x8() {
  PlanOptions o = h100x8();
  Result<HardwareTable> table =
      load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  o.hardware = find_gpu(table.value(), "h200").value();
  return o;
}

void expect_cp_in_outputs(const Plan& plan) {
  const PlanResult& best = plan.layouts[0];
  EXPECT_GT(best.cp_s, 0);
  EXPECT_NE(layout_name(best.candidate).find(" cp" + std::to_string(best.candidate.cp)),
            std::string::npos);
  const nlohmann::json j = plan_json(plan);
  EXPECT_EQ(j["recommended"]["cp"], best.candidate.cp);
  EXPECT_EQ(j["recommended"]["cp_ring_overlapped"], true);
  EXPECT_EQ(j["recommended"]["comm_bytes_per_step"]["cp"].get<double>(),
            best.comm[ParallelDim::kCp]);
  EXPECT_EQ(j["recommended"]["time_s"]["cp"].get<double>(), best.cp_s);
  EXPECT_GE(best.cp_comm_s, best.cp_s);
  const std::string table = plan_table(plan, 3);
  EXPECT_NE(table.find("cp s"), std::string::npos);
  EXPECT_NE(table.find("# cp s: the cp ring"), std::string::npos);
}

// Where cp 1 does not fit: a small llama (configs/tiny_llama.yaml's shape) at 16K tokens on
// 4 CPU ranks of 1 GiB. The CPU backend's attention keeps the T x T probabilities per
// layer (2 GiB at tp 2, one layer's even under full recomputation), ring attention only
// its row log-sum-exp, so every layout of cp 1 is over and plan recommends cp 2. (The cpu
// plan is the exact one: tests/plan/memory_plan_mpi_test.cpp checks it against real
// ranks at cp 2.)
TEST(PlanCp, CpWhereCpOneDoesNotFit) {
  auto loaded = load_config(std::string(TRIDENT_SOURCE_DIR) + "/configs/tiny_llama.yaml",
                            {"model.seq_len=16384", "parallel.micro_batch_size=1",
                             "training.global_batch_size=4", "parallel.dp=4"});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  PlanOptions o;
  o.devices = 4;
  o.gpus_per_node = 4;
  o.hardware = cpu_hardware(1e11, 4.0 * 1073741824.0);
  o.attention_state_bytes = [](int B, int T, int NH, int NKV, int HD, DType dtype) {
    static const std::unique_ptr<Ops> cpu = make_cpu_ops(1);  // as trident plan --gpu cpu
    return cpu->attention_state_bytes(B, T, NH, NKV, HD, dtype);
  };
  Result<Plan> plan = make_plan(loaded.value(), o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  int with_cp = 0, fitting_cp1 = 0;
  for (const PlanResult& l : plan->layouts) {
    with_cp += l.candidate.cp > 1;
    fitting_cp1 += l.candidate.cp == 1 && l.fits;
  }
  EXPECT_GT(with_cp, 0);
  EXPECT_EQ(fitting_cp1, 0);
  ASSERT_GE(plan->recommended, 0) << plan_table(plan.value(), 10);
  EXPECT_EQ(plan->layouts[0].candidate.cp, 2);
  expect_cp_in_outputs(plan.value());
}

// Llama 3 8B at 128K tokens on one node of 8 H200s: layouts of cp 1 fit only with full
// recomputation, cp 8 with ZeRO-3 fits without, and its exposed ring costs less than the
// recomputed forward, so plan recommends cp > 1; at 8K tokens it keeps cp 1 (no cp
// layout is tried at all). (On 2026-12-06: cp 8 z3 none 50.0 s/step at 139.4 of 141 GiB,
// its ring 0.10 s exposed, the best cp 1 layout, tp 8 sp none, 56.6 s; on H100s cp 8 z3
// full, 67.0 s, against dp4 tp2 z3 sp full at cp 1, 68.2 s: docs/PLAN.md "Context
// parallelism".)
TEST(PlanCp, LongContextPicksContextParallelismShortKeepsOne) {
  Result<Plan> plan = make_plan(llama8b(131072), h200x8());
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_GE(plan->recommended, 0) << "nothing fits";
  EXPECT_GT(plan->layouts[0].candidate.cp, 1) << plan_table(plan.value(), 10);
  expect_cp_in_outputs(plan.value());

  Result<Plan> short_plan = make_plan(llama8b(8192), h200x8());
  ASSERT_TRUE(short_plan.is_ok()) << short_plan.status().message();
  ASSERT_GE(short_plan->recommended, 0);
  for (const PlanResult& l : short_plan->layouts) EXPECT_EQ(l.candidate.cp, 1);
  EXPECT_EQ(plan_json(short_plan.value())["recommended"]["cp"], 1);
  EXPECT_EQ(plan_table(short_plan.value(), 3).find("# cp s"), std::string::npos);
}

// Llama 3 8B at 128K tokens as dp 1 x tp 4 (sequence parallel) x cp 2, full recomputation.
Config llama8b_tp4_cp2() {
  Config c = llama8b(131072);
  c.parallel.dp = 1;
  c.parallel.tp = 4;
  c.parallel.cp = 2;
  c.parallel.sequence_parallel = true;
  c.training.recompute = Recompute::kFull;
  return c;
}

// The cp ring's time: its bytes (analytic_traffic, which the trainer's counters equal:
// tests/trainer/traffic_memory_mpi_test.cpp) over NVLink (cp inside the node) per
// micro-batch, plus a latency per hop, less what the block attention hides; at cp 1
// nothing.
TEST(PlanCp, RingTimeIsItsBytesOverTheCpLink) {
  PlanOptions o = h100x8();
  Config c = llama8b_tp4_cp2();
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  const PlanResult r = evaluate_layout(c, o);
  const double layers = c.model.n_layers;
  const double micro = c.grad_accum_steps();
  const double bytes = cp_ring_bytes_per_layer(c) * layers * micro;
  EXPECT_EQ(r.comm[ParallelDim::kCp], bytes);
  // By hand: K = 131072/2 rows x 8/4 kv heads x 128 = 16.8M elements; full recompute:
  // forward twice, 2 (cp-1) K bf16 each, backward 2 (cp-1) K bf16 + 2 cp K f32.
  const double K = 65536.0 * 2 * 128;
  EXPECT_EQ(cp_ring_bytes_per_layer(c), 3 * 2 * 1 * K * 2 + 2 * 2 * K * 4);
  EXPECT_EQ(cp_ring_hop_bytes(c).kv, 2 * K * 2);
  EXPECT_EQ(cp_ring_hop_bytes(c).dkv, 2 * K * 4);
  const LinkSpec& nv = o.hardware.intra_node;
  const double bw = nv.bytes_per_s * nv.efficiency;
  // A block here is 2 x 32768^2 query-key pairs of 8 heads, milliseconds of attention;
  // a hop over NVLink a fraction of one: every hop in flight is hidden, and only the
  // last dK/dV hop of each layer, home to its owner, is exposed.
  const double last_hop = 2 * K * 4 / bw + nv.latency_s;
  EXPECT_NEAR(r.cp_s, micro * layers * last_hop, 1e-9 * r.cp_s);
  // Nothing to hide behind (an attention infinitely fast): the whole ring, as exposed as a
  // blocking one.
  o.hardware.attention_efficiency = 1e30;
  const PlanResult bare = evaluate_layout(c, o);
  const double hops = layers * (2 * 1 + 1 + 2);
  EXPECT_NEAR(bare.cp_s, micro * (bytes / micro / bw + hops * nv.latency_s), 1e-9 * bare.cp_s);
  EXPECT_GT(bare.cp_s, 2 * r.cp_s);
  EXPECT_FALSE(r.crosses_nodes[ParallelDim::kCp]);
  const double parts = r.compute_s + r.recompute_s + r.bubble_s + r.tp_s + r.pp_s + r.cp_s +
                       r.dp_s + r.optimizer_s;
  EXPECT_NEAR(parts, r.step_time_s, 1e-12 * parts);
  c.parallel.cp = 1;
  c.parallel.tp = 8;
  const PlanResult flat = evaluate_layout(c, o);
  EXPECT_EQ(flat.cp_s, 0);
  EXPECT_EQ(flat.comm[ParallelDim::kCp], 0);
}

// A blocking ring (PlanOptions::ring_overlap false: the trainer's TRIDENT_RING_OVERLAP=0,
// which `trident plan` reads; tests/e2e/plan_cli_test.cpp runs it) hides nothing: the
// exposed cp time is the ring's whole transfer time, more than the overlapped ring's, and
// the step grows by the difference; the JSON and the table say it is not overlapped.
TEST(PlanCp, BlockingRingExposesAllOfIt) {
  PlanOptions o = h100x8();
  const Config c = llama8b_tp4_cp2();
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  const PlanResult overlapped = evaluate_layout(c, o);
  o.ring_overlap = false;
  const PlanResult blocking = evaluate_layout(c, o);
  EXPECT_TRUE(overlapped.cp_ring_overlapped);
  EXPECT_FALSE(blocking.cp_ring_overlapped);
  EXPECT_GT(blocking.cp_comm_s, 0);
  EXPECT_EQ(blocking.cp_comm_s, overlapped.cp_comm_s);
  EXPECT_EQ(blocking.cp_s, blocking.cp_comm_s);
  EXPECT_GT(blocking.cp_s, overlapped.cp_s);
  EXPECT_NEAR(blocking.step_time_s - overlapped.step_time_s, blocking.cp_s - overlapped.cp_s,
              1e-9 * blocking.step_time_s);
  EXPECT_EQ(layout_json(blocking)["cp_ring_overlapped"], false);

  o.configured_only = true;
  Result<Plan> plan = make_plan(c, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_FALSE(plan->cp_ring_overlapped);
  EXPECT_NE(plan_table(plan.value(), 3).find("# cp s: the cp ring's k/v and dK/dV exchanges, all "
                                             "exposed (TRIDENT_RING_OVERLAP=0"),
            std::string::npos)
      << plan_table(plan.value(), 3);
}

// CPU ranks: each rank's communication thread polls beside its compute while an exchange
// is in flight, so a block's compute keeps only `rate` of its speed meanwhile
// (cpu_compute_rate_in_flight: runtime.threads = the cores per rank, 2 ranks, then rate =
// cores / (cores + 1)); a hidden exchange still costs (1 - rate) of its time. Here the
// blocks hide every hop in flight: the exposed ring is (1 - rate) x those hops + the last
// dK/dV hop of each layer, between that bound and the whole ring.
TEST(PlanCp, CpuRingInFlightSlowsTheBlockCompute) {
  auto loaded = load_config(std::string(TRIDENT_SOURCE_DIR) + "/configs/tiny_llama.yaml",
                            {"model.seq_len=16384", "parallel.micro_batch_size=1",
                             "training.global_batch_size=1", "parallel.dp=1", "parallel.cp=2"});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  Config c = loaded.value();
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  c.runtime.threads = static_cast<int>(cores);
  PlanOptions o;
  o.devices = 2;
  o.gpus_per_node = 2;
  o.hardware = cpu_hardware(1e11, 64.0 * 1073741824.0);
  const PlanResult r = evaluate_layout(c, o);
  const double rate = cores / (cores + 1);
  const double layers = c.model.n_layers, micro = c.grad_accum_steps();
  const LinkSpec& link = o.hardware.intra_node;
  auto hop_s = [&](double bytes) { return bytes / (link.bytes_per_s * link.efficiency) + link.latency_s; };
  const CpRingHop hop = cp_ring_hop_bytes(c);
  // forward 1 k/v hop, backward 1 k/v and 1 dK/dV hop in flight, 1 dK/dV hop home.
  const double in_flight = layers * micro * (2 * hop_s(hop.kv) + hop_s(hop.dkv));
  const double last = layers * micro * hop_s(hop.dkv);
  EXPECT_NEAR(r.cp_comm_s, in_flight + last, 1e-9 * r.cp_comm_s);
  EXPECT_NEAR(r.cp_s, (1 - rate) * in_flight + last, 1e-9 * r.cp_s);
}

// A configured cp layout that cannot be placed on N devices names parallel.cp too.
TEST(PlanCp, ConfiguredCpThatDoesNotDivideTheDevicesNamesCp) {
  Config c = llama8b(131072);
  c.parallel.dp = 1;
  c.parallel.tp = 2;
  c.parallel.cp = 4;
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  PlanOptions o = h100x8();
  o.devices = 12;
  Result<Plan> plan = make_plan(c, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_EQ(plan->configured_error.rfind("parallel.tp * parallel.cp * parallel.pp = 2 * 4 * 1 "
                                         "does not divide --devices 12",
                                         0),
            0u)
      << plan->configured_error;
}

}  // namespace
}  // namespace trident
