// Expert parallelism (parallel.ep) against the single-process run: each ep rank holds
// moe_experts / ep experts of every layer and tokens travel to them with all_to_all, so
// the losses and final parameters must be those of one process within fp32 reduction
// order (1e-5 relative on losses, 1e-4 per tensor, as tests/trainer/moe_mpi_test.cpp
// holds ep 1 to), and bf16 within the bf16 tolerances of
// tests/trainer/equivalence_mpi_test.cpp. The all-to-all bytes each rank sends equal the
// analytic volume given the step's routing (its expert loads, from the step's metrics),
// and a checkpoint written at one ep resumes at another (each expert is stored once).
// Tensor parallelism combines with it (the router and the experts replicated over tp, the
// attention and any dense MLP split): tp 2, and ep 2 x tp 2, against the same runs.
// Runs at 2 and 4 ranks (the global batch of 8 splits over dp 2 and 4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "tests/common/mpi_test_util.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

constexpr int kExperts = 4, kTopK = 2, kLayers = 2, kDModel = 32, kSeqLen = 16;
constexpr int kGlobalBatch = 8;
constexpr double kLr = 0.003;

std::string data_file() {
  static const std::string path = test::write_test_tokens("ep_equiv", 7, 61);
  return path;
}

struct Layout {
  int dp = 1, ep = 1, pp = 1, zero = 0;
  int shared = 0;
  bool bf16 = false;
  bool gpt2 = false;              // GELU experts with biases (else llama's SwiGLU)
  const char* recompute = "none";  // training.recompute
  int first_dense = 0;             // model.moe_first_dense_layers
  int tp = 1;
  bool sp = false;  // parallel.sequence_parallel
  std::string name() const {
    return "dp " + std::to_string(dp) + " ep " + std::to_string(ep) + " pp " + std::to_string(pp) +
           " tp " + std::to_string(tp) + (sp ? " sp" : "") +
           " zero " + std::to_string(zero) + (shared ? " shared" : "") + (bf16 ? " bf16" : "") +
           (gpt2 ? " gpt2" : "") + " recompute " + recompute +
           (first_dense ? " first_dense " + std::to_string(first_dense) : "");
  }
};

Config make_config(const Layout& l, int steps, const std::string& ckpt_dir, bool save_final) {
  const std::string yaml =
      testing::tiny_model_yaml(l.gpt2 ? Arch::kGpt2 : Arch::kLlama,
                               {.vocab_size = 64, .seq_len = kSeqLen, .n_layers = kLayers,
                                .d_model = kDModel},
                               ", moe_experts: " + std::to_string(kExperts) +
                                   ", moe_top_k: " + std::to_string(kTopK) +
                                   ", moe_d_ff: 48, moe_shared_experts: " +
                                   std::to_string(l.shared) + ", moe_first_dense_layers: " +
                                   std::to_string(l.first_dense)) +
      "parallel: {dp: " + std::to_string(l.dp) + ", ep: " + std::to_string(l.ep) +
      ", pp: " + std::to_string(l.pp) + ", tp: " + std::to_string(l.tp) +
      ", sequence_parallel: " + (l.sp ? "true" : "false") + ", zero_stage: " + std::to_string(l.zero) +
      ", micro_batch_size: 1}\n"
      "data: {train: " + data_file() + "}\n"
      "training: {global_batch_size: " + std::to_string(kGlobalBatch) +
      ", max_steps: " + std::to_string(steps) + ", lr: " + std::to_string(kLr) +
      ", warmup_steps: 1,"
      " moe_z_loss_coef: 0.001, recompute: " + l.recompute +
      ", precision: " + (l.bf16 ? "bf16" : "fp32") + "}\n"
      "checkpoint: {dir: " + ckpt_dir + ", save_final: " + (save_final ? "true" : "false") +
      "}\n"
      "logging: {metrics: ''}\n";
  auto config = parse_config(yaml, {});
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  return config.is_ok() ? config.value() : Config{};
}

struct EpRun {
  std::vector<double> losses;
  std::vector<double> aux_losses;  // the steps' load-balancing losses (train() only)
  std::map<std::string, std::vector<float>> params;  // world rank 0 only
};

// The all-to-all bytes a rank of an ep group sends in one step: per micro-batch and
// layer, forward the counts (E i32) and its N * K dispatched rows, then back the rows it
// received; backward the same rows again (the outputs' gradients out, the inputs' back).
// `received`: the rows its experts received in the step, over every layer. `passes`: 2
// under full recomputation (backward reruns the forward's exchanges), else 1.
int64_t analytic_all_to_all_bytes(int micro_batches, int64_t received, size_t elem,
                                  int passes) {
  const int64_t N = kSeqLen;  // micro-batch 1
  const int64_t row = kDModel * static_cast<int64_t>(elem);
  const int64_t forward = micro_batches * kLayers * (kExperts * 4 + N * kTopK * row) + received * row;
  const int64_t backward = micro_batches * kLayers * N * kTopK * row + received * row;
  return passes * forward + backward;
}

EpRun train(const Layout& l, Communicator* world, int steps = 4, bool check_traffic = false) {
  const Config config = make_config(l, steps, data_file() + ".ckpt", false);
  const auto trainer = testing::make_test_trainer(config, testing::test_trainer_options(world));
  if (!trainer) return {};
  EpRun out;
  for (int s = 0; s < steps; ++s) {
    Communicator* ep = trainer->groups().ep.get();
    if (ep) ep->reset_traffic();
    auto m = trainer->train_step();
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    if (!m.is_ok()) return {};
    if (check_traffic && ep) {
      // One ep group (dp == ep): the step's expert loads are this group's, and expert e's
      // rows all go to ep rank e / (E / ep).
      EXPECT_EQ(l.dp, l.ep);
      const int local = kExperts / l.ep, first = ep->rank() * local;
      const double assignments = double(kGlobalBatch) * kSeqLen * kTopK;  // per layer
      int64_t received = 0;
      for (const std::vector<double>& layer : m.value().moe_fractions) {
        for (int e = first; e < first + local; ++e) {
          received += std::llround(layer[static_cast<size_t>(e)] * assignments);
        }
      }
      const int micro_batches = kGlobalBatch / l.dp;
      const size_t elem = l.bf16 ? 2 : 4;
      const int passes = std::string(l.recompute) == "full" ? 2 : 1;
      EXPECT_EQ(ep->traffic().bytes_of(CollectiveKind::kAllToAll),
                analytic_all_to_all_bytes(micro_batches, received, elem, passes))
          << "step " << s + 1;
      EXPECT_EQ(ep->traffic().calls_of(CollectiveKind::kAllToAll),
                micro_batches * kLayers * (3 * passes + 2));
    }
    if (l.tp > 1) {
      // The tp group exchanges attention's (and a dense MLP's) activations, and with
      // sequence parallelism a MoE block's input and output gradient rows: its router
      // and experts are replicated over tp.
      const RankStats& st = trainer->last_step_stats();
      EXPECT_EQ(st.traffic.tp.all_reduce, st.analytic.tp.all_reduce) << "step " << s + 1;
      EXPECT_EQ(st.traffic.tp.all_gather, st.analytic.tp.all_gather) << "step " << s + 1;
      EXPECT_EQ(st.traffic.tp.reduce_scatter, st.analytic.tp.reduce_scatter) << "step " << s + 1;
      EXPECT_GT(st.traffic.tp.all_reduce, 0.0);
      if (l.sp) {
        EXPECT_GT(st.traffic.tp.all_gather, 0.0);
      }
    }
    if (l.zero == 0 && l.dp > 1) {
      // The dp group all-reduces the dense engine's buffer, as the traffic model says.
      const RankStats& st = trainer->last_step_stats();
      EXPECT_EQ(st.traffic.dp.all_reduce, st.analytic.dp.all_reduce) << "step " << s + 1;
      EXPECT_GT(st.traffic.dp.all_reduce, 0.0);
    }
    out.losses.push_back(m.value().loss);
    out.aux_losses.push_back(m.value().moe_aux_loss);
  }
  out.params = trainer->gather_parameters();
  return out;
}

void expect_match(const EpRun& got, const EpRun& ref, bool bf16, size_t first_step = 0) {
  const double loss_tol = bf16 ? 1e-3 : 1e-5;
  ASSERT_EQ(got.losses.size() + first_step, ref.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    const double want = ref.losses[s + first_step];
    EXPECT_NEAR(got.losses[s], want, loss_tol * std::fabs(want)) << "step " << s + first_step + 1;
  }
  if (!got.aux_losses.empty()) {
    ASSERT_EQ(got.aux_losses.size(), ref.aux_losses.size());
    for (size_t s = 0; s < got.aux_losses.size(); ++s) {
      const double want = ref.aux_losses[s];
      EXPECT_GT(want, 0.0);
      EXPECT_NEAR(got.aux_losses[s], want, loss_tol * want) << "aux loss, step " << s + 1;
    }
  }
  if (test::world().rank() != 0) return;
  ASSERT_EQ(got.params.size(), ref.params.size());
  double num = 0, den = 0;
  for (const auto& [name, values] : ref.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    // gpt2's attn.k.bias has an exactly-zero true gradient, so its AdamW steps are
    // summation-order noise, bounded only by the largest movement (as in
    // tests/trainer/equivalence_mpi_test.cpp).
    if (name.find("attn.k.bias") != std::string::npos) {
      for (size_t i = 0; i < values.size(); ++i) {
        EXPECT_LE(std::fabs(it->second[i] - values[i]), 2 * kLr * double(ref.losses.size()))
            << name;
      }
      continue;
    }
    if (!bf16) {
      EXPECT_LT(test::rel_diff(it->second, values), 1e-4) << name;
    }
    for (size_t i = 0; i < values.size(); ++i) {
      num += (it->second[i] - values[i]) * double(it->second[i] - values[i]);
      den += double(values[i]) * values[i];
    }
  }
  EXPECT_LT(std::sqrt(num / den), bf16 ? 1e-2 : 1e-5) << "all parameters";
}

bool two_or_four() {
  const int n = test::world().size();
  return n == 2 || n == 4;
}

TEST(ExpertParallel, MatchesSingleProcessWithAnalyticAllToAllBytes) {
  if (!two_or_four()) GTEST_SKIP() << "runs at 2 and 4 ranks";
  Communicator& world = test::world();
  const int n = world.size();
  const EpRun ref = train({}, nullptr);
  ASSERT_EQ(ref.losses.size(), 4u);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  // ep = dp (2 or 4): one ep group; the bytes are checked against the routing.
  {
    SCOPED_TRACE("ep " + std::to_string(n));
    expect_match(train({.dp = n, .ep = n}, &world, 4, /*check_traffic=*/true), ref, false);
  }
  std::vector<Layout> layouts;
  if (n == 2) {
    layouts = {{.dp = 2, .ep = 2, .zero = 1}, {.dp = 2, .ep = 2, .zero = 2},
               {.dp = 2, .ep = 2, .zero = 3}};
  } else {
    // ep 2 inside dp 4 (expert dp groups of 2), and ep 2 x pp 2.
    layouts = {{.dp = 4, .ep = 2, .zero = 1}, {.dp = 2, .ep = 2, .pp = 2, .zero = 0},
               {.dp = 4, .ep = 2, .zero = 3}};
  }
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name());
    expect_match(train(l, &world), ref, false);
  }
}

// Shared experts, a leading dense layer (model.moe_first_dense_layers), gpt2's GELU
// experts (biases), full recomputation (backward reruns the exchange), and bf16 (with its
// all-to-all bytes at 2 ranks: 2 per element).
TEST(ExpertParallel, OtherBlocksRecomputationAndBf16MatchSingleProcess) {
  if (!two_or_four()) GTEST_SKIP() << "runs at 2 and 4 ranks";
  Communicator& world = test::world();
  const int n = world.size();
  {
    SCOPED_TRACE("shared experts");
    const EpRun ref = train({.shared = 1}, nullptr, 3);
    expect_match(train({.dp = n, .ep = 2, .shared = 1}, &world, 3), ref, false);
  }
  {
    // DeepSeek's leading dense layer: layer 0 the dense MLP, layer 1 the experts (split
    // over ep; the dense layer holds no expert group).
    SCOPED_TRACE("first dense layer");
    const EpRun ref = train({.first_dense = 1}, nullptr, 3);
    expect_match(train({.dp = n, .ep = 2, .zero = 3, .first_dense = 1}, &world, 3), ref, false);
  }
  {
    SCOPED_TRACE("gpt2, full recomputation");
    const EpRun ref = train({.gpt2 = true}, nullptr, 3);
    expect_match(train({.dp = n, .ep = 2, .gpt2 = true, .recompute = "full"}, &world, 3), ref,
                 false);
  }
  {
    SCOPED_TRACE("bf16");
    const EpRun ref = train({.bf16 = true}, nullptr, 3);
    expect_match(train({.dp = n, .ep = 2, .bf16 = true}, &world, 3, /*check_traffic=*/n == 2), ref,
                 true);
  }
}

// Tensor parallelism with experts: tp 2 (2 ranks), ep 2 x tp 2 (4 ranks, with the
// all-to-all bytes of the routing), llama's SwiGLU and gpt2's GELU experts, a leading
// dense layer (its MLP split over tp) with ZeRO-1, sequence parallelism, tp 2 x pp 2
// (4 ranks), and bf16 against single-process bf16.
TEST(ExpertParallel, TensorParallelMatchesSingleProcess) {
  if (!two_or_four()) GTEST_SKIP() << "runs at 2 and 4 ranks";
  Communicator& world = test::world();
  const int n = world.size();
  const Layout base = n == 2 ? Layout{.dp = 1, .tp = 2} : Layout{.dp = 2, .ep = 2, .tp = 2};
  const bool one_ep_group = base.ep > 1;  // dp == ep: the bytes are checked
  for (const bool gpt2 : {false, true}) {
    Layout ref_layout, l = base;
    ref_layout.gpt2 = l.gpt2 = gpt2;
    SCOPED_TRACE(l.name());
    const EpRun ref = train(ref_layout, nullptr, 3);
    expect_match(train(l, &world, 3, one_ep_group), ref, false);
  }
  for (const bool gpt2 : {false, true}) {
    // Sequence parallelism: the block runs on the gathered rows; gpt2 with full
    // recomputation (backward reruns the gathers).
    Layout ref_layout, l = base;
    ref_layout.gpt2 = l.gpt2 = gpt2;
    l.sp = true;
    if (gpt2) ref_layout.recompute = l.recompute = "full";
    SCOPED_TRACE(l.name());
    const EpRun ref = train(ref_layout, nullptr, 3);
    expect_match(train(l, &world, 3, one_ep_group), ref, false);
  }
  {
    Layout l = base;
    l.first_dense = 1;
    l.zero = 1;
    l.sp = true;
    SCOPED_TRACE(l.name());
    const EpRun ref = train({.first_dense = 1}, nullptr, 3);
    expect_match(train(l, &world, 3), ref, false);
  }
  if (n == 4) {
    // Pipeline stages with it: tp 2 x pp 2 (each stage's layers' experts on its tp ranks).
    const Layout l{.dp = 1, .pp = 2, .tp = 2};
    SCOPED_TRACE(l.name());
    const EpRun ref = train({}, nullptr, 3);
    expect_match(train(l, &world, 3), ref, false);
  }
  {
    Layout l = base;
    l.bf16 = true;
    SCOPED_TRACE(l.name());
    const EpRun ref = train({.bf16 = true}, nullptr, 3);
    expect_match(train(l, &world, 3, one_ep_group), ref, true);
  }
}

// The checkpoint directory, the same path on every rank (rank 0 makes it).
std::string shared_dir(const testing::ScratchDir& mine) {
  Communicator& world = test::world();
  uint8_t buf[512] = {};
  if (world.rank() == 0) std::memcpy(buf, mine.path().c_str(), std::min(sizeof(buf) - 1, mine.path().size()));
  world.broadcast(CommBuf::host(std::span<uint8_t>(buf, sizeof(buf))), 0);
  return reinterpret_cast<const char*>(buf);
}

// Steps 1-3 at layout `from`, saved; steps 4-6 resumed at `to`: the single-process
// losses of steps 4-6 and final parameters.
void expect_resume(const Layout& from, const Layout& to, const EpRun& ref) {
  SCOPED_TRACE(from.name() + " -> " + to.name());
  Communicator& world = test::world();
  testing::ScratchDir scratch;
  const std::string dir = shared_dir(scratch) + "/ckpt";
  {
    // The schedule of 6 steps (the reference's), stopped after 3 with a checkpoint.
    const auto first = testing::make_test_trainer(make_config(from, 6, dir, false),
                                                  testing::test_trainer_options(&world));
    ASSERT_TRUE(first);
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(first->train_step().is_ok());
    ASSERT_TRUE(first->save_checkpoint(/*async=*/false).is_ok());
  }
  TrainerOptions options = testing::test_trainer_options(&world);
  options.resume = "auto";
  const auto second = testing::make_test_trainer(make_config(to, 6, dir, false), options);
  ASSERT_TRUE(second);
  ASSERT_EQ(second->step(), 3);
  ASSERT_TRUE(second->run().is_ok());
  EpRun got{second->losses(), {}, second->gather_parameters()};
  expect_match(got, ref, false, 3);
  world.barrier();  // rank 0's scratch directory outlives every rank's use of it
}

TEST(ExpertParallel, ResumesAcrossExpertParallelism) {
  if (!two_or_four()) GTEST_SKIP() << "runs at 2 and 4 ranks";
  const int n = test::world().size();
  const EpRun ref = train({}, nullptr, 6);
  if (n == 2) {
    expect_resume({.dp = 2, .ep = 2}, {.dp = 2, .ep = 1}, ref);
    expect_resume({.dp = 1, .tp = 2}, {.dp = 2}, ref);
  } else {
    expect_resume({.dp = 2, .ep = 2, .tp = 2}, {.dp = 4, .ep = 1}, ref);
    expect_resume({.dp = 4, .ep = 1}, {.dp = 4, .ep = 4, .zero = 1}, ref);
    expect_resume({.dp = 4, .ep = 2, .zero = 3}, {.dp = 4, .ep = 1}, ref);
  }
}

}  // namespace
}  // namespace trident
