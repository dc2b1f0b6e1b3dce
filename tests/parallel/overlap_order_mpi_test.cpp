// The order of the overlapped gradient reductions (parallel.overlap_grad_reduce,
// parallel/data_parallel.h "Overlap"), seen by a recording dp communicator under the real
// model's backward: with ZeRO-0/1 every bucket is issued exactly once per step, during
// the last micro-batch's backward, right after its group's last release and in reverse
// layer order (none before the last micro-batch; none left for reduce_gradients); with
// ZeRO-2/3 each group's reduce-scatter is issued at each of its releases; ZeRO-3's
// prefetch issues the all-gather of layer g-1 before the reduce-scatter of layer g. The bytes the
// communicator counts equal the analytic volumes (ZeRO-1: one reduce-scatter of the padded
// shards, half an all-reduce), and with overlap off the same collectives are issued
// synchronously after backward instead.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "tests/model/tiny_config.h"
#include "parallel/sharded_param_store.h"
#include "tests/common/mpi_test_util.h"

namespace trident {
namespace {

constexpr size_t kF = sizeof(float);

// One event of the step: a collective issued on the dp communicator, or a backward
// release of a group by the model.
struct Event {
  enum Kind { kRelease, kAllReduce, kReduceScatter, kAllGather } kind;
  bool async = false;
  std::string label;  // the collective's label
  int group = -1;     // kRelease
};

// Forwards every call to `inner` and records it (the async ones through the inner
// communicator's own async calls, so they really overlap).
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, std::vector<Event>& log)
      : Communicator("dp", inner.space()), inner_(inner), log_(log) {}
  ~RecordingCommunicator() override { check_no_outstanding_work(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }

 protected:
  void do_all_reduce(const CommBuf& data, ReduceOp op, const CollectiveOptions& opts) override {
    log_.push_back({Event::kAllReduce, false, opts.label});
    inner_.all_reduce(data, op, opts);
  }
  void do_reduce_scatter(const CommBuf& in, const CommBuf& out,
                         const CollectiveOptions& opts) override {
    log_.push_back({Event::kReduceScatter, false, opts.label});
    inner_.reduce_scatter(in, out, opts);
  }
  void do_all_gather(const CommBuf& in, const CommBuf& out, const CollectiveOptions& opts) override {
    log_.push_back({Event::kAllGather, false, opts.label});
    inner_.all_gather(in, out, opts);
  }
  void do_broadcast(const CommBuf& data, int root, const CollectiveOptions& opts) override {
    inner_.broadcast(data, root, opts);
  }
  void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    inner_.send(data, dst, tag, opts);
  }
  void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions& opts) override {
    inner_.recv(data, src, tag, opts);
  }
  void do_barrier(const CollectiveOptions& opts) override { inner_.barrier(opts); }
  void do_all_to_all(const CommBuf& in, std::span<const std::size_t> send_counts,
                     const CommBuf& out, std::span<const std::size_t> recv_counts,
                     const CollectiveOptions& opts) override {
    inner_.all_to_all(in, send_counts, out, recv_counts, opts);
  }
  std::unique_ptr<Communicator> do_split(int, int, std::string, MemSpace,
                                         const CollectiveOptions&) override {
    TRIDENT_CHECK_MSG(false, "the recording communicator does not split");
    return nullptr;
  }
  std::unique_ptr<AsyncCollective> do_iall_reduce(const CommBuf& data, ReduceOp op,
                                                  const CollectiveOptions& opts) override {
    log_.push_back({Event::kAllReduce, true, opts.label});
    return std::make_unique<Forwarded>(inner_.iall_reduce(data, op, opts));
  }
  std::unique_ptr<AsyncCollective> do_ireduce_scatter(const CommBuf& in, const CommBuf& out,
                                                      const CollectiveOptions& opts) override {
    log_.push_back({Event::kReduceScatter, true, opts.label});
    return std::make_unique<Forwarded>(inner_.ireduce_scatter(in, out, opts));
  }
  std::unique_ptr<AsyncCollective> do_iall_gather(const CommBuf& in, const CommBuf& out,
                                                  const CollectiveOptions& opts) override {
    log_.push_back({Event::kAllGather, true, opts.label});
    return std::make_unique<Forwarded>(inner_.iall_gather(in, out, opts));
  }

 private:
  class Forwarded final : public AsyncCollective {
   public:
    explicit Forwarded(CommWork work) : work_(std::move(work)) {}
    bool test() override { return work_.test(); }
    void wait() override { work_.wait(); }

   private:
    CommWork work_;
  };
  Communicator& inner_;
  std::vector<Event>& log_;
};

// The store the model sees: DataParallel's, with each backward release logged.
class LoggingStore final : public ParamStore {
 public:
  LoggingStore(ParamStore& inner, std::vector<Event>& log) : inner_(inner), log_(log) {}
  void acquire(int g, Phase p) override { inner_.acquire(g, p); }
  void release(int g, Phase p) override {
    // Logged first: the release is what issues the group's reductions.
    if (p == Phase::kBackward) log_.push_back({Event::kRelease, false, "", g});
    inner_.release(g, p);
  }
  DevPtr params(int g) override { return inner_.params(g); }
  DevPtr grads(int g) override { return inner_.grads(g); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }

 private:
  ParamStore& inner_;
  std::vector<Event>& log_;
};

// 3 layers, d_model 32, 4 heads, vocabulary 64, seq_len 16.
TransformerConfig tiny_model(Arch arch, int kv_heads) {
  return testing::tiny_model(arch, {.vocab_size = 64, .seq_len = 16, .n_layers = 3,
                                    .n_kv_heads = kv_heads, .d_model = 32});
}

int trailing_int(const std::string& label) {
  return std::stoi(label.substr(label.find_last_of(' ') + 1));
}

TEST(OverlapOrder, BucketsFollowBackwardInReverseLayerOrder) {
  Communicator& world = test::device_world();
  const int n = world.size();
  if (n < 2) GTEST_SKIP() << "needs dp > 1";
  const TransformerConfig mc = tiny_model(Arch::kGpt2, 4);
  const ModelPartition part;  // one stage, no tp: the tied head writes group 0's wte too
  const ParamLayout layout = describe_params(mc, part);
  const int groups = static_cast<int>(layout.groups.size());
  constexpr int kMicro = 2, B = 1;
  // 16 KiB buckets: the embedding group (wte 64 x 32, wpe 16 x 32 floats) splits in two.
  constexpr size_t kBucketBytes = 16 << 10;
  const ShardPlan buckets(layout, n, std::vector<size_t>(layout.groups.size(), 0),
                          kBucketBytes / kF);
  ASSERT_GT(buckets.group_chunks(0).size(), 1u);
  std::vector<int32_t> tokens(static_cast<size_t>(B * mc.seq_len)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + world.rank()) % 61);
    targets[i] = static_cast<int32_t>((i * 5 + 3) % 61);
  }

  for (int zero = 0; zero <= 3; ++zero) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE("zero " + std::to_string(zero) + (overlap ? " overlap" : " sync"));
      std::vector<Event> log;
      RecordingCommunicator dp(world, log);
      const std::unique_ptr<Ops> ops = make_cpu_ops(1);
      DataParallel ddp(layout, *ops, dp, zero, kBucketBytes, AdamWParams{}, DType::kF32,
                       {.grad_reduce = overlap, .param_gather = overlap, .micro_batches = kMicro});
      for (size_t i = 0; i < layout.params.size(); ++i) {
        ddp.load_param(static_cast<int>(i), Transformer::initial_value(mc, layout.params[i], 5));
      }
      LoggingStore store(ddp.store(), log);
      Transformer model(mc, *ops, part, nullptr, &store, B, 1);
      // Two steps (ZeRO-3 learns its gather order in the first); the second is checked.
      std::vector<size_t> backward_end;  // log size when each micro-batch's backward returned
      TrafficCounters traffic;
      for (int step = 0; step < 2; ++step) {
        if (step > 0) ddp.step(1e-3f);
        ddp.zero_grad();
        log.clear();
        dp.reset_traffic();
        backward_end.clear();
        for (int m = 0; m < kMicro; ++m) {
          model.forward_stage(0, tokens.data(), targets.data(), B, mc.seq_len);
          model.backward_stage(0, 1.0f / kMicro);
          backward_end.push_back(log.size());
        }
        ddp.reduce_gradients();
        traffic = dp.traffic();
      }

      // The releases the model made, per micro-batch: the head (and group 0 for its tied
      // wte), then the layers in reverse, then the embedding.
      std::vector<int> releases;
      for (size_t i = backward_end[0]; i < backward_end[1]; ++i) {
        if (log[i].kind == Event::kRelease) releases.push_back(log[i].group);
      }
      std::vector<int> want_releases = {0, groups - 1};
      for (int g = groups - 2; g >= 0; --g) want_releases.push_back(g);
      EXPECT_EQ(releases, want_releases);

      std::vector<Event> calls;  // the collectives, in issue order
      for (const Event& e : log) {
        if (e.kind != Event::kRelease) calls.push_back(e);
      }
      if (zero <= 1) {
        const Event::Kind kind = zero == 0 ? Event::kAllReduce : Event::kReduceScatter;
        const size_t nb = buckets.chunks().size();
        // Exactly one collective per bucket, of the stage's kind.
        ASSERT_EQ(calls.size(), nb);
        std::vector<int> seen(nb, 0);
        for (const Event& e : calls) {
          EXPECT_EQ(e.kind, kind);
          EXPECT_EQ(e.async, overlap);
          ++seen[static_cast<size_t>(trailing_int(e.label))];
        }
        EXPECT_EQ(seen, std::vector<int>(nb, 1));
        if (overlap) {
          // None before the last micro-batch's backward; all of them during it.
          for (size_t i = 0; i < backward_end[0]; ++i) EXPECT_EQ(log[i].kind, Event::kRelease);
          for (size_t i = backward_end[1]; i < log.size(); ++i) {
            ADD_FAILURE() << "collective '" << log[i].label << "' issued after backward";
          }
          // Each group's buckets right after its last release (group 0: its second), so
          // in reverse layer order: the head, the layers from the last, the embedding.
          int last_release = -1, releases_of_0 = 0;
          std::vector<int> order;
          for (size_t i = backward_end[0]; i < backward_end[1]; ++i) {
            const Event& e = log[i];
            if (e.kind == Event::kRelease) {
              last_release = e.group;
              if (e.group == 0) ++releases_of_0;
              continue;
            }
            const int g = buckets.chunks()[static_cast<size_t>(trailing_int(e.label))].group;
            EXPECT_EQ(g, last_release) << e.label;
            if (g == 0) {
              EXPECT_EQ(releases_of_0, 2) << e.label;
            }
            if (order.empty() || order.back() != g) order.push_back(g);
          }
          std::vector<int> want_order;
          for (int g = groups - 1; g >= 0; --g) want_order.push_back(g);
          EXPECT_EQ(order, want_order);
        } else {
          for (size_t i = 0; i < backward_end[1]; ++i) EXPECT_EQ(log[i].kind, Event::kRelease);
        }
        // Bytes: stage 0 all-reduces the whole flat buffer, stage 1 reduce-scatters the
        // padded shards of every rank (half an all-reduce's wire bytes).
        if (zero == 0) {
          EXPECT_EQ(traffic.bytes_of(CollectiveKind::kAllReduce),
                    static_cast<int64_t>(layout.total_floats() * kF));
        } else {
          EXPECT_EQ(traffic.bytes_of(CollectiveKind::kReduceScatter),
                    static_cast<int64_t>(n * buckets.shard_floats() * kF));
        }
      } else {
        // ZeRO-2/3: one reduce-scatter per release of a group, right after it (the
        // ZeRO-3 all-gathers of the acquires sit in between, synchronous).
        size_t rs = 0;
        for (size_t i = 0; i < log.size(); ++i) {
          if (log[i].kind != Event::kReduceScatter) continue;
          ++rs;
          EXPECT_EQ(log[i].async, overlap);
          ASSERT_GT(i, 0u);
          ASSERT_EQ(log[i - 1].kind, Event::kRelease) << log[i].label;
          EXPECT_EQ(trailing_int(log[i].label), log[i - 1].group) << log[i].label;
        }
        EXPECT_EQ(rs, static_cast<size_t>(kMicro * (groups + 1)));
        // ZeRO-3: the all-gathers. Step 1 learns the order of the gathers (all
        // synchronous); from step 2 each gather issues the next one asynchronously, so
        // in backward the all-gather of layer g-1 is issued before the reduce-scatter of
        // layer g. ZeRO-2 gathers nothing in the step.
        int gathers = 0, prefetched = 0;
        for (size_t i = 0; i < log.size(); ++i) {
          const Event& e = log[i];
          if (e.kind != Event::kAllGather) continue;
          ++gathers;
          if (e.async) {
            ++prefetched;
            EXPECT_EQ(e.label.rfind("zero3 prefetch group ", 0), 0u) << e.label;
          }
        }
        EXPECT_EQ(gathers > 0, zero == 3);
        EXPECT_EQ(prefetched > 0, zero == 3 && overlap);
        if (zero == 3 && overlap) {
          EXPECT_EQ(ddp.sharded()->prefetch_misses(), 0);
          int checked = 0;
          for (size_t i = 0; i < log.size(); ++i) {
            const Event& e = log[i];
            if (e.kind != Event::kReduceScatter) continue;
            const int g = trailing_int(e.label);
            if (g < 1 || g > groups - 2) continue;  // the layers
            size_t j = i;
            while (j > 0 && log[j - 1].kind != Event::kAllGather) --j;
            ASSERT_GT(j, 0u) << e.label;
            EXPECT_EQ(log[j - 1].label, "zero3 prefetch group " + std::to_string(g - 1))
                << "the all-gather issued last before '" << e.label << "'";
            ++checked;
          }
          EXPECT_EQ(checked, kMicro * (groups - 2));
        }
      }
    }
  }
}

// ZeRO-3's prefetch when the acquires depart from the learned order: the pending
// prefetch is waited for and discarded (a miss), the group asked for is gathered
// synchronously, every gathered group holds its true values, and the next window
// follows the learned order again.
TEST(OverlapOrder, Zero3PrefetchSurvivesADepartureFromTheLearnedOrder) {
  Communicator& world = test::device_world();
  if (world.size() < 2) GTEST_SKIP() << "needs dp > 1";
  const TransformerConfig mc = tiny_model(Arch::kLlama, 2);  // untied: no group held twice
  const ParamLayout layout = describe_params(mc, ModelPartition{});
  const std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ShardedParamStore store(layout, *ops, world);
  world.reset_traffic();
  store.enable_prefetch();
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    values.push_back(Transformer::initial_value(mc, layout.params[i], 11));
    store.load_param(static_cast<int>(i), values.back().data());
  }
  int wrong = 0;
  auto visit = [&](int g) {
    store.acquire(g, Phase::kForward);
    const ParamGroup& group = layout.groups[static_cast<size_t>(g)];
    for (int k : group.params) {
      const ParamInfo& info = layout.params[static_cast<size_t>(k)];
      std::vector<float> got(static_cast<size_t>(info.numel()));
      ops->download(got.data(), store.params(g) + (info.offset - group.offset),
                    got.size() * kF);
      wrong += got != values[static_cast<size_t>(k)];
    }
    store.release(g, Phase::kForward);
  };
  const int groups = static_cast<int>(layout.groups.size());
  auto window = [&](const std::vector<int>& order) {
    store.begin_step();
    for (int g : order) visit(g);
    store.end_step();
  };
  std::vector<int> forward;
  for (int g = 0; g < groups; ++g) forward.push_back(g);
  window(forward);  // learned: synchronous gathers only
  EXPECT_EQ(world.times().async_s, 0.0);
  world.reset_traffic();
  window(forward);  // followed: every gather but the first was prefetched
  EXPECT_GT(world.times().async_s, 0.0);
  EXPECT_EQ(store.prefetch_misses(), 0);
  std::vector<int> skip_one = {0, 2, 1};  // group 1 was prefetched after 0: discarded
  for (int g = 3; g < groups; ++g) skip_one.push_back(g);
  window(skip_one);
  EXPECT_EQ(store.prefetch_misses(), 1);
  window(forward);  // the learned order again: prefetched without a miss
  EXPECT_EQ(store.prefetch_misses(), 1);
  EXPECT_EQ(wrong, 0) << "a gathered group held wrong values";
}

}  // namespace
}  // namespace trident
