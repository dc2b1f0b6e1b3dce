// ZeRO stages 0-3 against a single-process reference: a synthetic layout of odd-shaped
// tensors (some with fewer rows than dp ranks, so some shards are empty) over two
// non-empty groups between empty ones (other pipeline stages). Every rank feeds its own
// seeded gradients for two micro-batches; the reference computes, in double, the mean
// over all ranks and plain AdamW. After each of 3 steps the parameters on every rank
// must match it, the owned gradient square sums must add up to the full one over dp,
// memory (now and peak, at rest and with a group in backward) must follow the per-stage
// formulas — stages 2-3 hold gradients as a 1/dp shard plus one group in flight — and
// the dp traffic counters must equal the analytic volumes. The dp group is the world,
// so this runs at every -np.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/common/mpi_test_util.h"
#include "parallel/data_parallel.h"
#include "tests/common/param_layout.h"

namespace trident::test {
namespace {

// Groups 0 and 3 are empty; tensors at 16-float aligned offsets of the flat layout.
ParamLayout make_layout() {
  return testing::make_test_layout({{"a", {7, 5}, 1, true, 0},
                                    {"b", {13}, 1, false, -1},
                                    {"c", {3, 4}, 1, true, 1},
                                    {"d", {1, 9}, 2, true, 0},
                                    {"e", {2, 3, 2}, 2, true, 0},
                                    {"f", {5, 2}, 2, true, 0, /*tied_copy=*/true},
                                    {"g", {4}, 2, false, -1}},
                                   4);
}

constexpr int kSteps = 3;
constexpr int kMicroBatches = 2;
constexpr float kLr = 1e-2f;

float init_value(int param, size_t i) { return seeded_value(7, 1000 + param, i); }
float grad_value(int step, int micro, int rank, int param, size_t i) {
  return seeded_value(100 + 10 * step + micro, rank * 64 + param, i);
}

// Plain AdamW in double on the full tensors, fed the mean gradient over all ranks.
struct Reference {
  std::vector<std::vector<double>> p, m, v;
  explicit Reference(const ParamLayout& layout) {
    for (size_t k = 0; k < layout.params.size(); ++k) {
      const size_t n = static_cast<size_t>(layout.params[k].numel());
      std::vector<double> init(n);
      for (size_t i = 0; i < n; ++i) init[i] = init_value(static_cast<int>(k), i);
      p.push_back(init);
      m.emplace_back(n, 0.0);
      v.emplace_back(n, 0.0);
    }
  }
  static double mean_grad(int step, int param, size_t i, int dp) {
    double g = 0.0;
    for (int r = 0; r < dp; ++r)
      for (int k = 0; k < kMicroBatches; ++k) g += grad_value(step, k, r, param, i);
    return g / dp;
  }
  // Sum of squared mean gradients over non-tied tensors (and tp-split only if asked).
  static double square_sum(const ParamLayout& layout, int step, int dp, bool tp_replicated) {
    double s = 0.0;
    for (size_t k = 0; k < layout.params.size(); ++k) {
      const ParamInfo& info = layout.params[k];
      if (info.tied_copy || (info.tp_replicated() && !tp_replicated)) continue;
      for (size_t i = 0; i < static_cast<size_t>(info.numel()); ++i) {
        const double g = mean_grad(step, static_cast<int>(k), i, dp);
        s += g * g;
      }
    }
    return s;
  }
  void step(const ParamLayout& layout, const AdamWParams& cfg, int step, int dp, double clip) {
    const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), step);
    for (size_t k = 0; k < layout.params.size(); ++k) {
      const double wd = layout.params[k].decay ? cfg.weight_decay : 0.0;
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double g = clip * mean_grad(step, static_cast<int>(k), i, dp);
        m[k][i] = cfg.beta1 * m[k][i] + (1.0 - cfg.beta1) * g;
        v[k][i] = cfg.beta2 * v[k][i] + (1.0 - cfg.beta2) * g * g;
        const double mhat = m[k][i] / bc1, vhat = v[k][i] / bc2;
        p[k][i] -= kLr * (mhat / (std::sqrt(vhat) + cfg.eps) + wd * p[k][i]);
      }
    }
  }
};

// Padded shard floats per rank, summed over tensors, from the shapes alone.
size_t padded_shard_floats(const ParamLayout& layout, int dp) {
  size_t s = 0;
  for (const ParamInfo& info : layout.params) {
    const int64_t rows = info.local_shape.rank() == 0 ? 1 : info.local_shape[0];
    const int64_t row_elems = rows == 0 ? 0 : info.numel() / rows;
    s += static_cast<size_t>((rows + dp - 1) / dp * row_elems);
  }
  return s;
}

int mismatches(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  int wrong = got.size() != want.size() ? 1 : 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    wrong += std::fabs(got[i] - want[i]) > rel * std::max(1.0, std::fabs(want[i]));
  return wrong;
}

struct Case {
  int stage;
  size_t bucket_bytes;
  size_t expected_buckets;  // stages 0-2: 7 tensors in 2 groups
};

void run_case(const Case& c) {
  SCOPED_TRACE("zero_stage " + std::to_string(c.stage) + ", bucket_bytes " +
               std::to_string(c.bucket_bytes));
  Communicator& dp = device_world();
  const int n = dp.size();
  const int rank = dp.rank();
  const ParamLayout layout = make_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  AdamWParams cfg;
  cfg.weight_decay = 0.1f;
  DataParallel ddp(layout, *ops, dp, c.stage, c.bucket_bytes, cfg);
  Reference ref(layout);
  for (size_t k = 0; k < layout.params.size(); ++k) {
    std::vector<float> init(ref.p[k].begin(), ref.p[k].end());
    ddp.load_param(static_cast<int>(k), init);
  }

  const size_t total = layout.total_floats();
  const size_t shard = padded_shard_floats(layout, n);
  size_t numel = 0, row_elems = 0, max_group = 0;
  for (const ParamInfo& info : layout.params) {
    numel += static_cast<size_t>(info.numel());
    row_elems += static_cast<size_t>(info.numel() / info.local_shape[0]);
  }
  for (const ParamGroup& g : layout.groups) max_group = std::max(max_group, g.num_floats);
  // The padded shard is the 1/dp share up to less than one row per tensor.
  EXPECT_GE(shard * n, numel);
  EXPECT_LE(shard, numel / n + row_elems);
  if (c.stage < 3) {
    EXPECT_EQ(ddp.num_buckets(), c.expected_buckets);
  }

  // Memory, from the formulas of parallel/data_parallel.h: everything is allocated at
  // construction, the ZeRO-2/3 pools sized for one group (this layout's last group is
  // empty: no head reads group 0), so the figures never change below.
  const size_t F = sizeof(float);
  const bool grads_sharded = c.stage >= 2;
  EXPECT_EQ(max_held_group_floats(layout), max_group);
  DataParallel::Memory mem = ddp.memory();
  EXPECT_EQ(mem.params, (c.stage == 3 ? shard + max_group : total) * F);
  EXPECT_EQ(mem.master, 0u);  // f32: the parameters are the masters
  // Stage 1: the full gradients backward accumulates into, and the reduced shard.
  EXPECT_EQ(mem.grads,
            (grads_sharded ? shard + max_group : total + (c.stage == 1 ? shard : 0)) * F);
  EXPECT_EQ(mem.params_peak, mem.params);
  EXPECT_EQ(mem.grads_peak, mem.grads);
  EXPECT_EQ(mem.optimizer, 2 * (c.stage == 0 ? total : shard) * F);
  // The largest group's padded shard: a ZeRO-2/3 store moves a group in one chunk.
  size_t max_chunk = 0;
  for (const ParamGroup& g : layout.groups) {
    size_t chunk = 0;
    for (int k : g.params) {
      chunk += row_split(layout.params[static_cast<size_t>(k)].local_shape, n).padded_floats();
    }
    max_chunk = std::max(max_chunk, chunk);
  }
  // Stages 2-3: the store's collective scratch, (dp + 1) group chunks of f32.
  if (c.stage == 2) {
    EXPECT_EQ(ddp.grad_sharded()->scratch_bytes(), (n + 1) * max_chunk * F);
  }
  if (c.stage == 3) {
    EXPECT_EQ(mem.comm_scratch, (n + 1) * max_chunk * F);
  }
  const auto held_params = [&] { return c.stage == 3 ? ddp.sharded()->held_param_bytes() : 0; };
  const auto held_grads = [&] {
    return c.stage == 3 ? ddp.sharded()->held_grad_bytes()
                        : c.stage == 2 ? ddp.grad_sharded()->held_grad_bytes() : 0;
  };
  const auto peak_held_grads = [&] {
    return c.stage == 3 ? ddp.sharded()->peak_held_grad_bytes()
                        : c.stage == 2 ? ddp.grad_sharded()->peak_held_grad_bytes() : 0;
  };

  ParamStore& store = ddp.store();
  for (int step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ddp.zero_grad();
    dp.reset_traffic();
    int param_wrong = 0;
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      for (size_t g = 0; g < layout.groups.size(); ++g) {
        const ParamGroup& group = layout.groups[g];
        const int gi = static_cast<int>(g);
        store.acquire(gi, Phase::kForward);
        // The acquired group holds the current parameters (the previous step's result).
        for (int k : group.params) {
          const ParamInfo& info = layout.params[static_cast<size_t>(k)];
          std::vector<float> got(static_cast<size_t>(info.numel()));
          ops->download(got.data(), store.params(gi) + (info.offset - group.offset),
                        got.size() * F);
          param_wrong += mismatches(got, ref.p[static_cast<size_t>(k)], 1e-6);
        }
        store.release(gi, Phase::kForward);
        store.acquire(gi, Phase::kBackward);
        if (grads_sharded && !group.params.empty()) {
          // One group's full gradient in flight, from the pool: nothing allocated.
          EXPECT_EQ(held_params(), c.stage == 3 ? group.num_floats * F : 0);
          EXPECT_EQ(held_grads(), group.num_floats * F);
          EXPECT_EQ(ddp.memory().params, mem.params);
          EXPECT_EQ(ddp.memory().grads, mem.grads);
        }
        for (int k : group.params) {
          const ParamInfo& info = layout.params[static_cast<size_t>(k)];
          const DevPtr dst = store.grads(gi) + (info.offset - group.offset);
          std::vector<float> acc(static_cast<size_t>(info.numel()));
          ops->download(acc.data(), dst, acc.size() * F);
          for (size_t i = 0; i < acc.size(); ++i) acc[i] += grad_value(step, micro, rank, k, i);
          ops->upload(dst, acc.data(), acc.size() * F);
        }
        store.release(gi, Phase::kBackward);
      }
    }
    EXPECT_EQ(param_wrong, 0);
    ddp.reduce_gradients();
    const double owned_all = ddp.owned_grad_square_sum(true);
    const double owned_split = ddp.owned_grad_square_sum(false);
    const double clip = step == 2 ? 0.5 : 1.0;
    if (step == 2) ddp.scale_gradients(static_cast<float>(clip));
    ddp.step(kLr);
    const TrafficCounters traffic = dp.traffic();  // before the checks' own collectives

    // Analytic dp volumes of one step.
    const int64_t ar = traffic.bytes_of(CollectiveKind::kAllReduce);
    const int64_t rs = traffic.bytes_of(CollectiveKind::kReduceScatter);
    const int64_t ag = traffic.bytes_of(CollectiveKind::kAllGather);
    const int64_t sharded = static_cast<int64_t>(n * shard * F);
    const int64_t buckets = static_cast<int64_t>(ddp.num_buckets());
    switch (c.stage) {
      case 0:
        EXPECT_EQ(ar, static_cast<int64_t>(total * F));
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllReduce), buckets);
        EXPECT_EQ(rs, 0);
        EXPECT_EQ(ag, 0);
        break;
      case 1:
        // One reduce-scatter of the gradients and one all-gather of the parameters per
        // bucket: half the bytes of stage 0's all-reduce each.
        EXPECT_EQ(ar, 0);
        EXPECT_EQ(rs, sharded);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kReduceScatter), buckets);
        EXPECT_EQ(ag, sharded);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), buckets);
        break;
      case 2:
        // Per micro-batch one reduce-scatter per non-empty group (during backward); per
        // step one bucketed all-gather of the parameters.
        EXPECT_EQ(ar, 0);
        EXPECT_EQ(rs, kMicroBatches * sharded);
        EXPECT_EQ(ag, sharded);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kReduceScatter), kMicroBatches * 2);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), buckets);
        EXPECT_EQ(held_grads(), 0u);  // every group released
        break;
      case 3:
        EXPECT_EQ(ar, 0);
        EXPECT_EQ(ag, 2 * kMicroBatches * sharded);  // forward + backward gathers
        EXPECT_EQ(rs, kMicroBatches * sharded);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllGather), 2 * kMicroBatches * 2);
        EXPECT_EQ(traffic.calls_of(CollectiveKind::kReduceScatter), kMicroBatches * 2);
        EXPECT_EQ(ddp.sharded()->peak_held_bytes(), 2 * max_group * F);
        EXPECT_EQ(held_params(), 0u);  // everything released
        EXPECT_EQ(ddp.sharded()->peak_held_param_bytes(), max_group * F);
        EXPECT_EQ(ddp.memory().params, mem.params);
        break;
    }
    if (grads_sharded) {
      // Gradient memory is divided by dp up to padding (< one row per tensor) and one
      // group's full gradient in flight, which the pool held at its peak.
      const DataParallel::Memory m = ddp.memory();
      EXPECT_EQ(m.grads_peak, (shard + max_group) * F);
      EXPECT_LE(m.grads_peak, (numel / n + row_elems + max_group) * F);
      EXPECT_EQ(peak_held_grads(), max_group * F);
      ddp.reset_memory_peak();
      EXPECT_EQ(peak_held_grads(), 0u);
      EXPECT_EQ(ddp.memory().grads, mem.grads);
    }

    // Every element counted once over dp.
    std::vector<double> sums = {owned_all, owned_split};
    world().all_reduce(CommBuf::host(std::span<double>(sums)), ReduceOp::kSum);  // host values
    const double want_all = Reference::square_sum(layout, step, n, true);
    const double want_split = Reference::square_sum(layout, step, n, false);
    EXPECT_NEAR(sums[0], want_all, 1e-5 * want_all);
    EXPECT_NEAR(sums[1], want_split, 1e-5 * want_split);
    EXPECT_LT(want_split, want_all);  // the filter matters in this layout

    ref.step(layout, cfg, step, n, clip);
    int wrong = 0, differs_from_rank0 = 0;
    for (size_t k = 0; k < layout.params.size(); ++k) {
      std::vector<float> got = ddp.gather_param(static_cast<int>(k));
      wrong += mismatches(got, ref.p[k], 1e-6);
      // Replicas agree bitwise.
      std::vector<float> rank0 = got;
      // host values
      world().broadcast(CommBuf::host(std::as_writable_bytes(std::span<float>(rank0))), 0);
      for (size_t i = 0; i < got.size(); ++i) differs_from_rank0 += got[i] != rank0[i];
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(differs_from_rank0, 0);

    // The optimizer state this rank keeps (stage 0: all rows) matches the reference.
    int state_wrong = 0;
    int64_t rows_kept = 0;
    for (size_t k = 0; k < layout.params.size(); ++k) {
      const DataParallel::OwnedState st = ddp.owned_state(static_cast<int>(k));
      const RowSplit split = ddp.shard_rows(static_cast<int>(k));
      rows_kept += st.row_end - st.row_begin;
      if (c.stage == 0) {
        state_wrong += st.row_begin != 0 || st.row_end != split.rows;
      } else {
        state_wrong += st.row_begin != split.row_begin(rank) || st.row_end != split.row_end(rank);
      }
      const size_t first = static_cast<size_t>(st.row_begin * split.row_elems);
      auto slice = [&](const std::vector<double>& full) {
        return std::vector<double>(full.begin() + first, full.begin() + first + st.floats);
      };
      std::vector<float> buf(st.floats);
      ops->download(buf.data(), st.param, st.floats * F);
      state_wrong += mismatches(buf, slice(ref.p[k]), 1e-6);
      ops->download(buf.data(), st.exp_avg, st.floats * F);
      state_wrong += mismatches(buf, slice(ref.m[k]), 1e-6);
      ops->download(buf.data(), st.exp_avg_sq, st.floats * F);
      state_wrong += mismatches(buf, slice(ref.v[k]), 1e-6);
      // The reduced gradient this rank holds: (clipped) mean over ranks.
      const DataParallel::GradSlice rg = ddp.reduced_grad(static_cast<int>(k));
      const size_t rg_first = c.stage == 0 ? 0 : split.begin_float(rank);
      state_wrong += rg.floats != (c.stage == 0 ? static_cast<size_t>(layout.params[k].numel())
                                                : split.owned_floats(rank));
      std::vector<float> g(rg.floats);
      ops->download(g.data(), rg.data, g.size() * F);
      std::vector<double> want(g.size());
      for (size_t i = 0; i < g.size(); ++i)
        want[i] = clip * Reference::mean_grad(step, static_cast<int>(k), rg_first + i, n);
      state_wrong += mismatches(g, want, 1e-6);
    }
    EXPECT_EQ(state_wrong, 0);
    int64_t rows_total = 0;
    for (const ParamInfo& info : layout.params) rows_total += info.local_shape[0];
    std::vector<int64_t> kept = {rows_kept};
    world().all_reduce(CommBuf::host(std::span<int64_t>(kept)), ReduceOp::kSum);  // host values
    EXPECT_EQ(kept[0], c.stage == 0 ? n * rows_total : rows_total);  // shards tile the rows
  }
}

TEST(DataParallel, Stage0MatchesSingleProcess) {
  run_case({0, 4, 7});           // one tensor per bucket
  run_case({0, 160, 3});         // [a] [b c] | [d e f g]
  run_case({0, 1 << 20, 2});     // one bucket per group
}

TEST(DataParallel, Stage1MatchesSingleProcess) {
  run_case({1, 4, 7});
  run_case({1, 160, 3});
  run_case({1, 1 << 20, 2});
}

TEST(DataParallel, Stage2MatchesSingleProcess) {
  run_case({2, 4, 7});
  run_case({2, 160, 3});
  run_case({2, 1 << 20, 2});
}

TEST(DataParallel, Stage3MatchesSingleProcess) { run_case({3, 1 << 20, 2}); }

TEST(DataParallel, ShardRowsFollowTheCeilSplit) {
  Communicator& dp = device_world();
  const ParamLayout layout = make_layout();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  DataParallel ddp(layout, *ops, dp, 1, 1 << 20, AdamWParams{});
  const int n = dp.size();
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const RowSplit s = ddp.shard_rows(static_cast<int>(k));
    const int64_t rows = layout.params[k].local_shape[0];
    EXPECT_EQ(s.rows, rows);
    EXPECT_EQ(s.rows_per_rank, (rows + n - 1) / n);
    EXPECT_EQ(s.row_begin(dp.rank()), std::min(rows, dp.rank() * s.rows_per_rank));
  }
}

}  // namespace
}  // namespace trident::test
