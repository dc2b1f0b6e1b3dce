// trident plan's library (plan/plan.h, plan/hardware.h): the layouts it
// enumerates (every valid one, the invalid ones left out), memory, traffic and bubble
// that are the shared formulas' own figures (one source of truth), the time model's
// parts adding up, the ranking and reasons, the JSON object of docs/PLAN.md "JSON", and the
// hardware table.
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "parallel/pipeline.h"
#include "plan/overlap.h"
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

// The attention path's scratch (kernels/cuda's workspace_bytes without cuDNN's plan
// workspace): fused, the softmax sum and cuDNN's bf16 dq, dk, dv, no T x T matrix; plain,
// q/k/v copies, f32 scores, probabilities and f32 dq. Llama 3 70B's shape at tp 8 (8 query
// heads, 1 kv head, head dim 128, T 8192) and GPT-2 124M's.
TEST(Plan, GpuAttentionWorkspaceFollowsThePathOfTheDtype) {
  EXPECT_EQ(gpu_attention_workspace_bytes(1, 8192, 8, 1, 128, DType::kBF16),
            8.0 * 8192 * 4 + (8192.0 * 8 * 128 + 2 * 8192.0 * 1 * 128) * 2);
  const double rows = 16.0 * 12 * 1024, q = rows * 64;
  EXPECT_EQ(gpu_attention_workspace_bytes(16, 1024, 12, 12, 64, DType::kF32),
            q * 8 + q * 8 + rows * 1024 * 4 + rows * 1024 * 4 + q * 8);
  // The fused path grows with T, the plain one with T^2: 32x from T 1024 to 32768.
  const double fused = gpu_attention_workspace_bytes(1, 32768, 8, 1, 128, DType::kBF16);
  EXPECT_NEAR(fused / gpu_attention_workspace_bytes(1, 1024, 8, 1, 128, DType::kBF16), 32, 1e-9);
  EXPECT_LT(fused, 32768.0 * 32768 * 8);  // far below one head's T x T matrix
}

// The time of the attention core follows its path: fused (bf16, cuDNN's flash attention)
// the causal FLOPs at the attention rate; plain (TRIDENT_ATTENTION=plain, or f32) the whole
// T x T at the GEMM rate plus the scores through memory, 12 bytes per score in a bf16
// forward, backward twice the forward. The plain state and scratch are the plain path's.
TEST(Plan, PlainAttentionCostsTheWholeScoresAtTheGemmRateAndTheirBytes) {
  Config base = small_config();
  base.model.seq_len = 256;
  base.model.finalize();
  Config c = apply_layout(base, PlanCandidate{{.dp = 1}, Recompute::kNone, 1});
  c.training.global_batch_size = 1;
  c.training.precision = Precision::kBf16;
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  PlanOptions fused = gpu_options(1);
  PlanOptions plain = fused;
  plain.plain_attention = true;
  plain.attention_state_bytes = gpu_plain_attention_state_bytes;
  const PlanResult f = evaluate_layout(c, fused), p = evaluate_layout(c, plain);
  const TransformerConfig& m = c.model;
  const Hardware& hw = fused.hardware;
  const double T = m.seq_len, q = double(m.n_heads) * m.head_dim;
  const double causal_flops = 2 * T * T * q;          // per layer, one micro-batch of 1
  const double scores = m.n_heads * T * T;            // T is a multiple of 8
  const double per_layer_forward = 2 * causal_flops / (hw.peak_flops * hw.gemm_efficiency) -
                                   causal_flops / (hw.peak_flops * hw.attention_efficiency) +
                                   scores * 12 / (hw.memory_bandwidth * hw.memory_efficiency);
  EXPECT_NEAR(p.compute_s - f.compute_s, 3 * m.n_layers * per_layer_forward,
              1e-9 * p.compute_s);
  EXPECT_GT(p.memory.activations, f.memory.activations);  // the probabilities, not the LSE
  EXPECT_GT(p.memory.workspace, f.memory.workspace);      // the T x T scratch
}

// torchtitan's op-level selective checkpointing (SelectiveReruns::kTorchtitanOp): of the
// block's matmuls in forward order (q, k, v, o, then the MLP's) the even-numbered ones
// rerun, k, o and the MLP's second (SwiGLU's up, GELU's down projection; either way one
// F x C matrix), with every elementwise pass and no attention core; Trident's own
// selective reruns the attention core alone, and full and none are the same for both.
TEST(Plan, TorchtitanOpSelectiveRerunsEveryOtherMatmulAndTheElementwisePasses) {
  for (Arch arch : {Arch::kLlama, Arch::kGpt2}) {
    for (int tp : {1, 2}) {
      const TransformerConfig m = testing::tiny_model(arch, {.d_ff = 128});
      ModelPartition part;
      part.tp_size = tp;
      part.pp_size = 1;
      part.layer_end = m.n_layers;
      const int B = 3;
      const StageFlops w = describe_flops(m, part, B, DType::kBF16, false);
      const double C = m.d_model, q = double(m.n_heads) * m.head_dim,
                   kv = double(m.n_kv_heads) * m.head_dim, F = m.d_ff, N = double(B) * m.seq_len;
      const Work op = layer_reruns(m, part, w, B, Recompute::kSelective, SelectiveReruns::kTorchtitanOp);
      EXPECT_DOUBLE_EQ(op.gemm_flops, 2 * N * (kv * C + C * q + F * C) / tp) << arch_name(arch) << " tp" << tp;
      EXPECT_EQ(op.attention_flops, 0);
      EXPECT_EQ(op.elementwise_bytes, w.layer.elementwise_bytes);
      const Work core = layer_reruns(m, part, w, B, Recompute::kSelective, SelectiveReruns::kAttentionCore);
      EXPECT_EQ(core.gemm_flops, 0);
      EXPECT_EQ(core.attention_flops, w.layer.attention_flops);
      for (SelectiveReruns s : {SelectiveReruns::kAttentionCore, SelectiveReruns::kTorchtitanOp}) {
        EXPECT_EQ(layer_reruns(m, part, w, B, Recompute::kFull, s).gemm_flops, w.layer.gemm_flops);
        EXPECT_EQ(layer_reruns(m, part, w, B, Recompute::kNone, s).gemm_flops, 0);
      }
    }
  }
  // The step: each layer of every micro-batch reruns that work at the table's rates.
  Config base = small_config();
  base.model.seq_len = 256;
  base.model.finalize();
  Config c = apply_layout(base, PlanCandidate{{.dp = 1}, Recompute::kSelective, 2});
  c.training.precision = Precision::kBf16;
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  PlanOptions titan = gpu_options(1);
  titan.selective_reruns = SelectiveReruns::kTorchtitanOp;
  const PlanResult r = evaluate_layout(c, titan);
  ModelPartition part;
  part.pp_size = 1;
  part.layer_end = c.model.n_layers;
  const StageFlops w = describe_flops(c.model, part, 2, DType::kBF16, false);
  const Work op = layer_reruns(c.model, part, w, 2, Recompute::kSelective, SelectiveReruns::kTorchtitanOp);
  const Hardware& hw = titan.hardware;
  const double per_layer = op.gemm_flops / (hw.peak_flops * hw.gemm_efficiency) +
                           op.elementwise_bytes / (hw.memory_bandwidth * hw.memory_efficiency);
  EXPECT_NEAR(r.recompute_s, c.grad_accum_steps() * c.model.n_layers * per_layer, 1e-12 * r.step_time_s);
  SelectiveReruns parsed = SelectiveReruns::kAttentionCore;
  EXPECT_TRUE(parse_selective_reruns("torchtitan-op", &parsed));
  EXPECT_EQ(parsed, SelectiveReruns::kTorchtitanOp);
  EXPECT_FALSE(parse_selective_reruns("op", &parsed));
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
      // Trident's allocations, the attention path's scratch and the table's reserve, the
      // allocator's share lost on top.
      const double attention = gpu_attention_workspace_bytes(
          c.parallel.micro_batch_size, c.model.seq_len, c.model.n_heads / l.tp,
          c.model.n_kv_heads / l.tp, c.model.head_dim, DType::kF32);
      const double allocated = m.params + m.master + m.grads + m.optimizer + m.activations +
                               m.comm_buffers + m.scratch + 2 * sizeof(double) + attention;
      const double device = allocated * (1 + o.hardware.fragmentation) + o.hardware.reserved_bytes;
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
    EXPECT_GT(p.memory.workspace, o.hardware.reserved_bytes);
    EXPECT_GT(p.memory.fragmentation, 0);
    EXPECT_EQ(p.comm[ParallelDim::kDp], dp_bytes);
    EXPECT_EQ(p.comm[ParallelDim::kTp], tp_bytes);
    EXPECT_EQ(p.comm[ParallelDim::kPp], pp_bytes);
    EXPECT_EQ(p.bubble, pipeline_bubble_fraction(l.pp, c.grad_accum_steps(), l.virtual_stages));
    // The time parts add up, and MFU is model FLOPs over the bf16 peak.
    EXPECT_NEAR(p.step_time_s,
                p.compute_s + p.recompute_s + p.bubble_s + p.tp_s + p.pp_s + p.dp_s + p.dp_slowdown_s +
                    p.optimizer_s,
                1e-12 * p.step_time_s);
    EXPECT_EQ(p.recompute_s > 0, l.recompute != Recompute::kNone);
    // Overlap hides some of the dp communication, never adds to it.
    EXPECT_LE(p.dp_s, p.dp_comm_s * (1 + 1e-12));
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

// The cores the CPU ranks share are an option (`--cores`), not only this machine's: with
// them given the plan is the same on any machine; 2 ranks of one compute thread each on 2
// cores run at half speed while a collective is in flight (one more busy thread per rank),
// so the step loses compute to the dp collectives (dp_slowdown_s), which on 64 cores it
// does not: there the ranks keep full speed.
TEST(Plan, CpuCoresOptionSetsTheComputeShareWhileACollectiveRuns) {
  Config c = apply_layout(small_config(), PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kNone, 1});
  c.runtime.threads = 1;
  ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  PlanOptions o = gpu_options(2);
  o.hardware = cpu_hardware(1e11, 64.0 * 1073741824.0);
  o.gpus_per_node = 2;
  o.cpu_cores = 2;
  const PlanResult two = evaluate_layout(c, o);
  EXPECT_EQ(evaluate_layout(c, o).step_time_s, two.step_time_s);
  o.cpu_cores = 64;
  const PlanResult many = evaluate_layout(c, o);
  EXPECT_GT(two.dp_slowdown_s, 0);
  EXPECT_EQ(many.dp_slowdown_s, 0);
  EXPECT_GT(two.step_time_s, many.step_time_s);
  EXPECT_EQ(two.compute_s, many.compute_s);
  EXPECT_EQ(two.dp_comm_s, many.dp_comm_s);
}

// The ranks' arrival skew (Hardware::arrival_skew) on CPU ranks: tp's collectives block,
// m x calls equal segments of the step's compute C, so tp waits skew x C x (1 - 1/sqrt(n))
// more, in the step too; ZeRO-3 with overlap off waits at every group's op: most of
// skew x C more; ZeRO-1 with overlap off reduces after the backward (one segment): nothing; so
// does every layout at skew 0 (the GPUs' entries).
TEST(Plan, ArrivalSkewAddsWhereTheRanksWaitForEachOther) {
  PlanOptions o = gpu_options(2);
  o.hardware = cpu_hardware(1e11, 64.0 * 1073741824.0);
  o.gpus_per_node = 2;
  PlanOptions skewed = o;
  skewed.hardware.arrival_skew = 0.02;
  auto both = [&](const PlanCandidate& l, bool overlap) {
    Config c = apply_layout(small_config(), l);
    c.parallel.overlap_grad_reduce = c.parallel.overlap_param_gather = overlap;
    EXPECT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
    return std::pair{evaluate_layout(c, o), evaluate_layout(c, skewed)};
  };
  const auto [tp0, tp] = both(PlanCandidate{{.tp = 2}, Recompute::kNone, 1}, false);
  EXPECT_EQ(tp0.tp_skew_s, 0);
  const LayerCollectives block = describe_collectives(small_config().model);
  const double n = tp.micro_batches * ((block.column_inputs + block.row_outputs) * small_config().model.n_layers + 2);
  const double compute = tp.compute_s + tp.recompute_s;
  EXPECT_NEAR(tp.tp_skew_s, 0.02 * compute * (1 - 1 / std::sqrt(n)), 1e-12);
  EXPECT_NEAR(tp.tp_s - tp0.tp_s, tp.tp_skew_s, 1e-12);
  EXPECT_NEAR(tp.step_time_s - tp0.step_time_s, tp.tp_skew_s, 1e-12);
  const auto [z3_0, z3] = both(PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kNone, 1}, false);
  EXPECT_EQ(z3_0.dp_skew_s, 0);
  const double z3_compute = z3.compute_s + z3.recompute_s;
  EXPECT_GT(z3.dp_skew_s, 0.02 * z3_compute * 0.5);
  EXPECT_LT(z3.dp_skew_s, 0.02 * z3_compute);
  EXPECT_NEAR(z3.dp_s - z3_0.dp_s, z3.dp_skew_s, 1e-12);
  EXPECT_NEAR(z3.step_time_s - z3_0.step_time_s, z3.dp_skew_s, 1e-12);
  const auto [z1_0, z1] = both(PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1}, false);
  EXPECT_NEAR(z1.dp_skew_s, 0, 1e-15);
  EXPECT_NEAR(z1.step_time_s, z1_0.step_time_s, 1e-15);
  EXPECT_EQ(z1_0.dp_s, z1.dp_s);
}

// The tp and dp groups' time split by collective kind (PlanResult::tp_terms, dp_terms) adds
// up to their time, on layouts with each kind; a kind's share of the link divides its bytes
// term and leaves the other kinds' and the latency terms alone.
TEST(Plan, EachCollectiveKindsTermsAddUpToTheGroupsTimeAndFollowItsShare) {
  PlanOptions o = gpu_options(4);
  o.hardware = cpu_hardware(1e11, 64.0 * 1073741824.0);
  o.gpus_per_node = 4;
  constexpr size_t kAr = 0, kRs = 1, kAg = 2;
  for (const PlanCandidate& l : {PlanCandidate{{.dp = 4, .zero_stage = 0}, Recompute::kNone, 1},
                                 PlanCandidate{{.dp = 2, .tp = 2, .zero_stage = 1}, Recompute::kNone, 1},
                                 PlanCandidate{{.dp = 2, .pp = 2, .zero_stage = 3}, Recompute::kNone, 1},
                                 PlanCandidate{{.dp = 2, .tp = 2, .zero_stage = 2, .sequence_parallel = true},
                                               Recompute::kFull, 1}}) {
    Config c = apply_layout(small_config(), l);
    c.model.tie_embeddings = 1;
    c.model.finalize();
    ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
    const PlanResult p = evaluate_layout(c, o);
    EXPECT_NEAR(p.tp_terms.total(), p.tp_s, 1e-12 + 1e-9 * p.tp_s) << layout_name(l);
    EXPECT_NEAR(p.dp_terms.total(), p.dp_comm_s, 1e-12 + 1e-9 * p.dp_comm_s) << layout_name(l);
    const int zero = l.zero_stage;
    EXPECT_EQ(p.dp_terms.bytes_s[kAr] > 0, zero == 0 || l.pp > 1) << layout_name(l);  // + tied wte
    EXPECT_EQ(p.dp_terms.bytes_s[kRs] > 0, zero > 0) << layout_name(l);
    EXPECT_EQ(p.dp_terms.bytes_s[kAg] > 0, zero > 0) << layout_name(l);
    EXPECT_EQ(p.tp_terms.bytes_s[kAr] > 0, l.tp > 1) << layout_name(l);
    EXPECT_EQ(p.tp_terms.bytes_s[kAg] > 0, l.sequence_parallel) << layout_name(l);
    // Reduce-scatters at a quarter of the link's bandwidth: their bytes take 4x as long.
    PlanOptions slow = o;
    slow.hardware.intra_node.share[kRs] = slow.hardware.inter_node.share[kRs] = 0.25;
    const PlanResult q = evaluate_layout(c, slow);
    for (const auto& [a, b] : {std::pair{&p.dp_terms, &q.dp_terms}, std::pair{&p.tp_terms, &q.tp_terms}}) {
      EXPECT_NEAR(b->bytes_s[kRs], 4 * a->bytes_s[kRs], 1e-9 * a->bytes_s[kRs]) << layout_name(l);
      EXPECT_EQ(b->bytes_s[kAr], a->bytes_s[kAr]) << layout_name(l);
      EXPECT_EQ(b->bytes_s[kAg], a->bytes_s[kAg]) << layout_name(l);
      EXPECT_EQ(b->latency_s, a->latency_s) << layout_name(l);
    }
    EXPECT_EQ(q.pp_s, p.pp_s) << "sends keep the link's figure";
  }
}

TEST(Plan, TensorParallelAcrossNodesCostsTheNetwork) {
  Config base = small_config();
  base.model.n_kv_heads = 4;
  base.model.d_model = 1024;  // 4 MiB all-reduces: bandwidth, not latency, decides
  base.model.seq_len = 1024;
  base.model.finalize();
  const Config c = apply_layout(base, PlanCandidate{{.dp = 2, .tp = 4}, Recompute::kNone, 1});
  const PlanResult inside = evaluate_layout(c, gpu_options(8, 8));
  const PlanResult across = evaluate_layout(c, gpu_options(8, 1));
  EXPECT_FALSE(inside.crosses_nodes[ParallelDim::kTp]);
  EXPECT_TRUE(across.crosses_nodes[ParallelDim::kTp]);
  EXPECT_GT(across.tp_s, 5 * inside.tp_s);  // one member per node: 50 vs 450 GB/s
  // Two members per node run their rings over two NICs at once: 100 GB/s.
  const PlanResult two = evaluate_layout(c, gpu_options(8, 2));
  EXPECT_TRUE(two.crosses_nodes[ParallelDim::kTp]);
  EXPECT_GT(two.tp_s, 3 * inside.tp_s);
  EXPECT_LT(two.tp_s, 0.6 * across.tp_s);
}

// A group that crosses nodes with r members in each runs NCCL's rings on r rails (each
// member's NIC carries 1/r of the data): its bandwidth term is r NICs', at most NVLink's.
TEST(Plan, GroupsAcrossNodesUseOneNicPerMemberInTheNode) {
  Config base = small_config();
  base.model.d_model = 1024;  // megabytes per bucket: bandwidth, not only latency
  base.model.finalize();
  Config c = apply_layout(base, PlanCandidate{{.dp = 8, .zero_stage = 1}, Recompute::kNone, 1});
  c.parallel.overlap_grad_reduce = false;  // all exposed: dp_comm_s is the link model's
  // The bytes term of dp_comm_s: twice what doubling the network's bandwidth saves (the
  // per-call latencies stay).
  auto bytes_s = [&](const Config& cfg, int devices, int per_node) {
    PlanOptions o = gpu_options(devices, per_node);
    const double t = evaluate_layout(cfg, o).dp_comm_s;
    o.hardware.inter_node.bytes_per_s *= 2;
    o.hardware.intra_node.bytes_per_s *= 2;
    return 2 * (t - evaluate_layout(cfg, o).dp_comm_s);
  };
  const double one = bytes_s(c, 8, 1), four = bytes_s(c, 8, 4);  // 1 and 4 members per node
  ASSERT_GT(four, 0);
  EXPECT_NEAR(one / four, 4.0, 1e-9);
  // dp 8 on one NIC each: the network's 50 GB/s x 0.8, ZeRO-1's reduce-scatter and
  // all-gather over 8 ranks (7/8 of each payload).
  const Hardware h100 = gpu_options(8).hardware;
  const double payload = evaluate_layout(c, gpu_options(8, 1)).comm[ParallelDim::kDp];
  EXPECT_NEAR(one, payload * 7 / 8 / (h100.inter_node.bytes_per_s * h100.inter_node.efficiency),
              1e-6 * one);
  // A network as fast as NVLink: eight members per node reach NVLink's figure, not 8 x it
  // (the same time as 16 ranks inside one node of 16).
  Config wide = apply_layout(base, PlanCandidate{{.dp = 16, .zero_stage = 1}, Recompute::kNone, 1});
  wide.training.global_batch_size = 16;
  wide.parallel.overlap_grad_reduce = false;
  PlanOptions fast = gpu_options(16, 8);
  fast.hardware.inter_node = fast.hardware.intra_node;
  PlanOptions node16 = gpu_options(16, 16);
  EXPECT_DOUBLE_EQ(evaluate_layout(wide, fast).dp_comm_s, evaluate_layout(wide, node16).dp_comm_s);
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

// --configured-only: the configured layout as the search would evaluate it, and nothing
// else, also where the search is refused (a batch of many divisors on many devices).
TEST(Plan, ConfiguredOnlyEvaluatesTheConfiguredLayoutAlone) {
  // Megatron-LM 2021's 145.6B GPT on 1536 A100s (tests/plan/published_runs.json): its
  // batch of 2304 on 1536 devices gives the search more than kMaxPlanCandidates layouts.
  auto loaded = load_config(std::string(TRIDENT_SOURCE_DIR) + "/configs/gpt2-350m.yaml",
                            {"model.vocab_size=51200", "model.seq_len=2048", "model.n_layers=80",
                             "model.n_heads=96", "model.n_kv_heads=96", "model.d_model=12288",
                             "parallel.dp=24", "parallel.tp=8", "parallel.pp=8",
                             "training.global_batch_size=2304", "training.precision=bf16",
                             "training.recompute=full"});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const Config base = loaded.value();
  PlanOptions o = gpu_options(1536);
  Result<Plan> searched = make_plan(base, o);
  ASSERT_FALSE(searched.is_ok());
  EXPECT_NE(searched.status().message().find("layouts to try"), std::string::npos);
  o.configured_only = true;
  Result<Plan> alone = make_plan(base, o);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  EXPECT_TRUE(alone->layouts.empty());
  EXPECT_EQ(alone->recommended, -1);
  const PlanResult direct = evaluate_layout(base, o);
  EXPECT_EQ(alone->configured.candidate, direct.candidate);
  EXPECT_EQ(alone->configured.step_time_s, direct.step_time_s);
  EXPECT_EQ(alone->configured.memory.total, direct.memory.total);
  const std::string table = plan_table(alone.value(), 20);
  EXPECT_NE(table.find("# --configured-only: the configured layout alone"), std::string::npos) << table;
  EXPECT_EQ(table.find("recommended:"), std::string::npos) << table;
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
  EXPECT_EQ(keys(j), (std::set<std::string>{"devices", "gpu", "gpus_per_node", "model",
                                            "configured", "dp_auto", "recommended", "layouts"}));
  EXPECT_EQ(j["dp_auto"], false);  // set by trident plan for a config with parallel.dp: auto
  // A dense model: every parameter is active.
  EXPECT_EQ(keys(j["model"]),
            (std::set<std::string>{"parameters", "active_parameters", "flops_per_token"}));
  EXPECT_EQ(j["model"]["parameters"], base.model.num_parameters());
  EXPECT_EQ(j["model"]["active_parameters"], base.model.num_parameters());
  EXPECT_EQ(j["devices"], 8);
  EXPECT_EQ(j["gpu"], "h100");
  EXPECT_EQ(j["gpus_per_node"], 8);
  ASSERT_EQ(j["layouts"].size(), 156u);
  const std::set<std::string> layout_keys = {
      "dp", "tp", "pp", "virtual_stages", "zero_stage", "sequence_parallel", "recompute",
      "micro_batch_size", "fits", "memory_bytes", "comm_bytes_per_step", "bubble",
      "step_time_s", "tokens_per_s_per_gpu", "mfu", "reason",
      // added by the overlap model: where the step goes, the dp communication in all, and
      // the overlap switches assumed
      "time_s", "dp_comm_s", "overlap_grad_reduce", "overlap_param_gather",
      // added by context parallelism: the cp degree, and whether its ring overlaps the block attention
      "cp", "cp_ring_overlapped",
      // added by expert parallelism: the ep degree
      "ep",
      // added with each stage's pipeline wait
      "stage_pp_wait_s",
      // added with the ranks' arrival skew (of time_s.tp and time_s.dp)
      "arrival_skew_s"};
  for (const nlohmann::json& l : {j["configured"], j["recommended"], j["layouts"][0], j["layouts"][155]}) {
    EXPECT_EQ(keys(l), layout_keys);
    EXPECT_EQ(keys(l["memory_bytes"]),
              (std::set<std::string>{"params", "grads", "optimizer", "activations", "buffers",
                                     "workspace", "fragmentation", "total"}));
    EXPECT_EQ(keys(l["time_s"]), (std::set<std::string>{"compute", "recompute", "bubble", "tp", "pp", "cp",
                                                        "ep", "dp", "dp_slowdown", "optimizer"}));
    EXPECT_EQ(keys(l["arrival_skew_s"]), (std::set<std::string>{"tp", "dp"}));
    EXPECT_EQ(l["arrival_skew_s"]["tp"], 0.0);  // a GPU table: no skew
    EXPECT_EQ(l["arrival_skew_s"]["dp"], 0.0);
    double parts = 0;
    for (const auto& [k, v] : l["time_s"].items()) parts += v.get<double>();
    EXPECT_NEAR(parts, l["step_time_s"].get<double>(), 1e-12 * parts);
    const nlohmann::json& mem = l["memory_bytes"];
    EXPECT_NEAR(mem["params"].get<double>() + mem["grads"].get<double>() +
                    mem["optimizer"].get<double>() + mem["activations"].get<double>() +
                    mem["buffers"].get<double>() + mem["fragmentation"].get<double>(),
                mem["total"].get<double>(), 1e-9 * mem["total"].get<double>());
    EXPECT_TRUE(l["overlap_grad_reduce"].get<bool>());
    EXPECT_EQ(keys(l["comm_bytes_per_step"]),
              (std::set<std::string>{"dp", "tp", "pp", "cp", "ep", "expert_dp"}));
    EXPECT_EQ(l["virtual_stages"], 1);
  }
  EXPECT_EQ(j["recommended"], j["layouts"][0]);
  EXPECT_EQ(j["layouts"][0]["memory_bytes"]["total"].get<double>(), plan->layouts[0].memory.total);
}

// Each stage's wait in its pipeline transfers: the slowest stage's is the bubble and its
// own transfers; a lighter stage waits, on each micro-batch, the slowest one's surplus.
TEST(Plan, EveryStageWaitsForTheSlowestStage) {
  Config c = small_config();  // 2 layers, 8 micro-batches
  c.model.n_layers = 3;
  c.parallel.pp = 2;
  const PlanOptions o = gpu_options(2);
  // Balanced is [2, 1]: stage 0 with two layers and the embedding, stage 1 with one and the
  // head. [1, 2] moves a layer to the last stage.
  for (const std::vector<int>& layers : {std::vector<int>{2, 1}, std::vector<int>{1, 2}}) {
    c.parallel.stage_layers = layers;
    ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
    const PlanResult r = evaluate_layout(c, o);
    ASSERT_EQ(r.stage_pp_wait_s.size(), 2u);
    const int slow = layers[0] > layers[1] ? 0 : 1;
    SCOPED_TRACE("stage_layers " + std::to_string(layers[0]) + "," + std::to_string(layers[1]));
    EXPECT_NEAR(r.stage_pp_wait_s[static_cast<size_t>(slow)], r.bubble_s + r.pp_s, 1e-12 * r.step_time_s);
    // The other stage computes a layer less per micro-batch (the embedding and head aside):
    // it waits about a layer's forward and backward more on each of the 8.
    const double other = r.stage_pp_wait_s[static_cast<size_t>(1 - slow)];
    const double layer_s = r.compute_s / 8 / std::max(layers[0], layers[1]);
    EXPECT_GT(other - r.bubble_s - r.pp_s, 0.5 * 8 * layer_s) << other;
    EXPECT_LT(other - r.bubble_s - r.pp_s, 1.5 * 8 * layer_s) << other;
    EXPECT_LT(other, r.step_time_s);
  }
  // No pipeline: one stage, which waits for nothing.
  c.parallel.pp = 1;
  c.parallel.stage_layers.clear();
  const PlanResult one = evaluate_layout(c, o);
  ASSERT_EQ(one.stage_pp_wait_s.size(), 1u);
  EXPECT_EQ(one.stage_pp_wait_s[0], 0.0);
}

// ---- The overlap model (plan/overlap.h), cases known by hand.

std::vector<OverlapOp> ops_of(int n, double compute, double gather, double reduce) {
  std::vector<OverlapOp> ops(static_cast<size_t>(n));
  for (OverlapOp& o : ops) {
    o.compute = compute;
    o.gather = gather;
    o.reduce = reduce;
  }
  return ops;
}

// ZeRO-3 forward: a gather before every group, prefetched one ahead behind the previous
// group's compute. Gathers smaller than a group's compute: only the first is exposed;
// larger: all of them less the compute that hid them (every group's but the last).
TEST(Overlap, PrefetchedGathersExposeTheFirstOrTheExcess) {
  const OverlapPolicy prefetch{.prefetch = true};
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(10, 3.0, 2.0, 0), prefetch), 2.0);
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(10, 2.0, 3.0, 0), prefetch), 10 * 3.0 - 9 * 2.0);
  // Without prefetch every gather waits: the old all-exposed model.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(10, 3.0, 2.0, 0), OverlapPolicy{}), 10 * 2.0);
  // A group with no compute (the embedding lookup) hides nothing: the second gather too
  // is exposed.
  std::vector<OverlapOp> ops = ops_of(4, 3.0, 2.0, 0);
  ops[0].compute = 0;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, prefetch), 2.0 + 2.0);
}

// ZeRO-2/3 backward: a reduce-scatter issued after every group, behind the next groups'
// compute; the last one cannot hide. The queue holds 2: the compute thread waits for the
// oldest before issuing a third.
TEST(Overlap, ReductionsHideBehindTheFollowingComputeButTheLast) {
  const OverlapPolicy queue{.async_reduce = true, .queue_depth = 2};
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(8, 3.0, 0, 2.0), queue), 2.0);
  // Reductions longer than the compute: the stream runs from the first op's end to the
  // last reduction's end without a gap, so the exposed time is all of them less the
  // compute after the first op.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(8, 2.0, 0, 3.0), queue), 8 * 3.0 - 7 * 2.0);
  // Synchronous: every one waits.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(8, 3.0, 0, 2.0), OverlapPolicy{}), 8 * 2.0);
  // One op's reduction in 4 pieces with room for 2 in flight: the compute thread waits for
  // the first two before it issues the last two; with nothing after, all 4 are exposed,
  // and an op after hides the last two (8 > 2 * 1).
  std::vector<OverlapOp> one = ops_of(1, 1.0, 0, 4.0);
  one[0].pieces = 4;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(one, queue), 4.0);
  one.push_back(OverlapOp{.compute = 8.0});
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(one, queue), 2.0);
  // ZeRO-0's all-reduces are not queued: all 4 run behind the next op.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(one, OverlapPolicy{.async_reduce = true}), 0.0);
}

// CPU ranks: compute slows while a collective is in flight (the communication thread
// shares the cores). Worked by hand with 2 ops of 3 s and a 2 s reduction after the first:
// at rate 1 it hides (the last op's own reduction excepted: none); at rate 0.5 the second
// op's compute runs 2 s at half speed (1 s of its work) with the reduction, then 2 s
// alone: 4 s, 1 s exposed; at rate 0.25, 2 s for 0.5 s of work, then 2.5 s: 1.5 s.
// All of it is the compute's slowdown, none a wait.
TEST(Overlap, ComputeSlowedWhileACollectiveIsInFlightCountsAsExposed) {
  std::vector<OverlapOp> ops = ops_of(2, 3.0, 0, 0);
  ops[0].reduce = 2.0;
  OverlapPolicy p{.async_reduce = true, .queue_depth = 2};
  double slowdown = -1;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 0.0);
  EXPECT_DOUBLE_EQ(slowdown, 0.0);
  p.compute_rate_in_flight = 0.5;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 1.0);
  EXPECT_DOUBLE_EQ(slowdown, 1.0);
  p.compute_rate_in_flight = 0.25;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 1.5);
  EXPECT_DOUBLE_EQ(slowdown, 1.5);
  // Synchronous collectives are waited for, nothing runs beside them: the rate changes
  // nothing, and the 2 s are a wait.
  p.async_reduce = false;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 2.0);
  EXPECT_DOUBLE_EQ(slowdown, 0.0);
}

// CPU ranks again: the collective slows too while the compute runs beside it (the
// communication thread shares the cores), and runs at full speed once the compute thread
// waits for it. The same 2 ops of 3 s and 2 s reduction: at both rates 0.5 the reduction
// takes 4 s beside the second op, which does 2 s of its work meanwhile and 1 s alone:
// 5 s, 2 s exposed. At compute 1 and collective 0.5 the op ends after 3 s with 0.5 s of
// the reduction left, waited for at full speed: 0.5 s.
TEST(Overlap, ACollectiveSlowedBesideComputeRunsFullSpeedWhenWaitedFor) {
  std::vector<OverlapOp> ops = ops_of(2, 3.0, 0, 0);
  ops[0].reduce = 2.0;
  OverlapPolicy p{.async_reduce = true, .queue_depth = 2, .compute_rate_in_flight = 0.5,
                  .comm_rate_in_compute = 0.5};
  double slowdown = -1;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 2.0);
  EXPECT_DOUBLE_EQ(slowdown, 2.0);  // the second op took 5 s for its 3: no wait
  p.compute_rate_in_flight = 1;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p, &slowdown), 0.5);
  EXPECT_DOUBLE_EQ(slowdown, 0.0);  // the compute kept its speed: 0.5 s waited
  // Overlap then saves nothing over waiting at once (2 s) when both halve.
  p.compute_rate_in_flight = 0.5;
  p.async_reduce = false;
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, p), 2.0);
}

// Gathers and reductions share one stream in issue order: in ZeRO-3's backward each group
// waits for its gather, issued after the previous group's reduction.
TEST(Overlap, GathersQueueBehindReductionsOnOneStream) {
  const OverlapPolicy both{.prefetch = true, .async_reduce = true, .queue_depth = 2};
  // Per group 1 s gather + 1 s reduction behind 3 s of compute: only the first gather and
  // the last reduction are exposed.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(6, 3.0, 1.0, 1.0), both), 2.0);
  // Behind 1.5 s: the stream needs 2 s per group (its gather, the previous one's
  // reduction), so ops 2-5 wait 0.5 s each for their gather; it idles only in op 0 (the
  // second gather done, no reduction yet) and op 5 (no gather left), 0.5 s each. The step
  // is the stream's 12 s busy + 1 s idle; exposed = 13 - 6 * 1.5.
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops_of(6, 1.5, 1.0, 1.0), both), 13.0 - 6 * 1.5);
}

// Tensor-parallel collectives on the dp link: the stream does not progress during them.
TEST(Overlap, TensorParallelTimeOnTheSameLinkHidesNothing) {
  const OverlapPolicy prefetch{.prefetch = true};
  std::vector<OverlapOp> ops = ops_of(2, 1.0, 1.5, 0);
  ops[0].busy = 1.0;  // the tp collectives of op 0 on the same link
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, prefetch), 1.5 + 0.5);
  ops[0].busy = 0;
  ops[0].compute = 2.0;  // the same second on another link hides it
  EXPECT_DOUBLE_EQ(exposed_dp_seconds(ops, prefetch), 1.5);
}

// Where the compute thread waits (the ranks meet there: plan/overlap.h WaitSegments), by
// hand: synchronous reductions after each of 4 ops of 3 s split the step into 4
// segments of 3 s; the same reductions at the end (ZeRO-0/1's reduce_gradients) leave one
// of 12 s, with the same exposed time; reductions that hide behind the next op wait only
// at the end: one segment. Prefetched gathers longer than the compute wait at every op but
// the first: segments 0 (the first gather), then 3 s each.
TEST(Overlap, TheComputeBetweenTheWaitsIsWhereTheRanksMeet) {
  auto segments = [](const std::vector<OverlapOp>& ops, const OverlapPolicy& p, double* exposed) {
    WaitSegments s;
    *exposed = exposed_dp_seconds(ops, p, nullptr, &s);
    return std::pair{s.sum, s.squares};
  };
  double exposed = 0;
  EXPECT_EQ(segments(ops_of(4, 3.0, 0, 1.0), OverlapPolicy{}, &exposed), (std::pair{12.0, 4 * 9.0}));
  EXPECT_DOUBLE_EQ(exposed, 4.0);
  EXPECT_EQ(segments(ops_of(4, 3.0, 0, 1.0), OverlapPolicy{.reduce_at_end = true}, &exposed),
            (std::pair{12.0, 144.0}));
  EXPECT_DOUBLE_EQ(exposed, 4.0);
  EXPECT_EQ(segments(ops_of(4, 3.0, 0, 1.0), OverlapPolicy{.async_reduce = true, .queue_depth = 2}, &exposed),
            (std::pair{12.0, 144.0}));
  EXPECT_DOUBLE_EQ(exposed, 1.0);
  EXPECT_EQ(segments(ops_of(4, 3.0, 4.0, 0), OverlapPolicy{.prefetch = true}, &exposed),
            (std::pair{12.0, 4 * 9.0}));
  EXPECT_DOUBLE_EQ(exposed, 4.0 + 3 * 1.0);
  // A caller's compute before the ops (WaitSegments::open) joins the first segment.
  WaitSegments lead;
  lead.open = 5;
  exposed_dp_seconds(ops_of(4, 3.0, 0, 1.0), OverlapPolicy{}, nullptr, &lead);
  EXPECT_DOUBLE_EQ(lead.sum, 17.0);
  EXPECT_DOUBLE_EQ(lead.squares, 64.0 + 3 * 9.0);
  EXPECT_DOUBLE_EQ(lead.open, 0.0);
}

// A model big enough for compute to matter (8 x 1024 tokens of width 1024 per micro-batch).
Config overlap_config(int zero) {
  Config c = small_config();
  c.model.n_layers = 8;
  c.model.n_heads = 8;
  c.model.n_kv_heads = 8;
  c.model.d_model = 1024;
  c.model.d_ff = 4096;
  c.model.seq_len = 1024;
  c.model.finalize();
  c.training.precision = Precision::kBf16;
  c.training.global_batch_size = 64;
  c.parallel.dp = 8;
  c.parallel.micro_batch_size = 8;
  c.parallel.zero_stage = zero;
  EXPECT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  return c;
}

// The dp collectives the trainer issues per step on a one-stage model (parallel/
// data_parallel.h, parallel/sharded_param_store.h), counted here from the layout: ZeRO-0
// one all-reduce per 25 MiB bucket of each group, ZeRO-1 a reduce-scatter and an
// all-gather per bucket, ZeRO-2 a reduce-scatter per group and micro-batch and the
// buckets' gathers, ZeRO-3 two gathers and a reduce-scatter per group and micro-batch
// (a tied head uses group 0 once more under ZeRO-2/3).
struct TrainerCalls {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  double total() const { return all_reduce + reduce_scatter + all_gather; }
};
TrainerCalls trainer_dp_calls(const Config& c, const ParamLayout& layout) {
  double groups = 0, buckets = 0;
  for (const ParamGroup& g : layout.groups) {
    if (g.num_floats == 0) continue;
    groups += 1;
    buckets += std::ceil(g.num_floats * 4.0 / (25.0 * 1048576.0));
  }
  const double used = (groups + (c.model.tied() ? 1 : 0)) * c.grad_accum_steps();
  switch (c.parallel.zero_stage) {
    case 0: return {buckets, 0, 0};
    case 1: return {0, buckets, buckets};
    case 2: return {0, used, buckets};
    default: return {0, used, 2 * used};
  }
}

// Overlap off is the old all-exposed model: dp = every dp byte over the link (the kinds'
// payloads times the ring bus factor over 80% of the link, one latency per collective
// the trainer issues), the step its parts' sum; on, the same
// communication with some of it hidden, the step shorter by exactly that.
TEST(Plan, OverlapOffIsTheAllExposedModelAndOnHidesPartOfIt) {
  const PlanOptions o = gpu_options(8);
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    Config off = overlap_config(zero);
    off.parallel.overlap_grad_reduce = false;
    off.parallel.overlap_param_gather = false;
    const PlanResult a = evaluate_layout(off, o);
    const PlanResult b = evaluate_layout(overlap_config(zero), o);
    const ModelPartition part = stage_partition(off, 0);
    const RankTraffic t = analytic_traffic(off, part, describe_params(off.model, part));
    const double bw = 450e9 * 0.8, latency = 10e-6;
    const double calls = trainer_dp_calls(off, describe_params(off.model, part)).total();
    const int kinds = (t.dp.all_reduce > 0) + (t.dp.reduce_scatter > 0) + (t.dp.all_gather > 0);
    const double by_hand = t.dp.all_reduce * 2 * 7 / 8 / bw + t.dp.reduce_scatter * 7 / 8 / bw +
                           t.dp.all_gather * 7 / 8 / bw + calls * latency;
    EXPECT_EQ(kinds, zero == 0 ? 1 : 2);
    EXPECT_NEAR(a.dp_comm_s, by_hand, 1e-12 * by_hand);
    EXPECT_NEAR(a.dp_s, a.dp_comm_s, 1e-12 * a.dp_comm_s);
    EXPECT_NEAR(b.dp_comm_s, a.dp_comm_s, 1e-12 * a.dp_comm_s);
    EXPECT_LT(b.dp_s, a.dp_s);
    EXPECT_NEAR(a.step_time_s - b.step_time_s, a.dp_s - b.dp_s, 1e-9 * a.step_time_s);
    EXPECT_EQ(a.compute_s, b.compute_s);
    EXPECT_FALSE(a.overlap_grad_reduce);
    EXPECT_TRUE(b.overlap_grad_reduce && b.overlap_param_gather);
    // What cannot hide: ZeRO-3's first gather (the embeddings) and, at every stage, the
    // last reduction (the embeddings' gradients); ZeRO-1/2's parameter gather after the
    // update.
    const double emb = describe_params(off.model, part).groups[0].num_floats;
    const double rs_emb = emb * 4 * 7 / 8 / bw;  // its gradients reduce-scattered (f32)
    EXPECT_GT(b.dp_s,
              (zero == 3 ? emb * 2 * 7 / 8 / bw : 0) + (zero == 0 ? 2 * rs_emb : rs_emb) * 0.99);
    if (zero == 1 || zero == 2) {
      EXPECT_GT(b.dp_s, t.dp.all_gather * 7 / 8 / bw);
    }
  }
  // One switch off at ZeRO-3. overlap_grad_reduce off: the gathers still hide, the
  // reductions are waited for. overlap_param_gather off: every group waits for its
  // gather, which the stream runs after the reductions issued before it, so nothing hides
  // (the model's stream is FIFO): the all-exposed figure.
  const PlanResult both = evaluate_layout(overlap_config(3), o);
  Config none = overlap_config(3);
  none.parallel.overlap_grad_reduce = false;
  none.parallel.overlap_param_gather = false;
  const PlanResult n = evaluate_layout(none, o);
  Config reduces = overlap_config(3);
  reduces.parallel.overlap_grad_reduce = false;
  const PlanResult r = evaluate_layout(reduces, o);
  EXPECT_GT(r.dp_s, both.dp_s);
  EXPECT_LT(r.dp_s, n.dp_s);
  Config gathers = overlap_config(3);
  gathers.parallel.overlap_param_gather = false;
  EXPECT_NEAR(evaluate_layout(gathers, o).dp_s, n.dp_s, 1e-12 * n.dp_s);
}

// ZeRO-3 on one stage, worked by hand from the groups' sizes. Each item on the dp stream
// takes its kind's seconds per step (the all-exposed figure: bytes x bus factor / 80% of
// the link + one latency per collective of its kind) in proportion to its group's floats.
struct Zero3Case {
  Config config;
  PlanResult result;
  double emb = 0, layer1 = 0, all = 0;  // floats: group 0, group 1, every group
  double ag_s = 0, rs_s = 0;            // the step's gathers and reduce-scatters, seconds
};
Zero3Case zero3_case(int micro_batch_size, int seq_len, int global_batch, int per_node) {
  Zero3Case z;
  Config& c = z.config;
  c = overlap_config(3);
  c.model.vocab_size = 32768;  // a head with compute of its own
  c.model.seq_len = seq_len;
  c.model.tie_embeddings = 0;
  c.model.padded_vocab = 0;
  c.model.finalize();
  c.parallel.micro_batch_size = micro_batch_size;
  c.training.global_batch_size = global_batch;
  EXPECT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  const PlanOptions o = gpu_options(8, per_node);
  z.result = evaluate_layout(c, o);
  const ModelPartition part = stage_partition(c, 0);
  const ParamLayout layout = describe_params(c.model, part);
  for (const ParamGroup& g : layout.groups) z.all += g.num_floats;
  z.emb = layout.groups[0].num_floats;
  z.layer1 = layout.groups[1].num_floats;
  const RankTraffic t = analytic_traffic(c, part, layout);
  const LinkSpec& link = per_node >= 8 ? o.hardware.intra_node : o.hardware.inter_node;
  const double bw = link.bytes_per_s * 0.8;
  const TrainerCalls calls = trainer_dp_calls(c, layout);  // two gathers per reduce-scatter
  z.ag_s = t.dp.all_gather * 7 / 8 / bw + calls.all_gather * link.latency_s;
  z.rs_s = t.dp.reduce_scatter * 7 / 8 / bw + calls.reduce_scatter * link.latency_s;
  return z;
}

// Gathers and reduce-scatters shorter than every layer's and the head's compute (8 x
// 1024 tokens per micro-batch over NVLink): what cannot hide is what sits next to the
// embedding lookup, which computes nothing: the step's first gather (the embeddings')
// and the first layer's behind it, and per micro-batch boundary the first layer's and
// the embeddings' reduce-scatters and the next gathers of both; at the end the last two
// reduce-scatters. Per micro-batch that is (emb + layer 1) of each kind: with 8
// micro-batches of 1/8 of the step's items each, (emb + layer1) / all of a gather pass
// (half of the step's gathers: forward and backward) plus of the reduce-scatters.
TEST(Plan, Zero3GathersShorterThanComputeExposeOnlyWhatTheLookupCannotCover) {
  const Zero3Case z = zero3_case(8, 1024, 512, 8);
  EXPECT_EQ(z.result.micro_batches, 8);  // 4 played, 4 extrapolated
  const double by_hand = (z.emb + z.layer1) / z.all * (z.ag_s / 2 + z.rs_s);
  EXPECT_NEAR(z.result.dp_s, by_hand, 1e-9 * by_hand);
  EXPECT_NEAR(z.result.dp_comm_s, z.ag_s + z.rs_s, 1e-12 * z.result.dp_comm_s);
  EXPECT_LT(z.result.dp_s, 0.5 * z.result.dp_comm_s);
}

// Gathers longer than every group's compute (1024 tokens per micro-batch, dp over the
// network): the stream never idles from the first gather to the last reduce-scatter, so
// the exposed time is all of it less the compute it ran behind (all of the compute).
TEST(Plan, Zero3GathersLongerThanComputeExposeTheirSumLessTheCompute) {
  const Zero3Case z = zero3_case(1, 1024, 64, 1);
  ASSERT_TRUE(z.result.crosses_nodes[ParallelDim::kDp]);
  const double compute = z.result.compute_s + z.result.recompute_s;
  const double by_hand = z.ag_s + z.rs_s - compute;
  EXPECT_GT(compute, 0.03 * by_hand);  // the compute is not negligible in the check
  EXPECT_NEAR(z.result.dp_s, by_hand, 1e-9 * by_hand);
}

// The table shows where each layout's step goes and which overlap switches (and which
// selective reruns) it assumed.
TEST(Plan, TableShowsTheStepsPartsAndTheOverlapSwitches) {
  Config c = overlap_config(3);
  c.parallel.overlap_param_gather = false;
  Result<Plan> plan = make_plan(c, gpu_options(8));
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_FALSE(plan->layouts[0].overlap_param_gather);
  const std::string table = plan_table(plan.value(), 3);
  for (const char* column :
       {"comp s", "recomp s", "bubl s", "tp s", "pp s", "cp s", "ep s", "dp s", "slow s", "opt s"}) {
    EXPECT_NE(table.find(column), std::string::npos) << column;
  }
  EXPECT_NE(table.find("parallel.overlap_grad_reduce=true and parallel.overlap_param_gather=false"),
            std::string::npos)
      << table;
  // What selective recomputation reruns, when it is torchtitan's policy (not Trident's).
  const std::string titan_line = "# recomp s: selective reruns as torchtitan's op-level policy "
                                 "(--selective-reruns torchtitan-op";
  EXPECT_EQ(table.find(titan_line), std::string::npos) << table;
  PlanOptions titan = gpu_options(8);
  titan.selective_reruns = SelectiveReruns::kTorchtitanOp;
  Result<Plan> titan_plan = make_plan(c, titan);
  ASSERT_TRUE(titan_plan.is_ok()) << titan_plan.status().message();
  EXPECT_EQ(titan_plan->selective_reruns, SelectiveReruns::kTorchtitanOp);
  EXPECT_NE(plan_table(titan_plan.value(), 3).find(titan_line), std::string::npos)
      << plan_table(titan_plan.value(), 3);
  // The configured row's parts, as printed (%.3f), in the order of the header.
  const PlanResult& r = plan->configured;
  char parts[160];
  std::snprintf(parts, sizeof(parts), "%8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f",
                r.step_time_s, r.compute_s, r.recompute_s, r.bubble_s, r.tp_s, r.pp_s, r.cp_s,
                r.ep_s, r.dp_s, r.optimizer_s);
  EXPECT_NE(table.find(parts), std::string::npos) << parts << "\n" << table;
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
  EXPECT_EQ(h100->reserved_bytes, 2.0 * 1073741824.0);
  EXPECT_EQ(h100->fragmentation, 0.02);
  // The efficiencies are parameters of the table: h100's (and a100's) fitted by
  // `trident plan --calibrate` to one published run (configs/hardware.yaml says which),
  // one factor on plan/hardware.h's defaults with their ratios kept; b200 at the defaults.
  EXPECT_NEAR(h100->gemm_efficiency / kGemmEfficiency, 0.7265, 1e-3);
  EXPECT_NEAR(h100->attention_efficiency / kAttentionEfficiency, 0.7265, 1e-3);
  EXPECT_NEAR(h100->memory_efficiency / kMemoryEfficiency, 0.7265, 1e-3);
  Result<Hardware> a100 = find_gpu(table.value(), "a100");
  ASSERT_TRUE(a100.is_ok());
  EXPECT_NEAR(a100->gemm_efficiency / kGemmEfficiency, 0.9214, 1e-3);
  EXPECT_NEAR(a100->attention_efficiency / kAttentionEfficiency, 0.9214, 1e-3);
  EXPECT_NEAR(a100->memory_efficiency / kMemoryEfficiency, 0.9214, 1e-3);
  Result<Hardware> b200 = find_gpu(table.value(), "b200");
  ASSERT_TRUE(b200.is_ok());
  EXPECT_EQ(b200->gemm_efficiency, kGemmEfficiency);
  EXPECT_EQ(b200->attention_efficiency, kAttentionEfficiency);
  EXPECT_EQ(b200->memory_efficiency, kMemoryEfficiency);
  EXPECT_EQ(h100->intra_node.efficiency, kLinkEfficiency);
  EXPECT_EQ(h100->inter_node.efficiency, kLinkEfficiency);
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
  // An entry complete up to the keys the overlap change added, then `extra`.
  auto with = [&](const std::string& extra) {
    return parse_hardware_table("gpus: [{name: x, peak_bf16_tflops: 1, memory_gib: 1, memory_tbps: 1, "
                                "interconnect: nv, network: nv" + extra + "}]\n" + links,
                                "hw.yaml");
  };
  Result<HardwareTable> no_reserve = with("");
  ASSERT_FALSE(no_reserve.is_ok());
  EXPECT_EQ(no_reserve.status().message(), "hw.yaml: gpus[0].reserved_gib: missing");
  Result<HardwareTable> frag = with(", reserved_gib: 0, fragmentation: -0.1");
  ASSERT_FALSE(frag.is_ok());
  EXPECT_EQ(frag.status().message(), "hw.yaml: gpus[0].fragmentation: must be >= 0, got -0.1");
  Result<HardwareTable> whole = with(", reserved_gib: 0, fragmentation: 1");
  ASSERT_FALSE(whole.is_ok());
  EXPECT_NE(whole.status().message().find("hw.yaml: gpus[0].fragmentation: must be < 1"), std::string::npos);
  Result<HardwareTable> zeros = with(", reserved_gib: 0, fragmentation: 0");  // both may be 0
  ASSERT_TRUE(zeros.is_ok()) << zeros.status().message();
  EXPECT_EQ(zeros->gpus[0].reserved_bytes, 0);
  // A link's per-kind shares are optional (1) and positive; the cpu entry's are link_*.
  Result<HardwareTable> shares = parse_hardware_table(
      "gpus: []\ninterconnects: [{name: nv, gbytes_per_s: 450, latency_us: 10, reduce_scatter_share: 0.25}]\n"
      "cpu: {peak_gflops: 100, memory_gbps: 10, link_gbytes_per_s: 5, link_latency_us: 5, gemm_efficiency: 0.5,\n"
      "      attention_efficiency: 0.5, link_all_gather_share: 1.5}\n",
      "hw.yaml");
  ASSERT_TRUE(shares.is_ok()) << shares.status().message();
  EXPECT_EQ(shares->links[0].share, (std::array<double, 3>{1, 0.25, 1}));
  EXPECT_EQ(shares->cpu.intra_node.share, (std::array<double, 3>{1, 1, 1.5}));
  EXPECT_EQ(shares->cpu.inter_node.share, shares->cpu.intra_node.share);
  EXPECT_DOUBLE_EQ(shares->links[0].kind_bytes_per_s(CollectiveKind::kReduceScatter), 450e9 * 0.8 * 0.25);
  EXPECT_DOUBLE_EQ(shares->links[0].kind_bytes_per_s(CollectiveKind::kSend), 450e9 * 0.8);
  // The cpu entry's overlap rates are optional (0: the threads' shares) and in (0, 1].
  EXPECT_EQ(shares->cpu.overlap_comm_rate, 0);
  EXPECT_EQ(shares->cpu.overlap_compute_rate, 0);
  const std::string cpu_entry =
      "gpus: []\ninterconnects: []\ncpu: {peak_gflops: 100, memory_gbps: 10, link_gbytes_per_s: 5, "
      "link_latency_us: 5, gemm_efficiency: 0.5, attention_efficiency: 0.5, ";
  Result<HardwareTable> rates =
      parse_hardware_table(cpu_entry + "overlap_comm_rate: 0.05, overlap_compute_rate: 0.8}\n", "hw.yaml");
  ASSERT_TRUE(rates.is_ok()) << rates.status().message();
  EXPECT_EQ(rates->cpu.overlap_comm_rate, 0.05);
  EXPECT_EQ(rates->cpu.overlap_compute_rate, 0.8);
  Result<HardwareTable> above = parse_hardware_table(cpu_entry + "overlap_comm_rate: 1.5}\n", "hw.yaml");
  ASSERT_FALSE(above.is_ok());
  EXPECT_EQ(above.status().message(), "hw.yaml: cpu.overlap_comm_rate: a share of a speed, at most 1, got 1.500000");
  Result<HardwareTable> zero_rate = parse_hardware_table(cpu_entry + "overlap_compute_rate: 0}\n", "hw.yaml");
  ASSERT_FALSE(zero_rate.is_ok());
  EXPECT_EQ(zero_rate.status().message(), "hw.yaml: cpu.overlap_compute_rate: must be > 0, got 0");
  EXPECT_EQ(rates->cpu.arrival_skew, 0);  // none stated: none
  Result<HardwareTable> skew = parse_hardware_table(cpu_entry + "arrival_skew: 0.02}\n", "hw.yaml");
  ASSERT_TRUE(skew.is_ok()) << skew.status().message();
  EXPECT_EQ(skew->cpu.arrival_skew, 0.02);
  Result<HardwareTable> no_skew = parse_hardware_table(cpu_entry + "arrival_skew: 0}\n", "hw.yaml");
  ASSERT_TRUE(no_skew.is_ok()) << no_skew.status().message();
  for (const auto& [bad, message] :
       {std::pair{"-0.1", "hw.yaml: cpu.arrival_skew: must be >= 0, got -0.1"},
        std::pair{"1", "hw.yaml: cpu.arrival_skew: seconds waited per second of compute, below 1, got 1.000000"},
        std::pair{"x", "hw.yaml: cpu.arrival_skew: expected a number, got 'x'"}}) {
    Result<HardwareTable> r = parse_hardware_table(cpu_entry + "arrival_skew: " + bad + "}\n", "hw.yaml");
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().message(), message);
  }
  Result<HardwareTable> zero_share = parse_hardware_table(
      "gpus: []\ninterconnects: [{name: nv, gbytes_per_s: 450, latency_us: 10, all_reduce_share: 0}]\n", "hw.yaml");
  ASSERT_FALSE(zero_share.is_ok());
  EXPECT_EQ(zero_share.status().message(), "hw.yaml: interconnects[0].all_reduce_share: must be > 0, got 0");
  Result<HardwareTable> key = parse_hardware_table(
      "gpus: [{name: x, peak_tflops: 1}]\n" + links, "hw.yaml");
  ASSERT_FALSE(key.is_ok());
  EXPECT_NE(key.status().message().find("hw.yaml: gpus[0]: unknown key 'peak_tflops'"), std::string::npos);
}

}  // namespace
}  // namespace trident
