// The host-synchronisation budget of a training step ("device-ready core"): per optimizer
// step a rank reads back from the device at most the loss and the gradient norm's sum of
// squares (Ops::transfer_counts().downloads), however many micro-batches and tensors the
// step has; an evaluation reads one value. Single process here; tests/trainer/host_sync_mpi_test
// covers tp = 2 (the vocab-parallel cross-entropy) and pp = 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/pattern_tokens.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

class HostSync : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::write_pattern_tokens(dir_.file("train.bin")).is_ok());
  }

  Config make_config(const std::string& arch, int zero) {
    Config c = testing::small_trainer_config(arch == "gpt2" ? Arch::kGpt2 : Arch::kLlama,
                                             dir_.file("train.bin"),
                                             dir_.file("ckpt" + std::to_string(++trainers_)));
    c.parallel.zero_stage = zero;
    c.training.global_batch_size = 2 * 4;  // 4 micro-batches per step
    c.training.eval_batches = 3;
    c.data.val = dir_.file("train.bin");
    return c;
  }

  testing::ScratchDir dir_;
  int trainers_ = 0;
};

TEST_F(HostSync, AStepReadsBackOnlyTheLossAndTheNorm) {
  for (const std::string arch : {"gpt2", "llama"}) {
    for (int zero : {0, 1, 2, 3}) {
      SCOPED_TRACE(arch + " zero " + std::to_string(zero));
      Config c = make_config(arch, zero);
      ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
      const auto made = testing::make_test_trainer(c);
      ASSERT_NE(made, nullptr);
      Trainer& trainer = *made;
      const TransferCounts& counts = trainer.ops().transfer_counts();
      std::vector<uint64_t> per_step;
      for (int s = 0; s < 4; ++s) {
        const uint64_t before = counts.downloads;
        auto m = trainer.train_step();
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        EXPECT_GT(m.value().loss, 0.0);
        EXPECT_GT(m.value().grad_norm, 0.0);
        per_step.push_back(counts.downloads - before);
      }
      // One process holds the last stage (the loss) and tp rank 0 (the norm): exactly 2.
      for (size_t s = 1; s < per_step.size(); ++s) {
        EXPECT_EQ(per_step[s], 2u) << "downloads in step " << s + 1;
      }
      EXPECT_LE(per_step[0], 2u) << "downloads in step 1";
      const uint64_t before = counts.downloads;
      auto val = trainer.evaluate();
      ASSERT_TRUE(val.is_ok()) << val.status().message();
      EXPECT_GT(val.value(), 0.0);
      EXPECT_EQ(counts.downloads - before, 1u) << "an evaluation reads one value";
    }
  }
}

}  // namespace
}  // namespace trident
