// Tensor parallelism of the Transformer: a model split over tp ranks must compute the
// same loss, logits and gradients (each rank's slice) as the whole model in one
// process, for gpt2 and llama (with grouped-query attention).
#include <gtest/gtest.h>

#include <cmath>

#include "comm/topology.h"
#include "core/rng.h"
#include "tests/model/tiny_config.h"
#include "model/transformer.h"
#include "tests/common/mpi_test_util.h"
#include "tests/common/random_model.h"

namespace trident {
namespace {

// Vocabulary 64, padded to 128: split over tp, with padding on the last ranks.
TransformerConfig tiny_config(Arch arch, int n_kv_heads) {
  return testing::tiny_model(arch, {.vocab_size = 64, .seq_len = 16,
                                    .n_kv_heads = n_kv_heads, .d_model = 32});
}

void check_tensor_parallel(const TransformerConfig& c, int tp) {
  Communicator& world = test::world();
  auto groups = make_process_groups(world, ParallelLayout{world.size() / tp, tp, 1}, c.tied());
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  auto ops = make_cpu_ops(1);
  const int B = 2, T = c.seq_len, N = B * T;
  const test::RandomBatch batch = test::random_batch(c, N, 5, 6);
  const std::vector<int32_t>& tokens = batch.tokens;
  const std::vector<int32_t>& targets = batch.targets;

  // Random values for every parameter, biases and norm weights included (the default
  // init makes biases zero, which would hide a bias added on every tp rank); padded
  // vocabulary rows stay zero.
  Transformer whole(c, *ops, B);
  const std::vector<std::vector<float>> globals =
      test::set_random_params(whole, 11, /*zero_padding=*/true);
  const float loss_whole = whole.forward(tokens.data(), targets.data(), B, T);
  const std::vector<float> logits_whole = whole.logits_to_host();
  whole.backward(1.0f);
  const std::vector<float> grads_whole = whole.grads_to_host();

  ModelPartition part;
  part.tp_rank = groups->coords.tp_rank;
  part.tp_size = tp;
  Transformer split(c, *ops, part, groups->tp.get(), nullptr, B, 1);
  for (const ParamInfo& p : split.params()) {
    const ParamInfo* pw = whole.layout().find(p.name);
    ASSERT_NE(pw, nullptr) << p.name;
    const std::vector<float> v = local_part(p, globals[static_cast<size_t>(pw - whole.params().data())].data());
    split.set_param(p, v.data());
  }
  split.zero_grads();
  const float loss_split = split.forward(tokens.data(), targets.data(), B, T);
  EXPECT_NEAR(loss_split, loss_whole, 1e-5 * std::fabs(loss_whole));

  // Logits: this rank's vocabulary columns.
  const std::vector<float> logits_split = split.logits_to_host();
  const int Vl = c.padded_vocab / tp, v0 = Vl * part.tp_rank;
  std::vector<float> expected(static_cast<size_t>(N) * Vl);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < Vl; ++v)
      expected[static_cast<size_t>(n) * Vl + v] = logits_whole[static_cast<size_t>(n) * c.padded_vocab + v0 + v];
  EXPECT_LT(test::rel_diff(logits_split, expected), 1e-5);

  split.backward(1.0f);
  const std::vector<float> grads_split = split.grads_to_host();
  for (const ParamInfo& p : split.params()) {
    const ParamInfo* pw = whole.layout().find(p.name);
    ASSERT_NE(pw, nullptr) << p.name;
    const std::vector<float> want = local_part(p, grads_whole.data() + pw->offset);
    const std::vector<float> got(grads_split.begin() + static_cast<ptrdiff_t>(p.offset),
                                 grads_split.begin() + static_cast<ptrdiff_t>(p.offset + p.numel()));
    // attn.k.bias has an exactly-zero true gradient (softmax shift invariance): only
    // rounding noise is left, so compare it absolutely.
    if (p.name.find("attn.k.bias") != std::string::npos) {
      for (float g : got) EXPECT_LT(std::fabs(g), 1e-6f) << p.name;
      continue;
    }
    EXPECT_LT(test::rel_diff(got, want), 1e-5) << p.name << " on tp rank " << part.tp_rank;
  }
}

TEST(TensorParallel, MatchesTheWholeModel) {
  const int world = test::world().size();
  for (int tp : {2, 4}) {
    if (world % tp != 0) continue;
    SCOPED_TRACE("tp=" + std::to_string(tp));
    check_tensor_parallel(tiny_config(Arch::kGpt2, 4), tp);
    check_tensor_parallel(tiny_config(Arch::kLlama, tp == 2 ? 2 : 4), tp);
  }
}

}  // namespace
}  // namespace trident
