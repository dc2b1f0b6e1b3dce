// The model's device loss accumulator (model/transformer.h): forward_stage reads nothing
// back to the host; download_loss_sum is one read, returns the in-order double sum of
// the micro-batch mean losses (bitwise what the per-micro-batch host sum gave) and resets.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

// Vocabulary 200, padded: the head's padded columns are excluded.
TransformerConfig tiny(Arch arch) {
  return testing::tiny_model(arch, {.vocab_size = 200, .seq_len = 16, .d_model = 32});
}

std::vector<int32_t> tokens_for(int micro, int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 31 + micro * 7 + 3) % vocab;
  return t;
}

TEST(LossAccumulator, ForwardStageReadsNothingBackAndOneDownloadTakesTheSum) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    const TransformerConfig c = tiny(arch);
    auto ops = make_cpu_ops(2);
    const int B = 2, T = c.seq_len, N = B * T, micros = 3;
    Transformer model(c, *ops, B);
    model.init_weights(5);

    // The reference: each micro-batch's mean loss through forward() (one read each),
    // summed on the host in double, in order, as the trainer used to.
    double want = 0.0;
    for (int m = 0; m < micros; ++m) {
      const auto in = tokens_for(m, N, c.vocab_size), tg = tokens_for(m + 1, N, c.vocab_size);
      want += model.forward(in.data(), tg.data(), B, T);
    }
    ASSERT_GT(want, 0.0);

    const uint64_t before = ops->transfer_counts().downloads;
    for (int m = 0; m < micros; ++m) {
      const auto in = tokens_for(m, N, c.vocab_size), tg = tokens_for(m + 1, N, c.vocab_size);
      model.forward_stage(0, in.data(), tg.data(), B, T);
      model.backward_stage(0, 1.0f / micros);  // backward reads nothing either
    }
    EXPECT_EQ(ops->transfer_counts().downloads, before) << "forward/backward downloaded";
    EXPECT_EQ(model.download_loss_sum(), want);  // bitwise: same order, same roundings
    EXPECT_EQ(ops->transfer_counts().downloads, before + 1);
    EXPECT_EQ(model.download_loss_sum(), 0.0) << "download_loss_sum resets";

    // A forward without targets adds nothing.
    const auto in = tokens_for(0, N, c.vocab_size);
    model.forward_stage(0, in.data(), nullptr, B, T);
    EXPECT_EQ(model.download_loss_sum(), 0.0);
  }
}

}  // namespace
}  // namespace trident
