// A model family registered from this test (gpt2's architecture row plus one extra
// tensor and one extra buffer per layer in its block builder): the model's allocations,
// the memory plan, the traffic model and the planner follow its description with no
// other edit, by exactly the bytes and FLOPs of the extra rows.
#include <gtest/gtest.h>

#include <memory>

#include "model/model_description.h"
#include "model/transformer.h"
#include "config/config.h"
#include "plan/memory_plan.h"
#include "plan/plan.h"
#include "plan/traffic_model.h"

namespace trident {
namespace {

// gpt2's block and, per layer, a column-parallel (C, C) weight reading the MLP input
// and a (N, C) compute buffer, neither read by the Transformer's block.
void extra_block(const TransformerConfig& c, BlockDescription* block) {
  standard_block(c, block);
  block->tensors.push_back({"extra.weight", ParamRole::kNone, Dim::kC, Dim::kC,
                            ColumnParallelLinear::kWeightSplitDim, BufferRole::kLn2});
  block->buffers.push_back({"extra", BufferRole::kNone, Dim::kC, BufferKind::kCompute, false});
}

Arch extra_family() {
  static const Arch arch = [] {
    Architecture row = architecture(Arch::kGpt2);
    row.name = "gpt2_extra_test";
    row.block = extra_block;
    return register_architecture(row);
  }();
  return arch;
}

constexpr int kC = 64, kT = 16, kLayers = 3, kMicro = 2;

Config make_config(Arch arch, int tp, int dp, Recompute recompute) {
  Config c;
  c.model.arch = arch;
  c.model.vocab_size = 200;
  c.model.seq_len = kT;
  c.model.n_layers = kLayers;
  c.model.n_heads = 4;
  c.model.d_model = kC;
  c.model.finalize();
  c.parallel.tp = tp;
  c.parallel.dp = dp;
  c.parallel.sequence_parallel = tp > 1;
  c.parallel.micro_batch_size = kMicro;
  c.training.global_batch_size = kMicro * 2 * dp;  // 2 micro-batches
  c.training.recompute = recompute;
  c.data.train = "unused";
  return c;
}

ModelPartition partition(const Config& c) {
  ModelPartition part;
  part.tp_size = c.parallel.tp;
  part.sequence_parallel = c.parallel.sequence_parallel;
  return part;
}

size_t state_bytes(int B, int T, int NH, int NKV, int HD, DType dtype) {
  (void)NKV;
  return static_cast<size_t>(B) * NH * T * T * HD * dtype_size(dtype) / 7;  // any size
}

TEST(ModelFamily, TheRegisteredFamilyIsARowOfTheTable) {
  const Arch arch = extra_family();
  EXPECT_EQ(find_architecture("gpt2_extra_test"), arch);
  EXPECT_STREQ(arch_name(arch), "gpt2_extra_test");
  EXPECT_TRUE(validate_config(make_config(arch, 2, 2, Recompute::kNone)).is_ok());
  // model.arch accepts the registered name, and the config writes it back.
  Result<Config> parsed = parse_config(
      "data:\n  train: data/train_*.bin\nmodel: {arch: gpt2_extra_test}\n", {}, "cfg.yaml");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  EXPECT_EQ(parsed.value().model.arch, arch);
  EXPECT_NE(config_to_yaml(parsed.value()).find("gpt2_extra_test"), std::string::npos);
  TransformerConfig base = make_config(Arch::kGpt2, 1, 1, Recompute::kNone).model;
  TransformerConfig extra = make_config(arch, 1, 1, Recompute::kNone).model;
  EXPECT_EQ(extra.num_parameters() - base.num_parameters(), int64_t{kLayers} * kC * kC);
  EXPECT_DOUBLE_EQ(extra.flops_per_token() - base.flops_per_token(), 6.0 * kLayers * kC * kC);
}

TEST(ModelFamily, TheModelAllocatesTheExtraRowsAndComputesAsBefore) {
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const Config base_config = make_config(Arch::kGpt2, 1, 1, Recompute::kNone);
  const Config extra_config = make_config(extra_family(), 1, 1, Recompute::kNone);
  Transformer base(base_config.model, *ops, kMicro);
  Transformer extra(extra_config.model, *ops, kMicro);
  // Each layer's extra (C, C) tensor (a multiple of 16 floats) and (N, C) f32 buffer.
  EXPECT_EQ(extra.num_param_floats() - base.num_param_floats(), size_t{kLayers} * kC * kC);
  EXPECT_EQ(extra.activation_bytes() - base.activation_bytes(),
            size_t{kLayers} * kMicro * kT * kC * sizeof(float));
  EXPECT_NE(extra.layout().find("layers.2.extra.weight"), nullptr);
  // The block does not read the extra rows: the same weights give the same loss.
  base.init_weights(7);
  extra.init_weights(7);
  std::vector<int32_t> tokens(kMicro * kT), targets(kMicro * kT);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i * 7 % 200);
    targets[i] = static_cast<int32_t>(i * 11 % 200);
  }
  EXPECT_EQ(base.forward(tokens.data(), targets.data(), kMicro, kT),
            extra.forward(tokens.data(), targets.data(), kMicro, kT));
}

TEST(ModelFamily, MemoryPlanFollowsTheDescription) {
  for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    SCOPED_TRACE(recompute_name(recompute));
    const int tp = 2, dp = 2;
    const Config base = make_config(Arch::kGpt2, tp, dp, recompute);
    const Config extra = make_config(extra_family(), tp, dp, recompute);
    const RankMemory a = estimate_rank_memory(base, partition(base), 0, state_bytes);
    const RankMemory b = estimate_rank_memory(extra, partition(extra), 0, state_bytes);
    // Per layer the local (C/tp, C) tensor: C*C/tp floats (16-float aligned already).
    const double floats = double(kLayers) * kC * kC / tp;
    EXPECT_EQ(b.params - a.params, floats * 4);
    EXPECT_EQ(b.grads - a.grads, floats * 4);
    EXPECT_EQ(b.optimizer - a.optimizer, 2 * floats * 4);
    EXPECT_EQ(b.checkpoint - a.checkpoint, 3 * floats * 4);  // dp rank 0 saves ZeRO-0 state
    EXPECT_EQ(b.tables - a.tables, 512.0 * kLayers);         // one more tensor per layer
    // The (N, C) buffer (not sequence-sharded): per slot and layer, or once in the
    // shared set under full recomputation.
    const double buffer = double(kMicro) * kT * kC * 4;
    const int slots = pipeline_slots(base.parallel.pipeline_schedule, 1, 0,
                                     base.grad_accum_steps());
    if (recompute == Recompute::kNone) {
      EXPECT_EQ(b.activations - a.activations, slots * kLayers * buffer);
      EXPECT_EQ(b.scratch, a.scratch);
    } else {
      EXPECT_EQ(b.activations, a.activations);
      EXPECT_EQ(b.scratch - a.scratch, buffer);
    }
    EXPECT_EQ(b.total - a.total, b.params - a.params + b.grads - a.grads + b.optimizer -
                                     a.optimizer + b.checkpoint - a.checkpoint +
                                     b.activations - a.activations + b.other - a.other);
  }
}

TEST(ModelFamily, TrafficModelFollowsTheDescription) {
  const int tp = 2, dp = 2;
  const Config base = make_config(Arch::kGpt2, tp, dp, Recompute::kNone);
  const Config extra = make_config(extra_family(), tp, dp, Recompute::kNone);
  const RankTraffic a =
      analytic_traffic(base, partition(base), describe_params(base.model, partition(base)));
  const RankTraffic b =
      analytic_traffic(extra, partition(extra), describe_params(extra.model, partition(extra)));
  // ZeRO 0 all-reduces every local gradient once (f32); the extra weight reads the MLP
  // input, which is gathered already: the tp collectives stay.
  EXPECT_EQ(b.dp.all_reduce - a.dp.all_reduce, double(kLayers) * kC * kC / tp * 4);
  EXPECT_EQ(b.tp.all_gather, a.tp.all_gather);
  EXPECT_EQ(b.tp.reduce_scatter, a.tp.reduce_scatter);
  EXPECT_EQ(b.tp.all_reduce, a.tp.all_reduce);
}

TEST(ModelFamily, PlannerFollowsTheDescription) {
  const int tp = 2, dp = 1;
  for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    SCOPED_TRACE(recompute_name(recompute));
    const Config base = make_config(Arch::kGpt2, tp, dp, recompute);
    const Config extra = make_config(extra_family(), tp, dp, recompute);
    // The FLOPs: one more local (C/tp, C) GEMM over all N rows per layer.
    const double N = double(kMicro) * kT;
    const double gemm = 2 * N * kC * kC / tp;
    const StageFlops fa = describe_flops(base.model, partition(base), kMicro, DType::kF32, true);
    const StageFlops fb = describe_flops(extra.model, partition(extra), kMicro, DType::kF32, true);
    EXPECT_EQ(fb.layer.gemm_flops - fa.layer.gemm_flops, gemm);
    EXPECT_EQ(fb.layer.attention_flops, fa.layer.attention_flops);
    EXPECT_EQ(fb.head.gemm_flops, fa.head.gemm_flops);
    EXPECT_EQ(fb.forward().gemm_flops - fa.forward().gemm_flops, kLayers * gemm);

    PlanOptions o;
    o.devices = tp * dp;
    o.hardware = cpu_hardware(1e12, 1e12);
    o.hardware.memory_bandwidth = 1e11;
    o.hardware.intra_node = o.hardware.inter_node = LinkSpec{"link", 1e10, 1e-6, 1.0};
    o.attention_state_bytes = state_bytes;
    const PlanResult pa = evaluate_layout(base, o);
    const PlanResult pb = evaluate_layout(extra, o);
    EXPECT_EQ(pb.memory.params - pa.memory.params, double(kLayers) * kC * kC / tp * 4);
    // Compute: forward once, backward twice, and full recomputation reruns the layers'.
    const double passes = 1 + kBackwardPerForward + (recompute == Recompute::kFull ? 1 : 0);
    const double seconds = pa.micro_batches * passes * kLayers * gemm / (1e12 * kCpuEfficiency);
    const double added = pb.compute_s + pb.recompute_s - pa.compute_s - pa.recompute_s;
    EXPECT_NEAR(added, seconds, 1e-12 * pb.compute_s);
    EXPECT_GT(added, 0.0);
  }
}

}  // namespace
}  // namespace trident
