// No device allocation inside the step loop (docs/ARCHITECTURE.md "Memory, dtypes and streams"):
// after the first optimizer step, further steps allocate nothing through the rank's Ops
// (Ops::allocation_counts), for every ZeRO stage (ZeRO-2/3 take their group buffers and
// collective scratch from pools planned at construction), tied (gpt2: the one-stage head
// nests group 0) and untied (llama) models, and tp = 2 / pp = 2 layouts where the world
// allows (two micro-batches per step: gradients accumulate through the pools). Nothing
// is created lazily either: the first step allocates nothing beyond construction.
#include <gtest/gtest.h>

#include <string>

#include "tests/common/trainer_test_util.h"

namespace trident {
namespace {

std::string step_alloc_data_file() {
  static const std::string path = test::write_test_tokens("step_alloc", 7, 61);
  return path;
}

std::unique_ptr<Trainer> make_trainer(const ParallelLayout& l, int zero, const char* arch) {
  return test::make_world_trainer(
      test::small_model_yaml(arch) + test::parallel_yaml(l, zero) + "data: {train: " +
          step_alloc_data_file() + "}\n"
          "training: {global_batch_size: " + std::to_string(2 * l.dp) + ", max_steps: 4}\n",
      step_alloc_data_file());
}

std::vector<ParallelLayout> layouts_for_world(int n) {
  if (n == 1) return {{1, 1, 1}};
  if (n == 2) return {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
  if (n == 4) return {{2, 2, 1}, {2, 1, 2}};
  return {{n, 1, 1}};
}

TEST(StepAllocations, NoneInTheStepLoop) {
  for (const ParallelLayout& l : layouts_for_world(test::world().size())) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (const char* arch : {"gpt2", "llama"}) {
        SCOPED_TRACE(test::case_name(arch, l, zero));
        auto trainer = make_trainer(l, zero, arch);
        ASSERT_NE(trainer, nullptr);
        const Ops::AllocationCounts& counts = trainer->ops().allocation_counts();
        const uint64_t before_first = counts.allocations;
        ASSERT_TRUE(trainer->train_step().is_ok());
        const uint64_t after_first = counts.allocations;
        EXPECT_EQ(after_first, before_first)
            << "rank " << test::world().rank() << ": step 1 allocated "
            << after_first - before_first << " buffers";
        const uint64_t live_after_first = counts.live_bytes;
        for (int s = 2; s <= 4; ++s) {
          auto m = trainer->train_step();
          ASSERT_TRUE(m.is_ok()) << m.status().message();
          EXPECT_EQ(counts.allocations, after_first)
              << "rank " << test::world().rank() << ": step " << s << " allocated "
              << counts.allocations - after_first << " buffers since step 1";
        }
        EXPECT_EQ(counts.live_bytes, live_after_first);
      }
    }
  }
}

}  // namespace
}  // namespace trident
