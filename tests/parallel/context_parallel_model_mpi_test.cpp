// Context parallelism of the Transformer (ModelPartition::cp_size, model/transformer.h): a
// model whose sequences are split over cp ranks (each its load-balanced chunks,
// parallel/context_parallel.h) must compute the whole model's logits at its rows, a mean
// loss whose average over the cp ranks is the whole model's, and gradients whose average
// is the whole model's, for gpt2 (learned positions) and llama (RoPE, grouped-query
// attention), without and with full recomputation. The cp group's point-to-point bytes
// per micro-batch are the ring's analytic volume per layer (RingAttention's contract):
// forward 2 (cp-1) blocks of k and v, backward the same plus cp hops of f32 dK/dV, and
// full recomputation a second forward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "comm/topology.h"
#include "model/transformer.h"
#include "parallel/context_parallel.h"
#include "tests/common/mpi_test_util.h"
#include "tests/common/random_model.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

// The sum over the world of a host vector (every rank calls it alike).
void world_sum(std::vector<float>& v) {
  test::world().all_reduce(CommBuf::host(std::span<float>(v)), ReduceOp::kSum);
}

void check_context_parallel(const TransformerConfig& c, int cp, Recompute recompute) {
  Communicator& world = test::world();
  const int dp = world.size() / cp;
  ParallelLayout layout;
  layout.dp = dp;
  layout.cp = cp;
  auto groups = make_process_groups(world, layout, c.tied());
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  auto ops = make_cpu_ops(1);
  const int B = 2, T = c.seq_len, N = B * T;
  const test::RandomBatch batch = test::random_batch(c, N, 5, 7);
  const std::vector<int32_t>& tokens = batch.tokens;
  const std::vector<int32_t>& targets = batch.targets;
  Transformer whole(c, *ops, B);
  const std::vector<std::vector<float>> values =
      test::set_random_params(whole, 13, /*zero_padding=*/false);
  const float loss_whole = whole.forward(tokens.data(), targets.data(), B, T);
  const std::vector<float> logits_whole = whole.logits_to_host();
  whole.backward(1.0f);
  const std::vector<float> grads_whole = whole.grads_to_host();

  ModelPartition part;
  part.cp_rank = groups->coords.cp_rank;
  part.cp_size = cp;
  Transformer split(c, *ops, part, nullptr, nullptr, B, 1, DType::kF32, recompute,
                    groups->cp.get());
  for (size_t i = 0; i < split.params().size(); ++i) {
    split.set_param(split.params()[i], values[i].data());
  }
  split.zero_grads();
  const CpChunks chunks = cp_chunks(T, cp, part.cp_rank);
  const int rows = chunks.rows();
  std::vector<int32_t> local_tokens(static_cast<size_t>(B) * rows);
  std::vector<int32_t> local_targets(local_tokens.size());
  take_cp_rows(tokens.data(), local_tokens.data(), B, T, 1, chunks);
  take_cp_rows(targets.data(), local_targets.data(), B, T, 1, chunks);
  groups->cp->reset_traffic();
  std::vector<float> loss = {split.forward(local_tokens.data(), local_targets.data(), B, rows)};
  world_sum(loss);  // every dp replica computes the same: the mean over the world
  EXPECT_NEAR(loss[0] / world.size(), loss_whole, 1e-5 * std::fabs(loss_whole));

  // Logits: the whole model's at this rank's rows.
  const int Vp = c.padded_vocab;
  std::vector<float> expected(static_cast<size_t>(B) * rows * Vp);
  take_cp_rows(logits_whole.data(), expected.data(), B, T, Vp, chunks);
  EXPECT_LT(test::rel_diff(split.logits_to_host(), expected), 1e-5);

  // Gradients: each rank's is that of its rows' mean loss; their average is the whole's.
  split.backward(1.0f);
  std::vector<float> grads = split.grads_to_host();
  world_sum(grads);
  for (float& g : grads) g /= static_cast<float>(world.size());
  for (const ParamInfo& p : split.params()) {
    const auto at = [&](const std::vector<float>& v, size_t offset) {
      return std::vector<float>(v.begin() + static_cast<ptrdiff_t>(offset),
                                v.begin() + static_cast<ptrdiff_t>(offset + p.numel()));
    };
    const std::vector<float> got = at(grads, p.offset);
    // attn.k.bias has an exactly-zero true gradient (softmax shift invariance).
    if (p.name.find("attn.k.bias") != std::string::npos) {
      for (float g : got) EXPECT_LT(std::fabs(g), 1e-6f) << p.name;
      continue;
    }
    EXPECT_LT(test::rel_diff(got, at(grads_whole, whole.layout().find(p.name)->offset)), 1e-5)
        << p.name;
  }

  // The ring's bytes: per layer, k and v blocks of B x rows x NKV x HD (f32 here).
  const double kv = double(B) * rows * c.n_kv_heads * c.head_dim * sizeof(float);
  const double forward = 2.0 * (cp - 1) * kv;
  const double backward = forward + 2.0 * cp * kv;
  const double passes = forward_passes(recompute);
  EXPECT_EQ(static_cast<double>(groups->cp->traffic().bytes_of(CollectiveKind::kSend)),
            c.n_layers * (passes * forward + backward));
}

TEST(ContextParallelModel, MatchesTheWholeModelAndMovesTheRingVolume) {
  const int world = test::world().size();
  for (int cp : {2, 4}) {
    if (world % cp != 0) continue;
    for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
      for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
        SCOPED_TRACE(std::string(arch_name(arch)) + " cp=" + std::to_string(cp) + " recompute " +
                     recompute_name(r));
        check_context_parallel(
            testing::tiny_model(arch, {.vocab_size = 64, .seq_len = 16, .d_model = 32}), cp, r);
      }
    }
  }
}

}  // namespace
}  // namespace trident
