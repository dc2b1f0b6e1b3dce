// Instrumentation against the formulas: the bytes every rank's communicators count in a
// training step (with overlap on, the default) equal the analytic volumes of plan/traffic_model.h (TP all-reduces,
// pipeline activations, data-parallel reductions and ZeRO-3 gathers), and model-state
// memory per rank follows the ZeRO formulas (stage 1 divides optimizer state by dp,
// stage 2 also gradients, stage 3 also parameters).
#include <gtest/gtest.h>


#include "parallel/sharded_param_store.h"
#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string traffic_data_file() {
  static const std::string path = test::write_test_tokens("traffic", 5, 61);
  return path;
}

// Every tensor's rows divide by dp <= 4 and every tensor is a multiple of 16 floats, so
// no shard padding or alignment gap enters the volumes (see traffic_model.h).
std::unique_ptr<Trainer> make_trainer(const ParallelLayout& l, int zero, const char* arch,
                                      const char* precision = "fp32",
                                      const std::string& training_extra = "",
                                      const std::string& parallel_extra = "",
                                      int kv_heads = 4) {
  return test::make_world_trainer(
      std::string("model: {arch: ") + arch +
          ", vocab_size: 64, seq_len: 16, n_layers: 4, n_heads: 4, n_kv_heads: " +
          std::to_string(kv_heads) + ", d_model: 32}\n" +
          test::parallel_yaml(l, zero, parallel_extra) + "data: {train: " + traffic_data_file() +
          "}\n"
          "training: {global_batch_size: 8, max_steps: 2, precision: " + precision +
          training_extra + "}\n",
      traffic_data_file());
}

void expect_group(const GroupTraffic& got, const GroupTraffic& want, const char* group) {
  EXPECT_EQ(got.all_reduce, want.all_reduce) << group << " all_reduce";
  EXPECT_EQ(got.reduce_scatter, want.reduce_scatter) << group << " reduce_scatter";
  EXPECT_EQ(got.all_gather, want.all_gather) << group << " all_gather";
  EXPECT_EQ(got.send, want.send) << group << " send";
}

std::vector<ParallelLayout> layouts_for_world(int n) {
  if (n == 2) return {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
  if (n == 4) return {{2, 1, 2}, {1, 2, 2}, {4, 1, 1}};
  if (n == 8) return {{2, 2, 2}, {1, 2, 4}};
  return {{1, 1, 1}};
}

TEST(Instrumentation, MeasuredTrafficEqualsAnalyticVolumes) {
  for (const ParallelLayout& l : layouts_for_world(test::world().size())) {
    for (int zero = 0; zero <= (l.dp > 1 ? 3 : 0); ++zero) {
      for (const char* arch : {"gpt2", "llama"}) {
        SCOPED_TRACE(test::case_name(arch, l, zero));
        auto trainer = make_trainer(l, zero, arch);
        ASSERT_NE(trainer, nullptr);
        // Step 2 too: ZeRO-3 prefetches its all-gathers from the second step on (the
        // first learns their order); a wrong guess would add bytes.
        ASSERT_TRUE(trainer->train_step().is_ok());
        ASSERT_TRUE(trainer->train_step().is_ok());
        const RankStats& s = trainer->last_step_stats();
        if (zero == 3 && l.dp > 1) {
          EXPECT_GT(s.comm_async_ms.dp, 0.0);  // the prefetches and reduce-scatters ran async
        }
        expect_group(s.traffic.tp, s.analytic.tp, "tp");
        expect_group(s.traffic.dp, s.analytic.dp, "dp");
        expect_group(s.traffic.pp, s.analytic.pp, "pp");
        expect_group(s.traffic.embedding, s.analytic.embedding, "embedding");
        // Not vacuous: whatever the layout splits, something was counted.
        if (l.tp > 1) {
          EXPECT_GT(s.traffic.tp.all_reduce, 0);
        }
        if (l.pp > 1) {
          EXPECT_GT(s.traffic.pp.send, 0);
        }
        if (l.dp > 1) {
          EXPECT_GT(s.traffic.dp.total(), 0);
        }
      }
    }
  }
}

// parallel.overlap_grad_reduce moves the same bytes (the traffic test above runs with it
// on, the default) and is instrumented: with it on, the dp reductions run
// asynchronously (counted in async time, part of it hidden); off,
// nothing is asynchronous or hidden and the reductions are exposed.
TEST(Instrumentation, OverlapCountsHiddenCommunication) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs dp > 1";
  // dp <= 4 keeps the volumes exact (see make_trainer).
  const ParallelLayout l = n == 8 ? ParallelLayout{4, 2, 1} : ParallelLayout{n, 1, 1};
  for (int zero = 0; zero <= 3; ++zero) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(test::case_name("gpt2", l, zero) + (overlap ? " overlap" : " sync"));
      auto trainer = make_trainer(l, zero, "gpt2", "fp32", "",
                                  std::string(", overlap_grad_reduce: ") +
                                      (overlap ? "true" : "false"));
      ASSERT_NE(trainer, nullptr);
      ASSERT_TRUE(trainer->train_step().is_ok());
      const RankStats& s = trainer->last_step_stats();
      expect_group(s.traffic.dp, s.analytic.dp, "dp");
      EXPECT_GT(s.comm_exposed_ms.dp, 0.0);  // at least the parameter gathers / the waits
      // Overlap on: the dp reductions ran asynchronously (how much of that was hidden
      // depends on the machine: on an oversubscribed one the communication thread may
      // only get a core once the training thread waits, and then nothing is hidden).
      // Off: nothing asynchronous, nothing hidden.
      if (overlap) {
        EXPECT_GT(s.comm_async_ms.dp, 0.0);
        EXPECT_GE(s.comm_hidden_ms.dp, 0.0);
        EXPECT_LE(s.comm_hidden_ms.dp, s.comm_async_ms.dp);
      } else {
        EXPECT_EQ(s.comm_async_ms.dp, 0.0);
        EXPECT_EQ(s.comm_hidden_ms.dp, 0.0);
      }
      EXPECT_EQ(s.comm_hidden_ms.tp, 0.0);  // tp is synchronous
      EXPECT_EQ(s.comm_exposed_ms.pp, 0.0);  // a one-rank group counts nothing
    }
  }
}

// Sequence parallelism: the tp all-gathers, reduce-scatters and (norm-weight and
// cross-entropy) all-reduces each equal the analytic volumes, with and without full
// recomputation, in fp32 and bf16; the pipeline boundary shrinks by tp; and the forward's
// gather + reduce-scatter pair moves what one all-reduce moved without it.
TEST(Instrumentation, SequenceParallelTrafficEqualsAnalyticVolumes) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs tp 2";
  const ParallelLayout l = n == 2   ? ParallelLayout{1, 2, 1}
                           : n == 4 ? ParallelLayout{1, 2, 2}
                                    : ParallelLayout{2, 2, 2};
  for (const char* arch : {"gpt2", "llama"}) {
    for (const char* precision : {"fp32", "bf16"}) {
      for (const char* recompute : {"none", "full"}) {
        SCOPED_TRACE(test::case_name(arch, l, 1) + " " + precision + " recompute " + recompute);
        const std::string extra = std::string(", recompute: ") + recompute;
        auto sp = make_trainer(l, 1, arch, precision, extra, ", sequence_parallel: true");
        auto plain = make_trainer(l, 1, arch, precision, extra);
        ASSERT_NE(sp, nullptr);
        ASSERT_NE(plain, nullptr);
        ASSERT_TRUE(sp->train_step().is_ok());
        ASSERT_TRUE(plain->train_step().is_ok());
        const RankStats& s = sp->last_step_stats();
        const RankStats& p = plain->last_step_stats();
        expect_group(s.traffic.tp, s.analytic.tp, "tp");
        expect_group(s.traffic.dp, s.analytic.dp, "dp");
        expect_group(s.traffic.pp, s.analytic.pp, "pp");
        expect_group(s.traffic.embedding, s.analytic.embedding, "embedding");
        EXPECT_GT(s.traffic.tp.all_gather, 0);
        EXPECT_GT(s.traffic.tp.reduce_scatter, 0);
        EXPECT_EQ(s.traffic.pp.send, p.traffic.pp.send / l.tp);
        EXPECT_EQ(s.traffic.dp.total(), p.traffic.dp.total());
        if (l.pp == 1 && std::string(recompute) == "none") {
          // Every all-reduce of N*C rows (2 forward and 2 backward per layer, the
          // embedding's, the head's) becomes one reduce-scatter of N*C plus one all-gather;
          // backward gathers each column input once more. The plain run's all-reduces
          // also carry the cross-entropy statistics (3N fp32), under 2% here.
          const double ar = p.traffic.tp.all_reduce, rs = s.traffic.tp.reduce_scatter;
          EXPECT_NEAR(rs, ar, ar * 0.02) << "one reduce-scatter per former all-reduce";
          const double layers = 4;  // make_trainer's model
          EXPECT_NEAR(s.traffic.tp.all_gather, rs * (6 * layers + 2) / (4 * layers + 2),
                      rs * 1e-9);
        }
      }
    }
  }
}

// Interleaved 1F1B: every chunk sends its activation on and its gradient back (the
// model's first and last chunks excepted), over the wrap-around too; the counters equal
// the analytic volumes for every ZeRO stage, with sequence parallelism as well.
TEST(Instrumentation, InterleavedTrafficEqualsAnalyticVolumes) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs pp 2";
  std::vector<std::pair<ParallelLayout, std::string>> cases;
  const std::string v2 = ", virtual_stages: 2";
  if (n == 2) cases = {{{1, 1, 2}, v2}};
  if (n == 4) cases = {{{2, 1, 2}, v2}, {{1, 2, 2}, v2 + ", sequence_parallel: true"}};
  if (n == 8) cases = {{{2, 2, 2}, v2 + ", sequence_parallel: true"}};
  for (const auto& [l, extra] : cases) {
    for (int zero = 0; zero <= (l.dp > 1 ? 3 : 0); ++zero) {
      for (const char* arch : {"gpt2", "llama"}) {
        SCOPED_TRACE(test::case_name(arch, l, zero) + extra);
        auto interleaved = make_trainer(l, zero, arch, "fp32", "", extra);
        ASSERT_NE(interleaved, nullptr);
        ASSERT_TRUE(interleaved->train_step().is_ok());
        const RankStats& s = interleaved->last_step_stats();
        expect_group(s.traffic.tp, s.analytic.tp, "tp");
        expect_group(s.traffic.dp, s.analytic.dp, "dp");
        expect_group(s.traffic.pp, s.analytic.pp, "pp");
        expect_group(s.traffic.embedding, s.analytic.embedding, "embedding");
        // pp 2, v 2: each stage sends three boundaries per micro-batch (stage 0: chunk 0
        // on, chunk 1 on and back; stage 1: chunk 0 on and back, chunk 1 back) where
        // plain 1F1B sends one.
        auto plain = make_trainer(l, zero, arch, "fp32", "",
                                  extra.substr(v2.size()));  // the same without chunks
        ASSERT_NE(plain, nullptr);
        ASSERT_TRUE(plain->train_step().is_ok());
        EXPECT_EQ(s.traffic.pp.send, 3 * plain->last_step_stats().traffic.pp.send);
      }
    }
  }
}

// Context parallelism: the cp group's point-to-point sends (ring attention's k/v blocks
// forward and backward, the dK/dV accumulators backward, the forward's again under full
// recomputation) equal the analytic ring volume exactly, and every other group's volume
// still equals its model with N/cp tokens per rank and the dp x cp data-parallel group.
// GQA (llama, 2 kv heads of 4) shrinks the blocks; tp splits the kv heads.
TEST(Instrumentation, ContextParallelRingTrafficEqualsAnalyticVolumes) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs cp 2";
  auto layout = [](int dp, int tp, int cp) {
    ParallelLayout l{dp, tp, 1};
    l.cp = cp;
    return l;
  };
  std::vector<ParallelLayout> layouts;
  if (n == 2) layouts = {layout(1, 1, 2)};
  if (n == 4) layouts = {layout(1, 1, 4), layout(1, 2, 2)};
  if (n == 8) layouts = {layout(1, 2, 4), layout(2, 2, 2)};
  for (const ParallelLayout& l : layouts) {
    for (const char* arch : {"gpt2", "llama"}) {
      const int kv_heads = std::string(arch) == "llama" ? 2 : 4;
      for (const char* recompute : {"none", "selective", "full"}) {
        for (const char* precision : {"fp32", "bf16"}) {
          // bf16 and selective once each (llama), ZeRO-3 over dp x cp once.
          const bool fp32 = std::string(precision) == "fp32";
          if (!fp32 && (std::string(arch) != "llama" || std::string(recompute) != "none")) continue;
          if (std::string(recompute) == "selective" && std::string(arch) != "llama") continue;
          const int zero = std::string(recompute) == "full" && std::string(arch) == "llama" ? 3 : 0;
          SCOPED_TRACE(test::case_name(arch, l, zero) + " cp " + std::to_string(l.cp) + " " +
                       precision + " recompute " + recompute);
          auto t = make_trainer(l, zero, arch, precision,
                                std::string(", recompute: ") + recompute, "", kv_heads);
          ASSERT_NE(t, nullptr);
          ASSERT_TRUE(t->train_step().is_ok());
          ASSERT_TRUE(t->train_step().is_ok());
          const RankStats& s = t->last_step_stats();
          const std::pair<GroupTraffic RankTraffic::*, const char*> groups[] = {
              {&RankTraffic::cp, "cp"}, {&RankTraffic::tp, "tp"}, {&RankTraffic::dp, "dp"},
              {&RankTraffic::pp, "pp"}, {&RankTraffic::embedding, "embedding"}};
          for (const auto& [group, name] : groups) {
            expect_group(s.traffic.*group, s.analytic.*group, name);
          }
          // By hand for this model: 4 layers, micro-batches of 1, K = (16/cp) rows x
          // (kv_heads/tp) x head dim 8 of one rank's keys; per layer forward 2(cp-1)K
          // compute-dtype elements (twice under full recomputation), backward 2(cp-1)K of
          // them plus 2cp*K fp32.
          const double micro = t->config().grad_accum_steps();
          const double K = 16.0 / l.cp * (kv_heads / l.tp) * 8;
          const double e = fp32 ? 4 : 2;
          const double fwd = std::string(recompute) == "full" ? 2 : 1;
          EXPECT_EQ(s.traffic.cp.send,
                    4 * micro * ((fwd + 1) * 2 * (l.cp - 1) * K * e + 2 * l.cp * K * 4));
          EXPECT_EQ(s.traffic.cp.all_reduce + s.traffic.cp.all_gather, 0);
          if (l.tp > 1) {
            EXPECT_GT(s.traffic.tp.all_reduce, 0);
          }
          EXPECT_GT(s.traffic.dp.total(), 0);  // dp x cp reduces the gradients
        }
      }
    }
  }
}

TEST(Instrumentation, ModelStateMemoryFollowsZeroFormulas) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs dp > 1";
  const ParallelLayout l{n, 1, 1};
  // Stage 0 is the unsharded baseline: P floats of parameters and of gradients, 2P of
  // AdamW moments.
  auto base = make_trainer(l, 0, "gpt2");
  ASSERT_TRUE(base->train_step().is_ok());
  const double P = base->last_step_stats().param_bytes;
  EXPECT_EQ(base->last_step_stats().grad_bytes, P);
  EXPECT_EQ(base->last_step_stats().optimizer_bytes, 2 * P);
  const double largest_group = [&] {
    size_t m = 0;
    for (const auto& g : base->model().layout().groups) m = std::max(m, g.num_floats);
    return 4.0 * static_cast<double>(m);
  }();
  for (int zero = 1; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto t = make_trainer(l, zero, "gpt2");
    ASSERT_TRUE(t->train_step().is_ok());
    const RankStats& s = t->last_step_stats();
    EXPECT_EQ(s.optimizer_bytes, 2 * P / n);  // stage >= 1: moments sharded
    if (zero == 1) {  // the full gradients and the reduced shard
      EXPECT_EQ(s.grad_bytes, P + P / n);
      EXPECT_EQ(s.param_bytes, P);
    }
    // Stages 2-3 allocate, at construction, pools for the group buffers held at once
    // (one group, or the tied head with the embeddings): the shard plus that.
    const double pool =
        4.0 * static_cast<double>(max_held_group_floats(t->model().layout()));
    EXPECT_LE(pool, 2 * largest_group);
    if (zero == 2) {  // gradient shard, plus the pool of the full buffers in flight
      EXPECT_EQ(s.grad_bytes, P / n + pool);
      EXPECT_EQ(s.param_bytes, P);
    }
    if (zero == 3) {
      EXPECT_EQ(s.grad_bytes, P / n + pool);
      EXPECT_EQ(s.param_bytes, P / n + pool);
    }
  }
}

// bf16: the counters still equal the analytic volumes, and what moves compute-dtype
// elements (TP activation all-reduces, pipeline activations, ZeRO parameter gathers)
// counts half the fp32 bytes, while gradient reductions do not change.
TEST(Instrumentation, Bf16HalvesActivationAndParameterTraffic) {
  for (const ParallelLayout& l : layouts_for_world(test::world().size())) {
    for (int zero : {0, 3}) {
      if (zero > 0 && l.dp == 1) continue;
      SCOPED_TRACE(test::case_name("llama", l, zero));
      auto fp32 = make_trainer(l, zero, "llama", "fp32");
      auto bf16 = make_trainer(l, zero, "llama", "bf16");
      ASSERT_NE(fp32, nullptr);
      ASSERT_NE(bf16, nullptr);
      ASSERT_TRUE(fp32->train_step().is_ok());
      ASSERT_TRUE(bf16->train_step().is_ok());
      const RankStats& a = fp32->last_step_stats();
      const RankStats& b = bf16->last_step_stats();
      expect_group(b.traffic.tp, b.analytic.tp, "tp");
      expect_group(b.traffic.dp, b.analytic.dp, "dp");
      expect_group(b.traffic.pp, b.analytic.pp, "pp");
      EXPECT_EQ(b.traffic.pp.send, a.traffic.pp.send / 2);
      if (l.tp > 1) {
        // All but the cross-entropy statistics (3N fp32 per micro-batch, last stage).
        const auto& par = bf16->config().parallel;
        const double N = par.micro_batch_size * bf16->config().model.seq_len;
        const double micro = bf16->config().grad_accum_steps();
        const double stats = bf16->partition().last_stage() ? 3 * N * 4 * micro : 0;
        EXPECT_GT(a.traffic.tp.all_reduce, 0);
        EXPECT_EQ(b.traffic.tp.all_reduce - stats, (a.traffic.tp.all_reduce - stats) / 2);
      }
      EXPECT_EQ(b.traffic.dp.all_reduce, a.traffic.dp.all_reduce);          // fp32 grads
      EXPECT_EQ(b.traffic.dp.reduce_scatter, a.traffic.dp.reduce_scatter);  // fp32 grads
      EXPECT_EQ(b.traffic.dp.all_gather, a.traffic.dp.all_gather / 2);      // bf16 params
    }
  }
}

// bf16 model state per rank: compute copy 2 B/param, fp32 master 4, gradient 4, moments
// 8, each divided by dp from the ZeRO stage that shards it (master and moments from 1,
// gradients from 2), and at 3 no compute copy beyond the gathered groups (each gather
// casts the masters: 16 B/param sharded, as FSDP2).
TEST(Instrumentation, Bf16ModelStateMemoryFollowsZeroFormulas) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs dp > 1";
  const ParallelLayout l{n, 1, 1};
  auto fp32 = make_trainer(l, 0, "gpt2", "fp32");
  ASSERT_TRUE(fp32->train_step().is_ok());
  const double P = fp32->last_step_stats().param_bytes / 4;  // elements (with alignment)
  EXPECT_EQ(fp32->last_step_stats().master_bytes, 0);         // fp32 trains the masters
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto t = make_trainer(l, zero, "gpt2", "bf16");
    ASSERT_TRUE(t->train_step().is_ok());
    const RankStats& s = t->last_step_stats();
    // Stages 2-3 add the pools of the group buffers held at once (bf16 parameters,
    // f32 gradients), planned at construction.
    const double pool_elems = static_cast<double>(max_held_group_floats(t->model().layout()));
    EXPECT_EQ(s.param_bytes, zero == 3 ? 2 * pool_elems : 2 * P);
    EXPECT_EQ(s.master_bytes, zero == 0 ? 4 * P : 4 * P / n);
    EXPECT_EQ(s.optimizer_bytes, zero == 0 ? 8 * P : 8 * P / n);
    EXPECT_EQ(s.grad_bytes, zero == 0   ? 4 * P
                            : zero == 1 ? 4 * P + 4 * P / n
                                        : 4 * P / n + 4 * pool_elems);
  }
}

}  // namespace
}  // namespace trident
