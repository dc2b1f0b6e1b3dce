// Shard geometry, chunk packing and the ZeRO-2 and ZeRO-3 stores
// (parallel/sharded_param_store.h).
// Geometry and packing are local (checked for several dp sizes in every process); the
// store runs over the world communicator as its dp group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/common/mpi_test_util.h"
#include "parallel/sharded_param_store.h"
#include "tests/common/param_layout.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::test {
namespace {

// Group 0: (7,5), (13,), (1,9); group 1 empty; group 2: (3,4), (2,3,2). Offsets in the
// flat layout, 16-float aligned.
ParamLayout store_layout() {
  return testing::make_test_layout(
      {{"", {7, 5}, 0}, {"", {13}, 0}, {"", {1, 9}, 0}, {"", {3, 4}, 2}, {"", {2, 3, 2}, 2}}, 3);
}

TEST(ShardGeometry, CeilSplitWithEmptyTailShards) {
  RowSplit s = row_split(Shape{7, 5}, 4);
  EXPECT_EQ(s.rows, 7);
  EXPECT_EQ(s.row_elems, 5);
  EXPECT_EQ(s.rows_per_rank, 2);
  const int64_t begins[] = {0, 2, 4, 6}, ends[] = {2, 4, 6, 7};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s.row_begin(r), begins[r]);
    EXPECT_EQ(s.row_end(r), ends[r]);
  }
  EXPECT_EQ(s.owned_floats(3), 5u);
  EXPECT_EQ(s.padded_floats(), 10u);

  s = row_split(Shape{3, 4}, 4);  // rank 3 owns nothing
  EXPECT_EQ(s.owned_floats(2), 4u);
  EXPECT_EQ(s.owned_floats(3), 0u);
  s = row_split(Shape{13}, 8);  // 1-D: rows are elements
  EXPECT_EQ(s.row_elems, 1);
  EXPECT_EQ(s.row_begin(6), 12);
  EXPECT_EQ(s.owned_floats(6), 1u);
  EXPECT_EQ(s.owned_floats(7), 0u);
  s = row_split(Shape{}, 2);  // 0-D: one row
  EXPECT_EQ(s.owned_floats(0), 1u);
  EXPECT_EQ(s.owned_floats(1), 0u);
}

TEST(ShardGeometry, ShardsTileEveryTensorForAnyDp) {
  for (const Shape& shape : {Shape{7, 5}, Shape{13}, Shape{1, 9}, Shape{2, 3, 2}}) {
    for (int dp = 1; dp <= 9; ++dp) {
      const RowSplit s = row_split(shape, dp);
      size_t next = 0;
      for (int r = 0; r < dp; ++r) {
        EXPECT_EQ(s.begin_float(r), std::min(next, static_cast<size_t>(shape.numel())));
        next = s.begin_float(r) + s.owned_floats(r);
        EXPECT_LE(s.owned_floats(r), s.padded_floats());
      }
      EXPECT_EQ(next, static_cast<size_t>(shape.numel())) << shape.str() << " dp " << dp;
    }
  }
}

TEST(ShardGeometry, PackUnpackRoundTrip) {
  const ParamLayout layout = store_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const int dp = 3;
  // Per-group buffers (as the ZeRO-3 store uses them), one chunk per group.
  std::vector<size_t> base;
  for (const ParamGroup& g : layout.groups) base.push_back(g.offset);
  const ShardPlan plan(layout, dp, base, static_cast<size_t>(-1));
  ASSERT_EQ(plan.chunks().size(), 2u);
  EXPECT_TRUE(plan.group_chunks(1).empty());
  // Padded shards: (7,5): 3 rows * 5; (13,): 5; (1,9): 9; (3,4): 4; (2,3,2): 6.
  EXPECT_EQ(plan.chunks()[0].chunk_floats, 15u + 5u + 9u);
  EXPECT_EQ(plan.chunks()[1].chunk_floats, 4u + 6u);
  EXPECT_EQ(plan.chunks()[1].shard_offset, 29u);
  EXPECT_EQ(plan.shard_floats(), 39u);

  for (const ShardChunk& chunk : plan.chunks()) {
    const ParamGroup& group = layout.groups[static_cast<size_t>(chunk.group)];
    std::vector<float> full(group.num_floats), packed(dp * chunk.chunk_floats, -7.0f);
    for (size_t i = 0; i < full.size(); ++i) full[i] = seeded_value(3, chunk.group, i);
    {
      testing::DevVec<float> d_full(*ops, full), d_packed(*ops, packed);  // written back after
      pack_chunk(*ops, chunk, dp, d_full, d_packed);
    }
    // Rank r's segment holds rows [r*rpr, ...) of each tensor, then zero padding.
    for (int r = 0; r < dp; ++r) {
      for (const TensorShard& t : chunk.tensors) {
        const float* seg =
            packed.data() + r * chunk.chunk_floats + (t.shard_offset - chunk.shard_offset);
        for (size_t i = 0; i < t.split.padded_floats(); ++i) {
          const float want = i < t.split.owned_floats(r)
                                 ? full[t.full_offset + t.split.begin_float(r) + i]
                                 : 0.0f;
          EXPECT_EQ(seg[i], want) << "rank " << r << " param " << t.param << " i " << i;
        }
      }
    }
    std::vector<float> back(full.size(), 0.0f);
    unpack_chunk(*ops, chunk, dp, testing::dev(*ops, packed), testing::dev(*ops, back));
    for (const TensorShard& t : chunk.tensors)
      for (size_t i = 0; i < static_cast<size_t>(t.split.rows * t.split.row_elems); ++i)
        EXPECT_EQ(back[t.full_offset + i], full[t.full_offset + i]);
  }
}

TEST(ShardedStore, AcquireGathersAndReleaseAccumulatesMeanGradients) {
  Communicator& dp = device_world();
  const int n = dp.size(), rank = dp.rank();
  const ParamLayout layout = store_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ShardedParamStore store(layout, *ops, dp);
  const size_t F = sizeof(float);
  auto value = [](int k, size_t i) { return seeded_value(11, k, i); };
  auto grad = [](int micro, int r, int k, size_t i) {
    return seeded_value(20 + micro, r * 8 + k, i);
  };
  for (size_t k = 0; k < layout.params.size(); ++k) {
    std::vector<float> full(static_cast<size_t>(layout.params[k].numel()));
    for (size_t i = 0; i < full.size(); ++i) full[i] = value(static_cast<int>(k), i);
    store.load_param(static_cast<int>(k), full.data());
  }
  EXPECT_EQ(store.held_param_bytes() + store.held_grad_bytes(), 0u);
  dp.reset_traffic();

  for (int micro = 0; micro < 2; ++micro) {
    for (int g = 0; g < 3; ++g) {
      const ParamGroup& group = layout.groups[static_cast<size_t>(g)];
      store.acquire(g, Phase::kForward);
      // Nested: backward while the forward gather is still held gathers nothing new.
      store.acquire(g, Phase::kBackward);
      if (group.params.empty()) {
        store.release(g, Phase::kBackward);
        store.release(g, Phase::kForward);
        continue;
      }
      EXPECT_EQ(store.held_param_bytes(), group.num_floats * F);
      EXPECT_EQ(store.held_grad_bytes(), group.num_floats * F);
      std::vector<float> params(group.num_floats), grads(group.num_floats, 1.0f);
      ops->download(params.data(), store.params(g), params.size() * F);
      ops->download(grads.data(), store.grads(g), grads.size() * F);
      int wrong = 0;
      for (size_t i = 0; i < grads.size(); ++i) wrong += grads[i] != 0.0f;  // zeroed
      std::vector<bool> covered(group.num_floats, false);
      for (int k : group.params) {
        const ParamInfo& info = layout.params[static_cast<size_t>(k)];
        const size_t at = info.offset - group.offset;
        for (size_t i = 0; i < static_cast<size_t>(info.numel()); ++i) {
          wrong += params[at + i] != value(k, i);
          covered[at + i] = true;
          grads[at + i] = grad(micro, rank, k, i);
        }
      }
      for (size_t i = 0; i < params.size(); ++i) wrong += !covered[i] && params[i] != 0.0f;
      EXPECT_EQ(wrong, 0) << "group " << g;
      ops->upload(store.grads(g), grads.data(), grads.size() * F);
      store.release(g, Phase::kBackward);
      EXPECT_EQ(store.held_grad_bytes(), 0u);
      EXPECT_EQ(store.held_param_bytes(), group.num_floats * F);  // forward still holds it
      store.release(g, Phase::kForward);
      EXPECT_EQ(store.held_param_bytes(), 0u);
    }
  }
  const TrafficCounters traffic = dp.traffic();
  // Two non-empty groups, two micro-batches: one gather and one reduce-scatter each.
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), 4);
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kReduceScatter), 4);
  EXPECT_EQ(traffic.bytes_of(CollectiveKind::kReduceScatter),
            static_cast<int64_t>(2 * n * store.plan().shard_floats() * F));
  EXPECT_EQ(store.peak_held_bytes(), 2 * layout.groups[0].num_floats * F);
  EXPECT_EQ(store.peak_held_param_bytes(), layout.groups[0].num_floats * F);
  EXPECT_EQ(store.peak_held_grad_bytes(), layout.groups[0].num_floats * F);

  // The gradient shard: owned rows of the mean over ranks of both micro-batches; zero
  // padding.
  std::vector<float> shard(store.plan().shard_floats());
  ops->download(shard.data(), store.grad_shard(), shard.size() * F);
  int wrong = 0;
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const TensorShard& t = store.plan().tensor(static_cast<int>(k));
    for (size_t i = 0; i < t.split.padded_floats(); ++i) {
      double want = 0.0;
      if (i < t.split.owned_floats(rank)) {
        const size_t e = t.split.begin_float(rank) + i;
        for (int r = 0; r < n; ++r)
          for (int micro = 0; micro < 2; ++micro) want += grad(micro, r, static_cast<int>(k), e);
        want /= n;
      }
      wrong += std::fabs(shard[t.shard_offset + i] - want) > 1e-6 * (1.0 + std::fabs(want));
    }
  }
  EXPECT_EQ(wrong, 0);

  // gather_param reassembles every tensor from the shards.
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const std::vector<float> got = store.gather_param(static_cast<int>(k));
    ASSERT_EQ(got.size(), static_cast<size_t>(layout.params[k].numel()));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != value(static_cast<int>(k), i);
    EXPECT_EQ(bad, 0) << "param " << k;
  }
}

// ZeRO-2: parameters resident (forward acquires move nothing), gradients reduced per
// backward acquire/release pair into the shard. The access pattern is the tied head of a
// one-stage model: group 2 (head) and group 0 (wte) in backward together, then group 0
// again on its own; plus a truly nested acquire of group 0, which shares the buffer.
TEST(GradShardedStore, ReducesEachBackwardPairIntoTheShard) {
  Communicator& dp = device_world();
  const int n = dp.size(), rank = dp.rank();
  const ParamLayout layout = store_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  GradShardedParamStore store(layout, *ops, dp);
  const size_t F = sizeof(float);
  const ParamGroup& g0 = layout.groups[0];
  const ParamGroup& g2 = layout.groups[2];
  ASSERT_EQ(store.num_floats(), layout.total_floats());
  auto value = [](int k, size_t i) { return seeded_value(13, k, i); };
  // Contribution of (micro-batch, rank, parameter, element, pass): pass 1 is group 0's
  // second backward pair.
  auto grad = [](int micro, int r, int k, size_t i, int pass) {
    return seeded_value(40 + 2 * micro + pass, r * 8 + k, i);
  };
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& info = layout.params[k];
    std::vector<float> full(static_cast<size_t>(info.numel()));
    for (size_t i = 0; i < full.size(); ++i) full[i] = value(static_cast<int>(k), i);
    ops->upload(store.param_data() + info.offset, full.data(), full.size() * F);
  }
  // Adds this rank's contributions of `pass` to the group's held gradient buffer.
  auto add_grads = [&](int g, int micro, int pass) {
    const ParamGroup& group = layout.groups[static_cast<size_t>(g)];
    std::vector<float> buf(group.num_floats);
    ops->download(buf.data(), store.grads(g), buf.size() * F);
    for (int k : group.params) {
      const ParamInfo& info = layout.params[static_cast<size_t>(k)];
      for (size_t i = 0; i < static_cast<size_t>(info.numel()); ++i)
        buf[info.offset - group.offset + i] += grad(micro, rank, k, i, pass);
    }
    ops->upload(store.grads(g), buf.data(), buf.size() * F);
  };
  auto all_zero = [&](int g) {
    std::vector<float> buf(layout.groups[static_cast<size_t>(g)].num_floats, 1.0f);
    ops->download(buf.data(), store.grads(g), buf.size() * F);
    return std::all_of(buf.begin(), buf.end(), [](float x) { return x == 0.0f; });
  };
  dp.reset_traffic();
  for (int micro = 0; micro < 2; ++micro) {
    int wrong = 0;
    for (int g = 0; g < 3; ++g) {
      store.acquire(g, Phase::kForward);
      EXPECT_EQ(store.params(g), store.param_data() + layout.groups[static_cast<size_t>(g)].offset);
      for (int k : layout.groups[static_cast<size_t>(g)].params) {
        const ParamInfo& info = layout.params[static_cast<size_t>(k)];
        std::vector<float> got(static_cast<size_t>(info.numel()));
        ops->download(got.data(), store.params(g) + (info.offset - layout.groups[g].offset),
                      got.size() * F);
        for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != value(k, i);
      }
      store.release(g, Phase::kForward);
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(store.held_grad_bytes(), 0u);

    store.acquire(2, Phase::kBackward);
    store.acquire(0, Phase::kBackward);
    EXPECT_EQ(store.held_grad_bytes(), (g0.num_floats + g2.num_floats) * F);
    EXPECT_TRUE(all_zero(0));
    EXPECT_TRUE(all_zero(2));
    const DevPtr outer = store.grads(0);
    store.acquire(0, Phase::kBackward);  // nested: the same buffer, nothing new held
    EXPECT_EQ(store.grads(0), outer);
    EXPECT_EQ(store.held_grad_bytes(), (g0.num_floats + g2.num_floats) * F);
    add_grads(0, micro, 0);
    add_grads(2, micro, 0);
    const int64_t rs_before = dp.traffic().calls_of(CollectiveKind::kReduceScatter);
    store.release(0, Phase::kBackward);  // inner: still held, not reduced yet
    EXPECT_EQ(dp.traffic().calls_of(CollectiveKind::kReduceScatter), rs_before);
    EXPECT_EQ(store.grads(0), outer);
    store.release(0, Phase::kBackward);
    EXPECT_EQ(dp.traffic().calls_of(CollectiveKind::kReduceScatter), rs_before + 1);
    EXPECT_EQ(store.held_grad_bytes(), g2.num_floats * F);
    store.release(2, Phase::kBackward);
    store.acquire(1, Phase::kBackward);  // empty group: nothing held, nothing moved
    EXPECT_EQ(store.held_grad_bytes(), 0u);
    store.release(1, Phase::kBackward);
    // The embedding's own backward: a fresh zeroed buffer, reduced separately.
    store.acquire(0, Phase::kBackward);
    EXPECT_TRUE(all_zero(0));
    add_grads(0, micro, 1);
    store.release(0, Phase::kBackward);
    EXPECT_EQ(store.held_grad_bytes(), 0u);
  }
  const TrafficCounters traffic = dp.traffic();
  // Per micro-batch: group 0 reduced twice, group 2 once; parameters never gathered.
  size_t shard0 = 0;
  for (int c : store.plan().group_chunks(0)) shard0 += store.plan().chunks()[c].chunk_floats;
  const size_t shard2 = store.plan().shard_floats() - shard0;
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kReduceScatter), 2 * 3);
  EXPECT_EQ(traffic.bytes_of(CollectiveKind::kReduceScatter),
            static_cast<int64_t>(2 * n * (2 * shard0 + shard2) * F));
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), 0);
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllReduce), 0);
  EXPECT_EQ(store.peak_held_grad_bytes(), (g0.num_floats + g2.num_floats) * F);
  store.reset_peak();
  EXPECT_EQ(store.peak_held_grad_bytes(), 0u);

  // The shard: owned rows of the mean over ranks of every contribution; zero padding.
  std::vector<float> shard(store.plan().shard_floats());
  ops->download(shard.data(), store.grad_shard(), shard.size() * F);
  int wrong = 0;
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const TensorShard& t = store.plan().tensor(static_cast<int>(k));
    const int passes = layout.params[k].group == 0 ? 2 : 1;
    for (size_t i = 0; i < t.split.padded_floats(); ++i) {
      double want = 0.0;
      if (i < t.split.owned_floats(rank)) {
        const size_t e = t.split.begin_float(rank) + i;
        for (int r = 0; r < n; ++r)
          for (int micro = 0; micro < 2; ++micro)
            for (int pass = 0; pass < passes; ++pass)
              want += grad(micro, r, static_cast<int>(k), e, pass);
        want /= n;
      }
      wrong += std::fabs(shard[t.shard_offset + i] - want) > 1e-6 * (1.0 + std::fabs(want));
    }
  }
  EXPECT_EQ(wrong, 0);
}

// ZeRO-3 in bf16: the store keeps the f32 master shard and no bf16 shard (it allocates
// what the f32 store does but a bf16 pool: FSDP2's 16 bytes per parameter sharded, not
// 18); a gathered group is bf16(master) exactly (round to nearest even, alignment gaps
// zero), cast at the gather, also when prefetched; the all-gather moves half the bytes
// of the f32 store's; gather_param returns the f32 masters; and masters written
// directly (a checkpoint restore) are what the next gather rounds.
TEST(ShardedStore, Bf16GathersTheRoundedMastersAtHalfTheTraffic) {
  Communicator& dp = device_world();
  const ParamLayout layout = store_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  uint64_t live = ops->allocation_counts().live_bytes;
  ShardedParamStore f32(layout, *ops, dp);
  const uint64_t f32_bytes_held = ops->allocation_counts().live_bytes - live;
  live = ops->allocation_counts().live_bytes;
  ShardedParamStore bf16(layout, *ops, dp, DType::kBF16);
  const uint64_t bf16_bytes_held = ops->allocation_counts().live_bytes - live;
  EXPECT_EQ(f32.compute_dtype(), DType::kF32);
  EXPECT_EQ(bf16.compute_dtype(), DType::kBF16);
  const size_t held = max_held_group_floats(layout);
  EXPECT_EQ(bf16.param_pool_bytes(), held * 2);
  // Master and gradient shards (f32), the two pools, the scratch: no compute shard.
  EXPECT_EQ(bf16_bytes_held,
            2 * bf16.plan().shard_floats() * 4 + held * (2 + 4) + bf16.scratch_bytes());
  EXPECT_EQ(f32_bytes_held - bf16_bytes_held, held * 2);
  // The prefetch buffer: dp packed chunks and the prefetch's staged chunk (bf16).
  live = ops->allocation_counts().live_bytes;
  ShardedParamStore prefetched(layout, *ops, dp, DType::kBF16);
  prefetched.enable_prefetch();
  EXPECT_EQ(ops->allocation_counts().live_bytes - live,
            bf16_bytes_held + (dp.size() + 1) * prefetched.plan().max_chunk_floats() * 2);
  EXPECT_EQ(prefetched.prefetch_bytes(), (dp.size() + 1) * prefetched.plan().max_chunk_floats() * 2);
  // Values whose bf16 rounding is visible (not representable in 8 mantissa bits).
  auto value = [](int k, size_t i) { return 1.0f + seeded_value(17, k, i) / 3.0f; };
  for (size_t k = 0; k < layout.params.size(); ++k) {
    std::vector<float> full(static_cast<size_t>(layout.params[k].numel()));
    for (size_t i = 0; i < full.size(); ++i) full[i] = value(static_cast<int>(k), i);
    f32.load_param(static_cast<int>(k), full.data());
    bf16.load_param(static_cast<int>(k), full.data());
    prefetched.load_param(static_cast<int>(k), full.data());
  }
  auto gathered_wrong = [&](ShardedParamStore& store, float scale) {
    int wrong = 0, rounded = 0;
    for (int g = 0; g < 3; ++g) {
      const ParamGroup& group = layout.groups[static_cast<size_t>(g)];
      store.acquire(g, Phase::kForward);
      if (!group.params.empty()) {
        EXPECT_EQ(store.params(g).dtype(), DType::kBF16);
        std::vector<bf16_t> got(group.num_floats, 0xFFFF);
        ops->download(got.data(), store.params(g), got.size() * sizeof(bf16_t));
        std::vector<bool> covered(group.num_floats, false);
        for (int k : group.params) {
          const ParamInfo& info = layout.params[static_cast<size_t>(k)];
          const size_t at = info.offset - group.offset;
          for (size_t i = 0; i < static_cast<size_t>(info.numel()); ++i) {
            const float master = value(k, i) * scale;
            wrong += got[at + i] != float_to_bf16(master);
            rounded += bf16_to_float(got[at + i]) != master;
            covered[at + i] = true;
          }
        }
        for (size_t i = 0; i < got.size(); ++i) wrong += !covered[i] && got[i] != 0;
      }
      store.release(g, Phase::kForward);
    }
    EXPECT_GT(rounded, 0);  // not vacuous: bf16 really rounds these values
    return wrong;
  };
  dp.reset_traffic();
  for (int g = 0; g < 3; ++g) {
    f32.acquire(g, Phase::kForward);
    f32.release(g, Phase::kForward);
  }
  const int64_t f32_bytes = dp.traffic().bytes_of(CollectiveKind::kAllGather);
  dp.reset_traffic();
  EXPECT_EQ(gathered_wrong(bf16, 1.0f), 0);
  const TrafficCounters traffic = dp.traffic();
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), 2);  // two non-empty groups
  EXPECT_EQ(f32_bytes, static_cast<int64_t>(dp.size() * bf16.plan().shard_floats() * 4));
  EXPECT_EQ(2 * traffic.bytes_of(CollectiveKind::kAllGather), f32_bytes);

  // gather_param: the f32 masters, not their rounding.
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const std::vector<float> got = bf16.gather_param(static_cast<int>(k));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != value(static_cast<int>(k), i);
    EXPECT_EQ(bad, 0) << "param " << k;
  }

  // Masters written directly (as a checkpoint restore does): the next gather rounds them.
  std::vector<float> master(bf16.plan().shard_floats());
  ops->download(master.data(), bf16.param_shard(), master.size() * sizeof(float));
  for (float& x : master) x *= 3.0f;
  ops->upload(bf16.param_shard(), master.data(), master.size() * sizeof(float));
  EXPECT_EQ(gathered_wrong(bf16, 3.0f), 0);

  // Prefetched gathers (the second window follows the first's order): the prefetch casts
  // into its own staging, the same bits.
  for (int window = 0; window < 2; ++window) {
    dp.reset_traffic();
    prefetched.begin_step();
    EXPECT_EQ(gathered_wrong(prefetched, 1.0f), 0) << "window " << window;
    prefetched.end_step();
    if (dp.size() > 1) {  // the second window's second gather was prefetched
      EXPECT_EQ(dp.times().async_s > 0.0, window == 1) << "window " << window;
    }
  }
  EXPECT_EQ(prefetched.prefetch_misses(), 0);
}

// ZeRO-2 in bf16: parameters resident in bf16 (the flat layout's offsets, 2 bytes per
// element), gradients f32; nothing else allocated beyond the shard, the pool and the
// scratch.
TEST(GradShardedStore, Bf16ParametersResidentGradientsF32) {
  Communicator& dp = device_world();
  const ParamLayout layout = store_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const uint64_t live_before = ops->allocation_counts().live_bytes;
  GradShardedParamStore store(layout, *ops, dp, DType::kBF16);
  EXPECT_EQ(store.compute_dtype(), DType::kBF16);
  EXPECT_EQ(store.param_data().dtype(), DType::kBF16);
  EXPECT_EQ(ops->allocation_counts().live_bytes - live_before,
            layout.total_floats() * 2 + store.plan().shard_floats() * 4 +
                max_held_group_floats(layout) * 4 + store.scratch_bytes());
  EXPECT_EQ(store.grad_pool_bytes(), max_held_group_floats(layout) * 4);
  for (int g : {0, 2}) {
    const size_t off = layout.groups[static_cast<size_t>(g)].offset;
    EXPECT_EQ(store.params(g), store.param_data() + off);
    EXPECT_EQ(store.params(g).raw(), store.param_data().byte_offset(off * 2).raw());
    store.acquire(g, Phase::kBackward);
    EXPECT_EQ(store.grads(g).dtype(), DType::kF32);
    store.release(g, Phase::kBackward);
  }
}

}  // namespace
}  // namespace trident::test
