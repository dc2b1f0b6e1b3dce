// The host-synchronisation budget across ranks: in every layout of the world (tp = 2 runs
// the vocab-parallel cross-entropy, whose combine used to read 3N floats back per
// micro-batch; pp = 2 puts the loss on one stage only), every rank reads back at most 2
// values per optimizer step (the loss on the reporting ranks, the norm's sum of squares).
#include <gtest/gtest.h>

#include <string>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string host_sync_data_file() {
  static const std::string path = test::write_test_tokens("host_sync", 7, 61);
  return path;
}

std::unique_ptr<Trainer> make_trainer(const ParallelLayout& l, int zero, const char* arch) {
  return test::make_world_trainer(
      test::small_model_yaml(arch) + test::parallel_yaml(l, zero) + "data: {train: " +
          host_sync_data_file() + "}\n"
          "training: {global_batch_size: 8, max_steps: 4}\n",
      host_sync_data_file());
}

std::vector<ParallelLayout> layouts_for_world(int n) {
  if (n == 2) return {{1, 2, 1}, {1, 1, 2}, {2, 1, 1}};
  if (n == 4) return {{1, 2, 2}, {2, 2, 1}, {2, 1, 2}};
  return {{n, 1, 1}};
}

TEST(HostSync, AtMostTwoDownloadsPerStepOnEveryRank) {
  for (const ParallelLayout& l : layouts_for_world(test::world().size())) {
    for (int zero : {0, 3}) {
      if (zero > 0 && l.dp == 1) continue;
      for (const char* arch : {"gpt2", "llama"}) {
        SCOPED_TRACE(test::case_name(arch, l, zero));
        auto trainer = make_trainer(l, zero, arch);
        ASSERT_NE(trainer, nullptr);
        const TransferCounts& counts = trainer->ops().transfer_counts();
        for (int s = 0; s < 3; ++s) {
          const uint64_t before = counts.downloads;
          auto m = trainer->train_step();
          ASSERT_TRUE(m.is_ok()) << m.status().message();
          EXPECT_GT(m.value().loss, 0.0);  // every rank gets the global loss
          const uint64_t got = counts.downloads - before;
          EXPECT_LE(got, 2u) << "rank " << test::world().rank() << " step " << s + 1;
          // The reporting rank (last stage, tp 0; dp 0 for stage 0's norm) reads both.
          const RankCoords& rc = trainer->coords();
          if (trainer->partition().last_stage() && rc.tp_rank == 0 && rc.dp_rank == 0) {
            EXPECT_EQ(got, 2u) << "step " << s + 1;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace trident
