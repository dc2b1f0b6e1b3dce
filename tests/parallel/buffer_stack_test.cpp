// The pools the ZeRO-2/3 stores take their group buffers from (parallel/buffer_stack.h):
// slices nest on one allocation made at construction, and both misuses a plan must rule
// out (releasing out of order, holding more than planned) fail naming the buffers. The
// stores' own pools over a one-rank (device) communicator: the capacity rule of
// max_held_group_floats and the ZeRO-3 nesting error.
#include "parallel/buffer_stack.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/sharded_param_store.h"
#include "tests/common/param_layout.h"

namespace trident {
namespace {

TEST(BufferStack, SlicesNestOnOneAllocation) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  BufferStack stack(*ops, 256, "test pool");
  const uint64_t allocations = ops->allocation_counts().allocations;
  EXPECT_EQ(stack.capacity(), 256u);
  const DevPtr a = stack.push(64, true, "a");
  const DevPtr b = stack.push(128, true, "b");
  EXPECT_EQ(b.raw(), a.byte_offset(64).raw());
  EXPECT_EQ(stack.used(), 192u);
  // Zeroed on push even after the slice held other values.
  const std::vector<float> ones(16, 1.0f);
  ops->upload(a.as(DType::kF32), ones.data(), 64);
  stack.pop(b);
  stack.pop(a);
  const DevPtr again = stack.push(64, true, "again");
  EXPECT_EQ(again.raw(), a.raw());
  std::vector<float> got(16, 5.0f);
  ops->download(got.data(), again.as(DType::kF32), 64);
  for (float x : got) EXPECT_EQ(x, 0.0f);
  stack.pop(again);
  EXPECT_EQ(stack.used(), 0u);
  EXPECT_EQ(ops->allocation_counts().allocations, allocations);  // nothing allocated
}

TEST(BufferStackDeathTest, OverflowAndOutOfOrderNameTheBuffers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        BufferStack s(*ops, 64, "test pool");
        s.push(48, true, "first");
        s.push(32, true, "second");
      },
      "test pool: second needs 32 bytes on top of 48 held \\(1 buffers\\), past the 64 "
      "planned at construction");
  EXPECT_DEATH(
      {
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        BufferStack s(*ops, 64, "test pool");
        const DevPtr first = s.push(16, true, "first");
        s.push(16, true, "second");
        s.pop(first);
      },
      "test pool: first released before second, which was acquired after it");
}

// Group 0 (7 x 5, 13), group 1 empty, group 2 (3 x 4): groups 0 and the last both
// non-empty and no lm_head.weight, as a tied one-stage model.
ParamLayout tied_layout(bool with_lm_head) {
  return testing::make_test_layout(
      {{"", {7, 5}, 0}, {"", {13}, 0}, {with_lm_head ? "lm_head.weight" : "", {3, 4}, 2}}, 3);
}

TEST(BufferStack, StorePoolsHoldTheTiedHeadWithTheEmbeddings) {
  const ParamLayout tied = tied_layout(false), untied = tied_layout(true);
  ASSERT_EQ(tied.groups[0].num_floats, 64u);  // 35 -> 48, + 13 -> 64
  ASSERT_EQ(tied.groups[2].num_floats, 16u);
  EXPECT_TRUE(head_reads_embeddings(tied));
  EXPECT_FALSE(head_reads_embeddings(untied));
  EXPECT_EQ(max_held_group_floats(tied), 64u + 16u);
  EXPECT_EQ(max_held_group_floats(untied), 64u);

  SelfCommunicator dp("dp", MemSpace::kDevice);
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ShardedParamStore store(tied, *ops, dp, DType::kBF16);
  EXPECT_EQ(store.param_pool_bytes(), 80u * 2);  // bf16 compute weights
  EXPECT_EQ(store.grad_pool_bytes(), 80u * 4);   // f32 gradients
  const uint64_t allocations = ops->allocation_counts().allocations;
  for (int micro = 0; micro < 2; ++micro) {
    store.acquire(2, Phase::kBackward);
    store.acquire(0, Phase::kBackward);
    EXPECT_EQ(store.held_param_bytes(), 80u * 2);
    EXPECT_EQ(store.held_grad_bytes(), 80u * 4);
    store.release(0, Phase::kBackward);
    store.release(2, Phase::kBackward);
  }
  EXPECT_EQ(ops->allocation_counts().allocations, allocations);
}

TEST(BufferStackDeathTest, StoreReleasesOutOfOrderOrPastThePlan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SelfCommunicator dp("dp", MemSpace::kDevice);
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        const ParamLayout layout = tied_layout(false);
        ShardedParamStore store(layout, *ops, dp);
        store.acquire(2, Phase::kForward);
        store.acquire(0, Phase::kForward);
        store.release(2, Phase::kForward);
      },
      "zero3 gathered parameters: parameters of group 2 released before parameters of "
      "group 0");
  EXPECT_DEATH(
      {
        SelfCommunicator dp("dp", MemSpace::kDevice);
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        const ParamLayout layout = tied_layout(true);  // untied: one group at a time
        GradShardedParamStore store(layout, *ops, dp);
        store.acquire(2, Phase::kBackward);
        store.acquire(0, Phase::kBackward);
      },
      "zero2 group gradients: gradients of group 0 needs 256 bytes on top of 64 held");
}

}  // namespace
}  // namespace trident
