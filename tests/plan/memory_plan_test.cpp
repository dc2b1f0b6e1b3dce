// The closed-form memory plan (plan/memory_plan.h) against the real thing: the
// parameter tables and shard plans it mirrors, the model's activation arenas, the
// pipeline's slot count, and the bytes a real single-process Trainer holds for ZeRO
// stages 0-3; and the fit check with an injected memory limit.
#include "plan/memory_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/token_file.h"
#include "kernels/forwarding_ops.h"
#include "parallel/pipeline.h"
#include "parallel/reduce_scatter_queue.h"
#include "parallel/sharded_param_store.h"
#include "tests/common/captured_log.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

Config make_config(const std::string& arch, int tie, int tp, int pp, int dp, int zero,
                   int bucket_mb = 25) {
  Config c;
  // Odd sizes on purpose: rows that do not divide by dp (shard padding) and tensors that
  // are not multiples of 16 floats (alignment gaps) must be counted like the real tables.
  // vocabulary 200 (padded 256); d_model 40: head_dim 10 (even, for RoPE).
  c.model = testing::tiny_model(arch == "gpt2" ? Arch::kGpt2 : Arch::kLlama,
                                {.vocab_size = 200, .seq_len = 12, .n_layers = 5, .d_model = 40,
                                 .d_ff = arch == "gpt2" ? 0 : 74});
  c.model.tie_embeddings = tie;
  c.model.finalize();
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.parallel.dp = dp;
  c.parallel.zero_stage = zero;
  c.parallel.micro_batch_size = 3;
  c.parallel.bucket_mb = bucket_mb;
  c.training.global_batch_size = 3 * 4 * dp;  // 4 micro-batches
  c.data.train = "unused";
  return c;
}

// The backend the estimates size the attention state with (the trainers below run on
// the CPU too).
Ops* cpu_ops() {
  static const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  return ops.get();
}

ModelPartition partition(const Config& c, int tp_rank, int pp_rank) {
  ModelPartition part;
  part.tp_rank = tp_rank;
  part.tp_size = c.parallel.tp;
  part.pp_rank = pp_rank;
  part.pp_size = c.parallel.pp;
  const std::vector<int> counts = stage_layer_counts(c.model.n_layers, c.parallel.pp, {});
  for (int s = 0; s < pp_rank; ++s) part.layer_begin += counts[static_cast<size_t>(s)];
  part.layer_end = part.layer_begin + counts[static_cast<size_t>(pp_rank)];
  return part;
}

TEST(MemoryPlan, PipelineSlotsEqualTheExecutorsCount) {
  for (PipeSchedule s : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB}) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int stage = 0; stage < pp; ++stage) {
        for (int m = 1; m <= 9; ++m) {
          EXPECT_EQ(pipeline_slots(s, pp, stage, m),
                    PipelineExecutor::required_slots(s, pp, stage, m))
              << pipe_schedule_name(s) << " pp " << pp << " stage " << stage << " m " << m;
        }
      }
    }
  }
}

// params / grads / optimizer / comm buffers from the real parameter table and shard
// plans (what DataParallel allocates from), for every rank of many layouts.
TEST(MemoryPlan, ModelStateEqualsTheParameterTablesAndShardPlans) {
  int checked = 0;
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int tie : {0, 1}) {
      for (int tp : {1, 2}) {
        for (int pp : {1, 2, 3}) {
          for (int dp : {1, 2, 3}) {
            for (int zero = 0; zero <= 3; ++zero) {
              // bucket_mb 1 > one layer: 1 bucket per group; the tiny default splits wte.
              const Config c = make_config(arch, tie, tp, pp, dp, zero, 1);
              for (int pr = 0; pr < pp; ++pr) {
                for (int tr = 0; tr < tp; ++tr) {
                  SCOPED_TRACE(arch + " tie " + std::to_string(tie) + " tp " + std::to_string(tp) +
                               " pp " + std::to_string(pp) + " dp " + std::to_string(dp) +
                               " zero " + std::to_string(zero) + " stage " + std::to_string(pr));
                  const ModelPartition part = partition(c, tr, pr);
                  const ParamLayout layout = describe_params(c.model, part);
                  const double F = sizeof(float);
                  const double total = static_cast<double>(layout.total_floats()) * F;
                  const ShardPlan groups(
                      layout, dp,
                      [&] {
                        std::vector<size_t> base;
                        for (const ParamGroup& g : layout.groups) base.push_back(g.offset);
                        return base;
                      }(),
                      static_cast<size_t>(-1));
                  const double shard = static_cast<double>(groups.shard_floats()) * F;
                  double held = 0;
                  for (const ParamGroup& g : layout.groups)
                    held = std::max(held, double(g.num_floats));
                  if (c.model.tied() && pp == 1) {
                    held = std::max(held, double(layout.groups.front().num_floats +
                                                 layout.groups.back().num_floats));
                  }
                  // The stores' own rule (from the layout alone) agrees.
                  EXPECT_EQ(held, static_cast<double>(max_held_group_floats(layout)));
                  held *= F;
                  const RankMemory m = estimate_rank_memory(c, part, 0, *cpu_ops());
                  EXPECT_EQ(m.params, zero == 3 ? shard + held : total);
                  // Stage 1: the full gradients and the reduced shard.
                  EXPECT_EQ(m.grads, zero >= 2 ? shard + held : total + (zero == 1 ? shard : 0));
                  EXPECT_EQ(m.optimizer, 2 * (zero == 0 ? total : shard));
                  double comm = 0;
                  const ShardPlan buckets(layout, dp,
                                          std::vector<size_t>(layout.groups.size(), 0),
                                          (size_t{1} << 20) / sizeof(float));
                  if (zero == 1 || zero == 2) {
                    comm += static_cast<double>((dp + 1) * buckets.max_chunk_floats()) * F;
                  }
                  if (zero >= 2) {  // the store's collective scratch
                    comm += static_cast<double>(
                        collective_scratch_bytes(dp, groups.max_chunk_floats()));
                  }
                  // overlap_grad_reduce (the default): the queue's two slots, of buckets
                  // (stage 1) or whole groups (stages 2-3).
                  EXPECT_TRUE(c.parallel.overlap_grad_reduce);
                  if (zero >= 1 && dp > 1) {  // one dp rank overlaps nothing
                    comm += static_cast<double>(ReduceScatterQueue::scratch_bytes(
                        dp, (zero == 1 ? buckets : groups).max_chunk_floats(), 2));
                  }
                  // overlap_param_gather (the default): ZeRO-3's prefetch buffer, one
                  // packed group of (f32) compute weights.
                  EXPECT_TRUE(c.parallel.overlap_param_gather);
                  if (zero == 3 && dp > 1) {
                    comm += static_cast<double>(dp * groups.max_chunk_floats()) * F;
                  }
                  EXPECT_EQ(m.comm_buffers, comm);
                  EXPECT_GT(m.total, m.params + m.grads + m.optimizer);
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 * (1 + 2) * (1 + 2 + 3) * 3 * 4);  // every tp x pp rank
}

// A bucket smaller than wte splits the embedding group into several chunks.
TEST(MemoryPlan, CommBuffersFollowSmallBuckets) {
  Config c = make_config("llama", 0, 1, 1, 2, 1);
  c.parallel.bucket_mb = 1;
  c.model.vocab_size = 16384;
  c.model.d_model = 64;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 4;
  c.model.d_ff = 0;
  c.model.padded_vocab = 0;
  c.model.finalize();  // wte 16384 x 64 floats = 4 MiB: 4+ buckets of 1 MiB
  const ModelPartition part = partition(c, 0, 0);
  const ParamLayout layout = describe_params(c.model, part);
  const ShardPlan buckets(layout, 2, std::vector<size_t>(layout.groups.size(), 0),
                          (size_t{1} << 20) / sizeof(float));
  // The stage-1 pack and segment (dp + 1 = 3 chunks), and the overlap queue's two slots
  // of as many.
  EXPECT_EQ(estimate_rank_memory(c, part, 0, *cpu_ops()).comm_buffers,
            static_cast<double>((3 + 2 * 3) * buckets.max_chunk_floats() * sizeof(float)));
  c.parallel.overlap_grad_reduce = false;
  EXPECT_EQ(estimate_rank_memory(c, part, 0, *cpu_ops()).comm_buffers,
            static_cast<double>(3 * buckets.max_chunk_floats() * sizeof(float)));
}

// What a DataParallel really allocates (Ops::allocation_counts: every byte is in one
// of the Memory kinds) equals the plan, for every rank of tp x pp partitions, every ZeRO
// stage and both precisions (dp = 1 here; tests/plan/memory_plan_mpi_test.cpp runs dp > 1).
// bf16 stores 2-byte compute weights (ZeRO-3: the gathered pool alone, no compute shard)
// and keeps f32 gradients.
TEST(MemoryPlan, DataParallelAllocatesWhatThePlanSays) {
  SelfCommunicator self("dp", MemSpace::kDevice);
  int checked = 0;
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int tie : {0, 1}) {
      for (int tp : {1, 2}) {
        for (int pp : {1, 2}) {
          for (int zero = 0; zero <= 3; ++zero) {
            for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
              Config c = make_config(arch, tie, tp, pp, 1, zero, 1);
              c.training.precision = precision;
              const DType compute = precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
              for (int pr = 0; pr < pp; ++pr) {
                for (int tr = 0; tr < tp; ++tr) {
                  SCOPED_TRACE(arch + " tie " + std::to_string(tie) + " tp " + std::to_string(tp) +
                               " pp " + std::to_string(pp) + " zero " + std::to_string(zero) +
                               " stage " + std::to_string(pr) + " " + dtype_name(compute));
                  const ModelPartition part = partition(c, tr, pr);
                  const ParamLayout layout = describe_params(c.model, part);
                  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
                  DataParallel ddp(
                      layout, *ops, self, zero, size_t{1} << 20, AdamWParams{}, compute,
                      OverlapOptions{.grad_reduce = c.parallel.overlap_grad_reduce,
                                     .param_gather = c.parallel.overlap_param_gather});
                  const DataParallel::Memory real = ddp.memory();
                  const RankMemory m = estimate_rank_memory(c, part, 0, *cpu_ops());
                  EXPECT_EQ(m.params, static_cast<double>(real.params));
                  EXPECT_EQ(m.grads, static_cast<double>(real.grads));
                  EXPECT_EQ(m.optimizer, static_cast<double>(real.optimizer));
                  EXPECT_EQ(m.comm_buffers, static_cast<double>(real.comm_scratch));
                  if (zero == 3) {  // the store keeps the masters (stages 0-2: DataParallel)
                    EXPECT_EQ(m.master, static_cast<double>(real.master));
                  }
                  if (compute == DType::kBF16) {
                    EXPECT_EQ(ddp.store().compute_dtype(), DType::kBF16);
                    if (zero == 3) {  // the bf16 pool is all the compute weights held
                      EXPECT_EQ(real.params, ddp.sharded()->param_pool_bytes());
                      EXPECT_EQ(real.params, max_held_group_floats(layout) * 2);
                    } else {
                      EXPECT_EQ(ddp.store().params(0).dtype(), DType::kBF16);
                    }
                  }
                  // Truthful: the kinds add up to every byte allocated (plus the norm's
                  // 8-byte accumulator).
                  EXPECT_EQ(ops->allocation_counts().live_bytes,
                            real.params + real.master + real.grads + real.optimizer +
                                real.comm_scratch + sizeof(double));
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 * (1 + 2) * (1 + 2) * 4 * 2);
}

// The model's own activation arenas: Transformer::activation_bytes() and scratch_bytes()
// for each stage of tp / pp partitions, with and without sequence parallelism, every
// recompute mode, fp32 and bf16 (a null tp communicator is allowed: only the sizes matter
// here).
TEST(MemoryPlan, ActivationsEqualTheModelsArenas) {
  auto ops = make_cpu_ops(1);
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (PipeSchedule s : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB}) {
          Config c = make_config(arch, -1, tp, pp, 1, 0);
          c.model.tie_embeddings = arch == "gpt2" ? 1 : 0;
          c.parallel.pipeline_schedule = s;
          for (int pr = 0; pr < pp; ++pr) {
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;
              SCOPED_TRACE(arch + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) +
                           " stage " + std::to_string(pr) + " " + pipe_schedule_name(s) +
                           (sp ? " sequence parallel" : ""));
              c.parallel.sequence_parallel = sp;
              ModelPartition part = partition(c, tp - 1, pr);
              part.sequence_parallel = sp;
              const int slots = pipeline_slots(s, pp, pr, c.grad_accum_steps());
              for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                SCOPED_TRACE(std::string("recompute ") + recompute_name(r));
                c.training.recompute = r;
                for (DType dtype : {DType::kF32, DType::kBF16}) {
                  c.training.precision =
                      dtype == DType::kBF16 ? Precision::kBf16 : Precision::kFp32;
                  Transformer model(c.model, *ops, part, nullptr, nullptr,
                                    c.parallel.micro_batch_size, slots, dtype, r);
                  const RankMemory m = estimate_rank_memory(c, part, 0, *cpu_ops());
                  EXPECT_EQ(m.activations, static_cast<double>(model.activation_bytes()))
                      << dtype_name(dtype);
                  EXPECT_EQ(m.scratch, static_cast<double>(model.scratch_bytes()))
                      << dtype_name(dtype);
                }
              }
            }
          }
        }
      }
    }
  }
}

class TrainerMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint32_t> tokens(8000);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<uint32_t>((i * 7 + i / 5) % 200);
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), tokens, 1).is_ok());
  }
  testing::ScratchDir dir_;
};

// What a real Trainer holds after a step (DataParallel::memory() peaks, the model's
// activations) equals the estimate exactly, for every ZeRO stage (dp = 1: the stores
// still gather, hold and reduce-scatter group buffers).
TEST_F(TrainerMemory, RealAllocationsEqualTheEstimate) {
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE(arch + " zero " + std::to_string(zero));
      Config c = make_config(arch, -1, 1, 1, 1, zero, 1);
      c.model.tie_embeddings = arch == "gpt2" ? 1 : 0;
      c.model.finalize();
      c.data.train = dir_.file("train.bin");
      c.training.max_steps = 1;
      c.checkpoint.dir = dir_.file("ckpt");
      c.logging.metrics = "";
      ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
      const auto trainer = testing::make_test_trainer(c);
      ASSERT_NE(trainer, nullptr);
      ASSERT_TRUE(trainer->train_step().is_ok());
      const DataParallel::Memory real = trainer->data_parallel().memory();
      const RankMemory m = estimate_rank_memory(c, trainer->partition(), 0, *cpu_ops());
      EXPECT_EQ(m.params, static_cast<double>(real.params_peak));
      EXPECT_EQ(m.grads, static_cast<double>(real.grads_peak));
      EXPECT_EQ(m.optimizer, static_cast<double>(real.optimizer));
      EXPECT_EQ(m.comm_buffers, static_cast<double>(real.comm_scratch));
      EXPECT_EQ(m.activations, static_cast<double>(trainer->model().activation_bytes()));
      // Not vacuous: ZeRO-2/3 held group buffers from their pools.
      DataParallel& ddp = trainer->data_parallel();
      if (zero == 2) {
        EXPECT_GT(ddp.grad_sharded()->peak_held_grad_bytes(), 0u);
      }
      if (zero == 3) {
        EXPECT_GT(ddp.sharded()->peak_held_bytes(), 0u);
      }
    }
  }
}

RankMemoryReport report(uint64_t host, double available, double params) {
  RankMemoryReport r;
  r.host = host;
  r.available = available;
  r.need.params = r.need.grads = params;
  r.need.optimizer = 2 * params;
  r.need.activations = 1 << 20;
  r.need.total = 4 * params + (1 << 20);
  return r;
}

TEST(MemoryCheck, FitsWhenEveryMachineHasRoom) {
  const Config c = make_config("gpt2", -1, 1, 1, 2, 0);
  const double gib = 1024.0 * 1024 * 1024;
  const std::vector<RankMemoryReport> two_hosts = {report(1, 10 * gib, 2 * gib),
                                                   report(2, 10 * gib, 2 * gib)};
  EXPECT_TRUE(check_memory_fits(c, two_hosts, "test").is_ok());
}

TEST(MemoryCheck, NamesTheFiguresAndTheBiggestConsumer) {
  const Config c = make_config("gpt2", -1, 1, 1, 1, 0);
  const double gib = 1024.0 * 1024 * 1024;
  const std::vector<RankMemoryReport> one = {report(1, 8 * gib, 3 * gib)};
  const Status st = check_memory_fits(c, one, "physical memory");
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("model needs 12.0 GiB per rank (parameters 3.0 GiB, gradients "
                              "3.0 GiB, optimizer 6.0 GiB, activations 1.0 MiB"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("biggest: optimizer state"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("this machine has 8.0 GiB (physical memory) for 1 rank"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("model.n_layers=5"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("parallel.zero_stage (now 0"), std::string::npos) << st.message();
}

// Ranks on one machine add up; ranks on another machine do not count against it.
TEST(MemoryCheck, SumsTheRanksOfOneMachine) {
  const Config c = make_config("gpt2", -1, 1, 1, 4, 0);
  const double gib = 1024.0 * 1024 * 1024;
  // 3 GiB per rank: two hosts with two ranks each fit in 7 GiB, one host with four does not.
  const std::vector<RankMemoryReport> spread = {
      report(1, 7 * gib, 0.75 * gib), report(1, 7 * gib, 0.75 * gib),
      report(2, 7 * gib, 0.75 * gib), report(2, 7 * gib, 0.75 * gib)};
  EXPECT_TRUE(check_memory_fits(c, spread, "test").is_ok());
  std::vector<RankMemoryReport> packed = spread;
  for (auto& r : packed) r.host = 1;
  const Status st = check_memory_fits(c, packed, "cgroup memory limit");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("4 ranks on one machine need 12.0 GiB together"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("7.0 GiB (cgroup memory limit) for 4 ranks"), std::string::npos)
      << st.message();
}

TEST(MemoryCheck, TheLimitCanBeInjected) {
  {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", "123456789");
    auto host = available_host_memory();
    ASSERT_TRUE(host.is_ok());
    EXPECT_EQ(host->bytes, 123456789.0);
    EXPECT_EQ(host->source, "TRIDENT_MEMORY_LIMIT_BYTES");
  }
  for (const char* bad : {"12GB", "-5", "0"}) {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", bad);
    auto host = available_host_memory();
    ASSERT_FALSE(host.is_ok()) << bad;
    EXPECT_EQ(host.status().exit_code(), 2);
    EXPECT_NE(host.status().message().find(std::string("TRIDENT_MEMORY_LIMIT_BYTES: expected a "
                                                       "positive number of bytes, got '") +
                                           bad),
              std::string::npos);
  }
  unsetenv("TRIDENT_MEMORY_LIMIT_BYTES");
  auto host = available_host_memory();
  ASSERT_TRUE(host.is_ok());
  EXPECT_GT(host->bytes, 64.0 * 1024 * 1024);  // some machine memory was found
}

// The collective entry point on one process decides by the injected limit.
TEST(MemoryCheck, PlanAndCheckUsesTheLimit) {
  const Config c = make_config("llama", -1, 1, 1, 1, 0);
  const ModelPartition part = partition(c, 0, 0);
  const double need = estimate_rank_memory(c, part, 0, *cpu_ops()).total;
  SelfCommunicator world;
  {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", std::to_string(static_cast<long long>(need) + 1));
    EXPECT_TRUE(plan_and_check_memory(c, part, 0, *cpu_ops(), world, true).is_ok());
  }
  {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", std::to_string(static_cast<long long>(need) - 1));
    const Status st = plan_and_check_memory(c, part, 0, *cpu_ops(), world, true);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.exit_code(), 2);
    EXPECT_NE(st.message().find("(TRIDENT_MEMORY_LIMIT_BYTES) for 1 rank"), std::string::npos)
        << st.message();
  }
}

// A CPU backend that reports a device of its own (as the CUDA Ops does with
// cudaMemGetInfo): `free` of `total` bytes, `pinned` bytes of pinned staging, and
// `workspace` bytes of attention scratch. Host test: nothing runs on a device.
class FakeDeviceOps : public testing::ForwardingOps {
 public:
  FakeDeviceOps(Ops& inner, size_t free, size_t total, size_t workspace = 0,
                size_t pinned = size_t{64} << 20)
      : ForwardingOps(inner), free_(free), total_(total), workspace_(workspace), pinned_(pinned) {}
  std::optional<DeviceMemory> device_memory() const override {
    DeviceMemory m;
    m.free_bytes = free_;
    m.total_bytes = total_;
    m.pinned_host_bytes = pinned_;
    m.source = "fake device";
    return m;
  }
  size_t attention_workspace_bytes(int, int, int, int, int, DType) const override {
    return workspace_;
  }

 private:
  size_t free_, total_, workspace_, pinned_;
};

using testing::CapturedLog;

// The backend's own buffers enter the plan: its attention workspace on the device, its
// pinned staging on the host; the device and host parts add up to the total.
TEST(MemoryCheck, CountsTheBackendsWorkspaceAndPinnedStaging) {
  const Config c = make_config("llama", -1, 1, 1, 1, 0);
  const ModelPartition part = partition(c, 0, 0);
  const RankMemory cpu = estimate_rank_memory(c, part, 0, *cpu_ops());
  FakeDeviceOps device(*cpu_ops(), size_t{1} << 30, size_t{2} << 30, 12345);
  const RankMemory m = estimate_rank_memory(c, part, 0, device);
  EXPECT_EQ(cpu.workspace, 0);
  EXPECT_EQ(cpu.pinned, 0);
  EXPECT_EQ(m.workspace, 12345);
  EXPECT_EQ(m.pinned, 64.0 * 1024 * 1024);
  EXPECT_EQ(m.total, cpu.total + 12345 + 64.0 * 1024 * 1024);
  EXPECT_EQ(m.device_resident() + m.host_resident(), m.total);
  EXPECT_EQ(m.device_resident(), cpu.params + cpu.master + cpu.grads + cpu.optimizer +
                                     cpu.activations + cpu.scratch + cpu.comm_buffers + 12345);
  EXPECT_EQ(m.host_resident(), cpu.checkpoint + cpu.transient + cpu.tables + 64.0 * 1024 * 1024);
}

// With a device, the device parts are held against the device and only the host parts
// against the machine: a host limit below the total but above the host parts passes (it
// fails for the CPU backend, where everything is host memory), and a device too small
// fails naming the device figures; the start-up line says which part is which.
TEST(MemoryCheck, DevicePartsAgainstTheDeviceHostPartsAgainstTheHost) {
  const Config c = make_config("llama", -1, 1, 1, 1, 0);
  const ModelPartition part = partition(c, 0, 0);
  SelfCommunicator world;
  const size_t gib = size_t{1} << 30;
  // No pinned staging here, so that the CPU backend's total exceeds the limit below.
  FakeDeviceOps big(*cpu_ops(), 8 * gib, 16 * gib, 0, 0);
  const RankMemory m = estimate_rank_memory(c, part, 0, big);
  const long long limit = static_cast<long long>(m.host_resident()) + 1;
  ASSERT_LT(static_cast<double>(limit), m.total);
  {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", std::to_string(limit));
    CapturedLog log;
    const Status fits = plan_and_check_memory(c, part, 0, big, world, false);
    EXPECT_TRUE(fits.is_ok()) << fits.message();
    const std::string line = log.text();
    EXPECT_NE(line.find("memory plan: device "), std::string::npos) << line;
    EXPECT_NE(line.find("this rank's device has 8.0 GiB free of 16.0 GiB (fake device)"),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("; host "), std::string::npos) << line;
    EXPECT_NE(line.find("pinned staging 0 B"), std::string::npos) << line;
    EXPECT_LT(line.find("activations"), line.find("; host ")) << line;  // a device part
    EXPECT_GT(line.find("checkpoint snapshot"), line.find("; host ")) << line;  // a host part
    const Status cpu = plan_and_check_memory(c, part, 0, *cpu_ops(), world, true);
    EXPECT_FALSE(cpu.is_ok());  // on the CPU the same limit holds everything
  }
  {
    ScopedEnv env("TRIDENT_MEMORY_LIMIT_BYTES", std::to_string(limit - 2));
    const Status host = plan_and_check_memory(c, part, 0, big, world, true);
    ASSERT_FALSE(host.is_ok());
    EXPECT_EQ(host.exit_code(), 2);
    EXPECT_NE(host.message().find("of host memory per rank (checkpoint snapshot"),
              std::string::npos)
        << host.message();
  }
  FakeDeviceOps small(*cpu_ops(), static_cast<size_t>(m.device_resident()) - 1, 16 * gib, 0, 0);
  const Status device = plan_and_check_memory(c, part, 0, small, world, true);
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.exit_code(), 2);
  EXPECT_NE(device.message().find("of device memory per rank (parameters"), std::string::npos)
      << device.message();
  EXPECT_NE(device.message().find("free of 16.0 GiB (fake device)"), std::string::npos)
      << device.message();
}

// check_memory_fits alone: ranks with a device add only their host parts to their
// machine; each device is checked on its own.
TEST(MemoryCheck, RanksWithDevicesShareOnlyHostMemory) {
  const Config c = make_config("gpt2", -1, 1, 1, 4, 0);
  const double gib = 1024.0 * 1024 * 1024;
  std::vector<RankMemoryReport> four;
  for (int i = 0; i < 4; ++i) {
    RankMemoryReport r = report(1, 7 * gib, 0.75 * gib);  // 3 GiB each, all device parts
    r.need.checkpoint = 1 * gib;  // a host part
    r.need.total += 1 * gib;
    four.push_back(r);
  }
  // Without devices: 4 x 4 GiB on one 7 GiB machine does not fit.
  EXPECT_FALSE(check_memory_fits(c, four, "test").is_ok());
  // With a 4 GiB device each: 4 x 1 GiB of host parts fit, every device fits its 3 GiB.
  for (auto& r : four) r.device_free = r.device_total = 4 * gib;
  EXPECT_TRUE(check_memory_fits(c, four, "test").is_ok());
  four[2].device_free = 2 * gib;
  const Status st = check_memory_fits(c, four, "test", "cudaMemGetInfo");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("model needs 3.0 GiB of device memory per rank"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("the device has 2.0 GiB free of 4.0 GiB (cudaMemGetInfo)"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("biggest: optimizer state"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trident
