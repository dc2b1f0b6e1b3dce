// The closed-form memory plan (plan/memory_plan.h) equals what every rank of a real
// multi-rank Trainer holds after a step, for ZeRO stages 0-3 with dp > 1 (sharding,
// shard padding and the groups gathered at once included), with tp and pp where the
// world allows, and under context parallelism (ZeRO over dp x cp, seq_len / cp rows, ring
// attention's state and buffers).
#include <gtest/gtest.h>

#include "parallel/data_parallel.h"
#include "plan/memory_plan.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

std::string memory_data_file() {
  static const std::string path = test::write_test_tokens("memory_plan", 7, 61);
  return path;
}

std::vector<ParallelLayout> layouts_for_world(int n) {
  if (n == 2) return {{2, 1, 1}};
  if (n == 4) return {{2, 1, 2}, {2, 2, 1}};
  if (n == 8) return {{2, 2, 2}};
  return {};
}

// One training step of `arch` at this layout (`extra`: more keys of the parallel section,
// `training_extra` of the training section), then every kind the plan counts against what
// the rank really holds: the DataParallel's memory and every model chunk's activation
// arenas and backward scratch.
void check_rank_memory(const char* arch, const ParallelLayout& l, int zero,
                       const std::string& extra, int n_layers, const Ops& ops,
                       int seq_len = 12, const std::string& model_extra = "",
                       const std::string& training_extra = "") {
  SCOPED_TRACE(test::case_name(arch, l, zero) + extra + training_extra);
  // vocab 200 (padded 256), d_model 40: rows that do not split evenly over dp and
  // tensors that are not multiples of 16 floats.
  const Arch family = std::string(arch) == "gpt2" ? Arch::kGpt2 : Arch::kLlama;
  const std::string yaml =
      testing::tiny_model_yaml(family, {.vocab_size = 200, .seq_len = seq_len,
                                        .n_layers = n_layers, .d_model = 40},
                               model_extra) +
      test::parallel_yaml(l, zero, ", bucket_mb: 1" + extra) +
      "data: {train: " + memory_data_file() + "}\n"
      "training: {global_batch_size: 4, max_steps: 1" + training_extra + "}\n"
      // Nothing is saved, but the directory is locked: one per process, so
      // concurrent test jobs do not collide (checkpoint/dir_lock.h).
      "checkpoint: {dir: " + memory_data_file() + ".ckpt}\n"
      "logging: {metrics: ''}\n";
  auto config = parse_config(yaml, {});
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  const auto trainer =
      testing::make_test_trainer(config.value(), testing::test_trainer_options(&test::world()));
  ASSERT_NE(trainer, nullptr);
  Trainer& t = *trainer;
  ASSERT_TRUE(t.train_step().is_ok());
  if (extra.find("ep: ") != std::string::npos) {
    EXPECT_GT(t.partition().ep_size, 1);
  }
  const DataParallel::Memory real = t.data_parallel_memory();
  const RankCoords& rc = t.coords();
  const RankMemory m =
      estimate_rank_memory(t.config(), t.partition(), rc.dp_rank * l.cp + rc.cp_rank, ops);
  EXPECT_EQ(m.params, static_cast<double>(real.params_peak));
  EXPECT_EQ(m.grads, static_cast<double>(real.grads_peak));
  EXPECT_EQ(m.optimizer, static_cast<double>(real.optimizer));
  EXPECT_EQ(m.comm_buffers, static_cast<double>(real.comm_scratch));
  double activations = 0, scratch = 0;
  for (size_t c = 0; c < t.chunks().size(); ++c) {
    activations += static_cast<double>(t.model(static_cast<int>(c)).activation_bytes());
    scratch += static_cast<double>(t.model(static_cast<int>(c)).scratch_bytes());
  }
  EXPECT_EQ(m.activations, activations);
  EXPECT_EQ(m.activations, t.last_step_stats().activation_bytes);
  EXPECT_EQ(m.scratch, scratch);
  if (zero >= 1) {  // not vacuous: the moments really are sharded over dp
    const ParamLayout layout = describe_params(t.config().model, t.chunks());
    EXPECT_LT(real.optimizer, 2 * layout.total_floats() * sizeof(float));
  }
}

TEST(MemoryPlanMpi, EveryRankHoldsWhatThePlanSays) {
  const std::vector<ParallelLayout> layouts = layouts_for_world(test::world().size());
  if (layouts.empty()) GTEST_SKIP() << "needs 2, 4 or 8 ranks";
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);  // the trainers' backend: same sizes
  for (const ParallelLayout& l : layouts) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (const char* arch : {"gpt2", "llama"}) check_rank_memory(arch, l, zero, "", 3, *ops);
    }
    // bf16 ZeRO-3: no compute shard, the prefetch's staged chunk.
    for (const char* arch : {"gpt2", "llama"}) {
      check_rank_memory(arch, l, 3, "", 3, *ops, 12, "", ", precision: bf16");
    }
  }
}

// Interleaved 1F1B (the chunks share one slot pool, each has its own scratch) and sequence
// parallelism (shards of the activations, a gather workspace in the scratch).
TEST(MemoryPlanMpi, InterleavedAndSequenceParallelRanksHoldWhatThePlanSays) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs 2, 4 or 8 ranks";
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const std::string v2 = ", virtual_stages: 2", sp = ", sequence_parallel: true";
  for (const char* arch : {"gpt2", "llama"}) {
    if (n == 2) {
      check_rank_memory(arch, {1, 1, 2}, 0, v2, 4, *ops);
      check_rank_memory(arch, {1, 2, 1}, 0, sp, 4, *ops);
    }
    if (n == 4) {
      for (int zero = 0; zero <= 3; ++zero) check_rank_memory(arch, {2, 1, 2}, zero, v2, 4, *ops);
      check_rank_memory(arch, {1, 2, 2}, 0, v2 + sp, 4, *ops);
    }
    if (n == 8) check_rank_memory(arch, {2, 2, 2}, 3, v2 + sp, 4, *ops);
  }
}

// Context parallelism: cp 2 with every ZeRO stage (the store over dp x cp), and at 4 ranks
// cp 2 x dp 2 (every stage), cp 4 (16 positions: chunks of 2), cp 2 x tp 2 with sequence
// parallelism and cp 2 x pp 2 interleaved.
TEST(MemoryPlanMpi, ContextParallelRanksHoldWhatThePlanSays) {
  const int n = test::world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  auto layout = [](int dp, int cp, int tp, int pp) {
    ParallelLayout l;
    l.dp = dp, l.cp = cp, l.tp = tp, l.pp = pp;
    return l;
  };
  for (const char* arch : {"gpt2", "llama"}) {
    if (n == 2) {
      for (int zero = 0; zero <= 3; ++zero) {
        check_rank_memory(arch, layout(1, 2, 1, 1), zero, "", 3, *ops);
      }
    }
    if (n == 4) {
      for (int zero = 0; zero <= 3; ++zero) {
        check_rank_memory(arch, layout(2, 2, 1, 1), zero, "", 3, *ops);
      }
      check_rank_memory(arch, layout(1, 4, 1, 1), 1, "", 3, *ops, 16);
      check_rank_memory(arch, layout(1, 2, 2, 1), 0, ", sequence_parallel: true", 3, *ops);
      check_rank_memory(arch, layout(1, 2, 1, 2), 0, ", virtual_stages: 2", 4, *ops);
    }
  }
}

// Expert parallelism: each rank holds E / ep experts per layer in groups of their own,
// reduced and sharded over the dp / ep ranks holding the same experts (a second
// DataParallel), and receives up to ep * N * K expert rows (the activations and scratch).
// Under tp 2 (alone, and with ep 2; with and without sequence parallelism) the router and
// the experts are replicated over tp and their buffers hold every token row.
// A leading dense layer (model.moe_first_dense_layers) holds the dense MLP, no experts.
TEST(MemoryPlanMpi, ExpertParallelRanksHoldWhatThePlanSays) {
  const int n = test::world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const std::string moe = ", moe_experts: 4, moe_top_k: 2, moe_d_ff: 24, moe_shared_experts: 1";
  const std::string dense1 = moe + ", moe_first_dense_layers: 1";
  for (const char* arch : {"gpt2", "llama"}) {
    if (n == 2) {
      for (int zero = 0; zero <= 3; ++zero) {
        check_rank_memory(arch, {2, 1, 1}, zero, ", ep: 2", 2, *ops, 12, moe);
      }
      for (int zero : {0, 3}) check_rank_memory(arch, {1, 2, 1}, zero, "", 2, *ops, 12, moe);
      check_rank_memory(arch, {1, 2, 1}, 0, ", sequence_parallel: true", 2, *ops, 12, moe);
      for (int zero : {0, 2, 3}) check_rank_memory(arch, {2, 1, 1}, zero, ", ep: 2", 3, *ops, 12, dense1);
      check_rank_memory(arch, {2, 1, 1}, 1, "", 3, *ops, 12, dense1);
    }
    if (n == 4) {
      for (int zero : {0, 1, 3}) check_rank_memory(arch, {4, 1, 1}, zero, ", ep: 2", 2, *ops, 12, moe);
      // bf16 ZeRO-3, the experts' store over its 2 ranks too.
      check_rank_memory(arch, {4, 1, 1}, 3, ", ep: 2", 2, *ops, 12, moe, ", precision: bf16");
      check_rank_memory(arch, {4, 1, 1}, 2, ", ep: 4", 2, *ops, 12, moe);
      check_rank_memory(arch, {2, 1, 2}, 1, ", ep: 2", 2, *ops, 12, moe);
      check_rank_memory(arch, {2, 2, 1}, 1, ", ep: 2", 2, *ops, 12, moe);
      check_rank_memory(arch, {2, 2, 1}, 0, ", ep: 2, sequence_parallel: true", 2, *ops, 12,
                        moe);
      check_rank_memory(arch, {2, 1, 2}, 1, ", ep: 2", 3, *ops, 12, dense1);
    }
  }
}

// What a DataParallel allocates over a real dp group (the world) equals the plan, in both
// precisions (bf16: 2-byte compute weights, ZeRO-3's gathered pool without a compute
// shard, f32 masters/gradients/moments), for every rank of tp x pp partitions of the
// model (only the sizes matter: no tp or pp communicator is needed), and every byte
// allocated is in one of DataParallel::Memory's kinds.
TEST(MemoryPlanMpi, DataParallelOverDpAllocatesWhatThePlanSays) {
  const int n = test::world().size();
  int checked = 0;
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (int zero = 0; zero <= 3; ++zero) {
          for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
           for (bool overlap : {false, true}) {
            Config c;
            c.model = testing::tiny_model(arch == "gpt2" ? Arch::kGpt2 : Arch::kLlama,
                                          {.vocab_size = 200, .seq_len = 12, .n_layers = 3,
                                           .d_model = 40});
            c.parallel.dp = n;
            c.parallel.tp = tp;
            c.parallel.pp = pp;
            c.parallel.zero_stage = zero;
            c.parallel.micro_batch_size = 1;
            c.parallel.bucket_mb = 1;
            c.training.global_batch_size = n;
            c.training.precision = precision;
            c.parallel.overlap_grad_reduce = overlap;
            c.parallel.overlap_param_gather = overlap;
            const DType compute = precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
            const std::vector<int> counts = stage_layer_counts(c.model.n_layers, pp, {});
            int layer = 0;
            for (int pr = 0; pr < pp; ++pr) {
              for (int tr = 0; tr < tp; ++tr) {
                SCOPED_TRACE(arch + " dp" + std::to_string(n) + " tp" + std::to_string(tp) +
                             " pp" + std::to_string(pp) + " zero" + std::to_string(zero) +
                             " stage " + std::to_string(pr) + " " + dtype_name(compute) +
                             (overlap ? " overlap" : ""));
                ModelPartition part;
                part.tp_rank = tr;
                part.tp_size = tp;
                part.pp_rank = pr;
                part.pp_size = pp;
                part.layer_begin = layer;
                part.layer_end = layer + counts[static_cast<size_t>(pr)];
                const ParamLayout layout = describe_params(c.model, part);
                const std::unique_ptr<Ops> ops = make_cpu_ops(1);
                DataParallel ddp(layout, *ops, test::device_world(), zero, size_t{1} << 20,
                                 AdamWParams{}, compute, OverlapOptions{.grad_reduce = overlap, .param_gather = overlap});
                const DataParallel::Memory real = ddp.memory();
                const RankMemory m =
                    estimate_rank_memory(c, part, test::world().rank(), *ops);
                EXPECT_EQ(m.params, static_cast<double>(real.params));
                EXPECT_EQ(m.grads, static_cast<double>(real.grads));
                EXPECT_EQ(m.optimizer, static_cast<double>(real.optimizer));
                EXPECT_EQ(m.comm_buffers, static_cast<double>(real.comm_scratch));
                if (zero == 3) {
                  EXPECT_EQ(m.master, static_cast<double>(real.master));
                }
                EXPECT_EQ(ops->allocation_counts().live_bytes,
                          real.params + real.master + real.grads + real.optimizer +
                              real.comm_scratch + sizeof(double));
                ++checked;
              }
              layer += counts[static_cast<size_t>(pr)];
            }
           }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * (1 + 2 + 2 + 4) * 4 * 2 * 2);
}

}  // namespace
}  // namespace trident
