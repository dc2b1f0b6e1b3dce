// trident plan's library (plan/plan.h, plan/hardware.h): the layouts it
// enumerates (every valid one, the invalid ones left out), memory, traffic and bubble
// that are the shared formulas' own figures (one source of truth), the time model's
// parts adding up, the ranking and reasons, the JSON object of docs/PLAN.md "JSON", and the
// hardware table.
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "parallel/pipeline.h"
#include "plan/traffic_model.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

// Tiny llama: 4 heads, 2 kv heads (tp in {1, 2}), 2 layers (pp in {1, 2}), batch 8.
Config small_config() {
  Config c;
  c.model = testing::tiny_model(Arch::kLlama, {.d_ff = 128});
  c.parallel.micro_batch_size = 1;
  c.training.global_batch_size = 8;
  c.data.train = "unused";
  EXPECT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  return c;
}

PlanOptions gpu_options(int devices, int per_node = 8) {
  Result<HardwareTable> table = load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  EXPECT_TRUE(table.is_ok()) << table.status().message();
  PlanOptions o;
  o.devices = devices;
  o.gpus_per_node = per_node;
  o.hardware = find_gpu(table.value(), "h100").value();
  o.attention_state_bytes = gpu_attention_state_bytes;
  return o;
}

ModelPartition stage_partition(const Config& c, int stage) {
  const std::vector<int> counts =
      stage_layer_counts(c.model.n_layers, c.parallel.pp, c.parallel.stage_layers);
  ModelPartition part;
  part.tp_size = c.parallel.tp;
  part.pp_rank = stage;
  part.pp_size = c.parallel.pp;
  for (int s = 0; s < stage; ++s) part.layer_begin += counts[static_cast<size_t>(s)];
  part.layer_end = part.layer_begin + counts[static_cast<size_t>(stage)];
  return part;
}

// The GPU attention state follows the CUDA backend's default path: bf16 runs cuDNN, whose
// state is the row statistics (no T x T matrix); fp32 runs the plain path, which keeps the
// probabilities; both after a 64-byte tag. GPT-2 124M's shape, B16 T1024 H12.
TEST(Plan, GpuAttentionStateFollowsThePathOfTheDtype) {
  EXPECT_EQ(gpu_attention_state_bytes(16, 1024, 12, 12, 64, DType::kBF16),
            64u + size_t{16} * 12 * 1024 * sizeof(float));
  EXPECT_EQ(gpu_attention_state_bytes(16, 1024, 12, 12, 64, DType::kF32),
            64u + size_t{16} * 12 * 1024 * 1024 * sizeof(float));
  // Head dims cuDNN lacks, and T = 1, run plain in bf16 too (2-byte probabilities, rows
  // padded to 8).
  EXPECT_EQ(gpu_attention_state_bytes(2, 7, 4, 2, 10, DType::kBF16), 64u + size_t{2} * 4 * 7 * 8 * 2);
  EXPECT_EQ(gpu_attention_state_bytes(2, 1, 4, 2, 64, DType::kBF16), 64u + size_t{2} * 4 * 8 * 2);
  EXPECT_EQ(gpu_attention_state_bytes(1 << 30, 1 << 30, 1 << 30, 1, 64, DType::kF32), SIZE_MAX);
}

TEST(Plan, EnumeratesEveryValidLayoutAndNoOther) {
  const Config base = small_config();
  const std::vector<PlanCandidate> layouts = enumerate_layouts(base, 8);
  // By hand: (tp, pp, dp) = (1,1,8): mbs {1}, zero 0-3, recompute x3          = 12
  //                         (1,2,4): mbs {1,2}, zero 0-3, recompute x3        = 24
  //                         (2,1,4): mbs {1,2}, zero 0-3, sp x2, recompute x3 = 48
  //                         (2,2,2): mbs {1,2,4}, zero 0-3, sp x2, x3         = 72
  // tp 4 and 8 do not divide n_kv_heads=2; pp 4 and 8 exceed n_layers=2.
  EXPECT_EQ(layouts.size(), 156u);
  std::set<std::string> names;
  for (const PlanCandidate& l : layouts) {
    EXPECT_EQ(l.dp * l.tp * l.pp, 8);
    EXPECT_LE(l.tp, 2) << layout_name(l);
    EXPECT_LE(l.pp, 2) << layout_name(l);
    EXPECT_EQ(base.training.global_batch_size % (l.micro_batch_size * l.dp), 0) << layout_name(l);
    EXPECT_FALSE(l.sequence_parallel && l.tp == 1);
    EXPECT_EQ(l.virtual_stages, 1);
    EXPECT_TRUE(validate_config(apply_layout(base, l)).is_ok()) << layout_name(l);
    EXPECT_TRUE(names.insert(layout_name(l)).second) << "twice: " << layout_name(l);
  }
  // dp 1 has ZeRO 0 only (the stages shard over dp: 1-3 would equal 0).
  for (const PlanCandidate& l : enumerate_layouts(base, 4)) {
    if (l.dp == 1) {
      EXPECT_EQ(l.zero_stage, 0) << layout_name(l);
    }
  }
  // A batch that dp does not divide: dp 8 of batch 4 is left out.
  Config small_batch = base;
  small_batch.training.global_batch_size = 4;
  const std::vector<PlanCandidate> small = enumerate_layouts(small_batch, 8);
  EXPECT_FALSE(small.empty());
  for (const PlanCandidate& l : small) {
    EXPECT_LT(l.dp, 8) << layout_name(l);
  }
  EXPECT_TRUE(enumerate_layouts(base, 0).empty());
}

// Interleaved 1F1B: with 4 layers, pp 2 admits v = 2 wherever the micro-batches per step
// are a multiple of 2. By hand: (tp, pp, dp) = (1,2,4): mbs 1 (m 2), zero 0-3, x3 = 12;
// (2,2,2): mbs 1, 2 (m 4, 2), zero 0-3, sp x2, x3 = 48. pp 4 leaves one layer per stage.
TEST(Plan, EnumeratesInterleavedLayouts) {
  Config base = small_config();
  base.model.n_layers = 4;
  int interleaved = 0;
  for (const PlanCandidate& l : enumerate_layouts(base, 8)) {
    if (l.virtual_stages == 1) continue;
    ++interleaved;
    EXPECT_EQ(l.virtual_stages, 2) << layout_name(l);
    EXPECT_EQ(l.pp, 2) << layout_name(l);
    const Config c = apply_layout(base, l);
    EXPECT_EQ(c.parallel.virtual_stages, 2);
    EXPECT_EQ(c.grad_accum_steps() % l.pp, 0) << layout_name(l);
    EXPECT_TRUE(config_layout(c) == l);
  }
  EXPECT_EQ(interleaved, 60);
}

TEST(Plan, MemoryTrafficAndBubbleAreTheSharedFormulas) {
  Config deeper = small_config();
  deeper.model.n_layers = 4;  // admits interleaved 1F1B at pp 2
  for (const Config& base : {small_config(), deeper}) {
  const PlanOptions o = gpu_options(8);
  int checked = 0;
  for (const PlanCandidate& l : enumerate_layouts(base, 8)) {
    SCOPED_TRACE(layout_name(l));
    const Config c = apply_layout(base, l);
    const PlanResult p = evaluate_layout(c, o);
    double peak = -1, dp_bytes = 0, tp_bytes = 0, pp_bytes = 0;
    RankMemory fullest;
    for (int s = 0; s < l.pp; ++s) {
      const ModelPartition part = stage_partition(c, s);
      const RankMemory m = estimate_rank_memory(c, part, 0, AttentionStateBytes(gpu_attention_state_bytes));
      const double device = m.params + m.master + m.grads + m.optimizer + m.activations +
                            m.comm_buffers + m.scratch + 2 * sizeof(double) + kGpuWorkspaceBytes;
      if (device > peak) {
        peak = device;
        fullest = m;
      }
      const RankTraffic t = analytic_traffic(c, part, describe_params(c.model, part));
      dp_bytes = std::max(dp_bytes, t.dp.total() + t.embedding.total());
      tp_bytes = std::max(tp_bytes, t.tp.total());
      pp_bytes = std::max(pp_bytes, t.pp.total());
    }
    EXPECT_EQ(p.memory.params, fullest.params);
    EXPECT_EQ(p.memory.grads, fullest.grads);
    EXPECT_EQ(p.memory.optimizer, fullest.optimizer + fullest.master);
    EXPECT_EQ(p.memory.activations, fullest.activations);
    EXPECT_EQ(p.memory.buffers, fullest.comm_buffers + fullest.scratch + 2 * sizeof(double));
    EXPECT_EQ(p.memory.host, fullest.checkpoint + fullest.transient + fullest.tables);
    EXPECT_DOUBLE_EQ(p.memory.total, peak);  // a GPU counts device memory only
    EXPECT_EQ(p.comm[ParallelDim::kDp], dp_bytes);
    EXPECT_EQ(p.comm[ParallelDim::kTp], tp_bytes);
    EXPECT_EQ(p.comm[ParallelDim::kPp], pp_bytes);
    EXPECT_EQ(p.bubble, pipeline_bubble_fraction(l.pp, c.grad_accum_steps(), l.virtual_stages));
    // The time parts add up, and MFU is model FLOPs over the bf16 peak.
    EXPECT_NEAR(p.step_time_s, p.compute_s + p.bubble_s + p.tp_s + p.pp_s + p.dp_s + p.optimizer_s,
                1e-12 * p.step_time_s);
    EXPECT_NEAR(p.tokens_per_s_per_gpu, 8.0 * 32 / p.step_time_s / 8, 1e-9 * p.tokens_per_s_per_gpu);
    EXPECT_NEAR(p.mfu, c.model.flops_per_token() * p.tokens_per_s_per_gpu / 989e12, 1e-12);
    EXPECT_EQ(p.tp_s > 0, l.tp > 1);
    EXPECT_EQ(p.pp_s > 0, l.pp > 1);
    EXPECT_EQ(p.dp_s > 0, l.dp > 1);
    ++checked;
  }
  EXPECT_GE(checked, 156);  // every layout of EnumeratesEveryValidLayoutAndNoOther, and more
  }
}

TEST(Plan, CpuCountsHostMemoryAndSharesTheMachine) {
  const Config base = small_config();
  PlanOptions o = gpu_options(2);
  o.hardware = cpu_hardware(1e11, 64.0 * 1073741824.0);
  o.gpus_per_node = 2;
  const PlanResult p =
      evaluate_layout(apply_layout(base, PlanCandidate{{.dp = 2}, Recompute::kNone, 1}), o);
  EXPECT_EQ(p.memory.workspace, 0);
  EXPECT_GT(p.memory.host, 0);
  EXPECT_DOUBLE_EQ(p.memory.total, p.memory.device() + p.memory.host);
  EXPECT_DOUBLE_EQ(p.capacity, 32.0 * 1073741824.0);  // two ranks share the machine
}

TEST(Plan, TensorParallelAcrossNodesCostsTheNetwork) {
  Config base = small_config();
  base.model.n_kv_heads = 4;
  base.model.d_model = 1024;  // 4 MiB all-reduces: bandwidth, not latency, decides
  base.model.seq_len = 1024;
  base.model.finalize();
  const Config c = apply_layout(base, PlanCandidate{{.dp = 2, .tp = 4}, Recompute::kNone, 1});
  const PlanResult inside = evaluate_layout(c, gpu_options(8, 8));
  const PlanResult across = evaluate_layout(c, gpu_options(8, 2));
  EXPECT_FALSE(inside.crosses_nodes[ParallelDim::kTp]);
  EXPECT_TRUE(across.crosses_nodes[ParallelDim::kTp]);
  EXPECT_GT(across.tp_s, 5 * inside.tp_s);  // 50 vs 450 GB/s
}

TEST(Plan, RanksFittingLayoutsByTimeAndSaysWhyOthersLose) {
  Config base = small_config();
  base.parallel.dp = 8;
  const PlanOptions o = gpu_options(8);
  Result<Plan> plan = make_plan(base, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_EQ(plan->recommended, 0);
  EXPECT_EQ(plan->layouts[0].reason, "recommended: the fastest layout that fits");
  for (size_t i = 1; i < plan->layouts.size(); ++i) {
    const PlanResult& a = plan->layouts[i - 1];
    const PlanResult& b = plan->layouts[i];
    if (a.fits && b.fits) {
      EXPECT_LE(a.step_time_s, b.step_time_s);
    }
    EXPECT_FALSE(b.reason.empty());
    if (b.fits) {
      EXPECT_TRUE(b.reason.find("x slower: ") != std::string::npos ||
                  b.reason == "as fast (within 0.05%); ranked after by memory")
          << b.reason;
    }
  }
  EXPECT_EQ(plan->configured.candidate, config_layout(base));
  EXPECT_TRUE(plan->configured_note.empty());
}

TEST(Plan, ConfiguredLayoutMovesToTheDeviceCountOrIsRefused) {
  Config base = small_config();
  base.parallel.tp = 2;  // dp 1 x tp 2: on 8 devices dp becomes 4
  Result<Plan> plan = make_plan(base, gpu_options(8));
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_EQ(plan->configured.candidate.dp, 4);
  EXPECT_NE(plan->configured_note.find("evaluated with dp=4"), std::string::npos);
  base.parallel.pp = 2;  // tp * pp = 4 does not divide 6: the other layouts are still planned
  base.training.global_batch_size = 12;  // (dp 6 x tp 1 x pp 1 is one)
  Result<Plan> bad = make_plan(base, gpu_options(6));
  ASSERT_TRUE(bad.is_ok()) << bad.status().message();
  EXPECT_EQ(bad->configured_error,
            "parallel.tp * parallel.pp = 2 * 2 does not divide --devices 6 (the config's layout, "
            "parallel.dp=1, is for 4 devices)");
  EXPECT_EQ(configured_misfit(bad.value()), bad->configured_error);
  EXPECT_FALSE(bad->layouts.empty());
  EXPECT_TRUE(plan_json(bad.value())["configured"].is_null());
  EXPECT_NE(plan_table(bad.value(), 3).find("# configured: parallel.tp * parallel.pp"), std::string::npos);
  Result<Plan> none = make_plan(base, gpu_options(0));
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("--devices: must be >= 1"), std::string::npos);
}

TEST(Plan, AModelTooBigForTheGpuSaysWhatDoesNotFit) {
  Config big = small_config();
  big.model.d_model = 16384;  // ~2.2B parameters per layer pair: too much for one H100
  big.model.n_heads = 128;
  big.model.n_kv_heads = 8;
  big.model.d_ff = 53248;
  big.model.finalize();
  Result<Plan> plan = make_plan(big, gpu_options(1));
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_FALSE(plan->configured.fits);
  EXPECT_EQ(plan->recommended, -1);
  const std::string msg = configured_misfit(plan.value());
  EXPECT_NE(msg.find("parallel.dp=1, parallel.tp=1, parallel.pp=1, parallel.zero_stage=0"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("does not fit on h100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("but a rank has 80.0 GiB"), std::string::npos) << msg;
  EXPECT_NE(plan->configured.reason.find("does not fit: "), std::string::npos);
  EXPECT_NE(plan_table(plan.value(), 5).find("recommended: none (no layout fits)"), std::string::npos);
}

TEST(Plan, JsonHasExactlyTheKeysOfTheDesign) {
  Config base = small_config();
  base.parallel.dp = 8;
  Result<Plan> plan = make_plan(base, gpu_options(8));
  ASSERT_TRUE(plan.is_ok());
  const nlohmann::json j = plan_json(plan.value());
  auto keys = [](const nlohmann::json& o) {
    std::set<std::string> k;
    for (auto it = o.begin(); it != o.end(); ++it) k.insert(it.key());
    return k;
  };
  EXPECT_EQ(keys(j), (std::set<std::string>{"devices", "gpu", "gpus_per_node", "configured",
                                            "recommended", "layouts"}));
  EXPECT_EQ(j["devices"], 8);
  EXPECT_EQ(j["gpu"], "h100");
  EXPECT_EQ(j["gpus_per_node"], 8);
  ASSERT_EQ(j["layouts"].size(), 156u);
  const std::set<std::string> layout_keys = {
      "dp", "tp", "pp", "virtual_stages", "zero_stage", "sequence_parallel", "recompute",
      "micro_batch_size", "fits", "memory_bytes", "comm_bytes_per_step", "bubble",
      "step_time_s", "tokens_per_s_per_gpu", "mfu", "reason"};
  for (const nlohmann::json& l : {j["configured"], j["recommended"], j["layouts"][0], j["layouts"][155]}) {
    EXPECT_EQ(keys(l), layout_keys);
    EXPECT_EQ(keys(l["memory_bytes"]),
              (std::set<std::string>{"params", "grads", "optimizer", "activations", "buffers", "total"}));
    EXPECT_EQ(keys(l["comm_bytes_per_step"]), (std::set<std::string>{"dp", "tp", "pp"}));
    EXPECT_EQ(l["virtual_stages"], 1);
  }
  EXPECT_EQ(j["recommended"], j["layouts"][0]);
  EXPECT_EQ(j["layouts"][0]["memory_bytes"]["total"].get<double>(), plan->layouts[0].memory.total);
}

TEST(Hardware, TheTableHasTheFourGpusWithDatasheetFigures) {
  Result<HardwareTable> table = load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  ASSERT_TRUE(table.is_ok()) << table.status().message();
  Result<Hardware> h100 = find_gpu(table.value(), "H100");
  ASSERT_TRUE(h100.is_ok());
  EXPECT_EQ(h100->peak_flops, 989e12);
  EXPECT_EQ(h100->memory_bytes, 80.0 * 1073741824.0);
  EXPECT_EQ(h100->memory_bandwidth, 3.35e12);
  EXPECT_EQ(h100->intra_node.bytes_per_s, 450e9);
  EXPECT_EQ(h100->inter_node.bytes_per_s, 50e9);
  for (const char* name : {"h200", "a100", "b200"}) EXPECT_TRUE(find_gpu(table.value(), name).is_ok());
  Result<Hardware> unknown = find_gpu(table.value(), "v100");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().exit_code(), 2);
  EXPECT_EQ(unknown.status().message(), "--gpu: unknown GPU 'v100'; known: h100, h200, a100, b200, cpu");
}

TEST(Hardware, BadTablesNameTheEntryAndKey) {
  const std::string links = "interconnects: [{name: nv, gbytes_per_s: 450, latency_us: 10}]\n";
  Result<HardwareTable> missing = parse_hardware_table(
      "gpus: [{name: x, peak_bf16_tflops: 1, memory_gib: 1, interconnect: nv, network: nv}]\n" + links, "hw.yaml");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().message(), "hw.yaml: gpus[0].memory_tbps: missing");
  Result<HardwareTable> negative = parse_hardware_table(
      "gpus: [{name: x, peak_bf16_tflops: -1, memory_gib: 1, memory_tbps: 1, interconnect: nv, network: nv}]\n" + links,
      "hw.yaml");
  ASSERT_FALSE(negative.is_ok());
  EXPECT_EQ(negative.status().message(), "hw.yaml: gpus[0].peak_bf16_tflops: must be > 0, got -1");
  Result<HardwareTable> link = parse_hardware_table(
      "gpus: [{name: x, peak_bf16_tflops: 1, memory_gib: 1, memory_tbps: 1, interconnect: nv, network: ib}]\n" + links,
      "hw.yaml");
  ASSERT_FALSE(link.is_ok());
  EXPECT_EQ(link.status().message(), "hw.yaml: gpus[0].network: 'ib' is not in interconnects");
  Result<HardwareTable> key = parse_hardware_table(
      "gpus: [{name: x, peak_tflops: 1}]\n" + links, "hw.yaml");
  ASSERT_FALSE(key.is_ok());
  EXPECT_NE(key.status().message().find("hw.yaml: gpus[0]: unknown key 'peak_tflops'"), std::string::npos);
}

}  // namespace
}  // namespace trident
