// Activation recomputation (training.recompute, model/transformer.h): selective and full
// recompute exactly what forward computed, so every layout trains bitwise like `none`
// at the same layout — losses, gradient norms and final parameters, fp32 and bf16 — while
// holding less activation memory per slot (full keeps only each layer's input).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string data_file() {
  static const std::string path = test::write_test_tokens("recompute", 7, 61);
  return path;
}

struct Outcome {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // world rank 0 only
  double activation_bytes = 0;
};

Outcome train(const std::string& arch, const ParallelLayout& l, int zero, bool sp, int v, bool bf16,
              Recompute r) {
  const std::string extra = std::string(sp ? ", sequence_parallel: true" : "") +
                            ", virtual_stages: " + std::to_string(v);
  // Interleaving 2 stages x 2 chunks needs 4 layers (the small model has 2).
  const std::string model = test::small_model_yaml(arch, 2 * v);
  auto trainer = test::make_world_trainer(
      model + test::parallel_yaml(l, zero, extra) + "data: {train: " +
          data_file() + "}\n" +
          "training: {global_batch_size: 8, max_steps: 4, lr: 0.001, precision: " +
          (bf16 ? "bf16" : "fp32") + ", recompute: " + recompute_name(r) + "}\n",
      data_file());
  if (!trainer) return {};
  const Status st = trainer->run();
  EXPECT_TRUE(st.is_ok()) << st.message();
  Outcome run;
  run.losses = trainer->losses();
  run.params = trainer->gather_parameters();
  run.activation_bytes = trainer->last_step_stats().activation_bytes;
  return run;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Layouts per world size: tensor and pipeline parallelism (full recomputation reruns the
// tp all-reduces; the pipeline keeps several micro-batches alive, whose shared recompute
// buffers must not mix), ZeRO-3 (parameters gathered again for the recomputation) and
// sequence parallelism (the recomputed forward gathers and reduce-scatters again), and
// context parallelism (full recomputation reruns the ring; selective keeps ring
// attention's state, so it holds as much as none).
struct Case {
  ParallelLayout layout;
  int zero = 0;
  bool sequence_parallel = false;
  int virtual_stages = 1;  // interleaved 1F1B: every chunk recomputes its own layers
};
std::vector<Case> layouts(int n) {
  if (n == 1) return {{{1, 1, 1}, 0}};
  if (n == 2) {
    return {{{1, 2, 1}, 0}, {{1, 1, 2}, 0}, {{2, 1, 1}, 3}, {{1, 2, 1}, 0, true},
            {{1, 1, 2}, 0, false, 2}, {{.cp = 2}, 0}};
  }
  if (n == 4) {
    return {{{1, 2, 2}, 0}, {{2, 1, 2}, 3}, {{1, 2, 2}, 0, true},
            {{.tp = 2, .cp = 2}, 0, true}, {{.pp = 2, .cp = 2}, 0, false, 2}};
  }
  if (n == 8) return {{{2, 2, 2}, 3}, {{2, 2, 2}, 3, true}};
  return {};
}

TEST(Recompute, SelectiveAndFullTrainBitwiseLikeNoneAtEveryLayout) {
  for (const auto& [l, zero, sp, v] : layouts(test::world().size())) {
    for (const std::string arch : {"gpt2", "llama"}) {
      for (bool bf16 : {false, true}) {
        SCOPED_TRACE(test::case_name(arch, l, zero) + (sp ? " sp" : "") + " v" +
                     std::to_string(v) + (bf16 ? " bf16" : " fp32"));
        const Outcome none = train(arch, l, zero, sp, v, bf16, Recompute::kNone);
        ASSERT_EQ(none.losses.size(), 4u);
        double previous_bytes = none.activation_bytes;
        for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
          SCOPED_TRACE(recompute_name(r));
          const Outcome got = train(arch, l, zero, sp, v, bf16, r);
          ASSERT_EQ(got.losses.size(), none.losses.size());
          for (size_t s = 0; s < none.losses.size(); ++s) {
            EXPECT_EQ(std::memcmp(&got.losses[s], &none.losses[s], sizeof(double)), 0)
                << "step " << s + 1 << ": " << got.losses[s] << " vs " << none.losses[s];
          }
          // Less held per slot each time: the attention state (not under context
          // parallelism, whose ring attention state stays), then every layer tensor but
          // the input.
          if (r == Recompute::kSelective && l.cp > 1) {
            EXPECT_EQ(got.activation_bytes, previous_bytes);
          } else {
            EXPECT_LT(got.activation_bytes, previous_bytes);
          }
          previous_bytes = got.activation_bytes;
          if (test::world().rank() != 0) continue;
          ASSERT_EQ(got.params.size(), none.params.size());
          for (const auto& [name, values] : none.params) {
            auto it = got.params.find(name);
            ASSERT_NE(it, got.params.end()) << name;
            EXPECT_TRUE(bitwise_equal(it->second, values)) << name;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace trident

namespace trident {
namespace {

// Full recomputation reruns each layer's forward, tensor-parallel all-reduces included:
// the measured tp traffic grows by the forward's two all-reduces per layer and equals
// the analytic volume (plan/traffic_model.h); selective adds none.
TEST(Recompute, FullRecomputationTrafficIsTheAnalyticVolume) {
  const int n = test::world().size();
  if (n < 2) GTEST_SKIP() << "needs tp 2";
  const ParallelLayout l{n / 2, 2, 1};
  double tp_bytes[3] = {};
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(recompute_name(r));
    auto trainer = test::make_world_trainer(
        test::small_model_yaml("llama") + test::parallel_yaml(l, 0) + "data: {train: " +
            data_file() + "}\n" + "training: {global_batch_size: 8, max_steps: 1, recompute: " +
            recompute_name(r) + "}\n",
        data_file());
    ASSERT_NE(trainer, nullptr);
    ASSERT_TRUE(trainer->train_step().is_ok());
    const RankStats& s = trainer->last_step_stats();
    EXPECT_DOUBLE_EQ(s.traffic.tp.all_reduce, s.analytic.tp.all_reduce);
    tp_bytes[static_cast<int>(r)] = s.traffic.tp.all_reduce;
  }
  EXPECT_EQ(tp_bytes[1], tp_bytes[0]);
  EXPECT_GT(tp_bytes[2], tp_bytes[0]);
}

}  // namespace
}  // namespace trident
