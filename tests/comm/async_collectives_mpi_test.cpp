// The asynchronous collectives (comm/communicator.h "Asynchronous collectives"): on the
// MPI world (every np) and the self communicator, an async call's result is bitwise equal
// to the synchronous call's and counts the same traffic; several may be outstanding,
// mixed with synchronous calls; test() completes; device buffers under a protecting hook
// (the checked backend's behaviour) are staged; a blocking wait is reported to the
// watchdog; misuse CHECK-fails. ibatch_p2p (the async batched point-to-point) receives
// what batch_p2p does, stages protected device memory and is watched the same way. AsyncOverlap prints how much of a collective a busy
// compute loop hides (timings are printed, not asserted).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/watchdog.h"
#include "core/device_access.h"
#include "tests/common/mpi_test_util.h"
#include "tests/common/fake_communicator.h"
#include "tests/common/protected_device_memory.h"

namespace trident::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<float> seeded_f32(int rank, std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = seeded_value(seed, rank, i);
  return v;
}
std::vector<bf16_t> seeded_bf16(int rank, std::size_t n, std::uint64_t seed) {
  std::vector<bf16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float_to_bf16(seeded_value(seed, rank, i));
  return v;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
CommBuf buf(Communicator& comm, std::vector<T>& v) {
  return CommBuf(v.data(), v.size(), dtype_of<T>(), comm.space());
}

// Sync vs async of all three collectives on `comm` for one dtype and size: bitwise equal
// results and equal traffic counters.
template <class T>
void expect_async_equals_sync(Communicator& comm, std::size_t chunk, std::uint64_t seed,
                              std::vector<T> (*make)(int, std::size_t, std::uint64_t)) {
  const int p = comm.size();
  const std::vector<T> input = make(comm.rank(), chunk * p, seed);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    std::vector<T> sync = input, async = input;
    comm.reset_traffic();
    comm.all_reduce(buf(comm, sync), op, {.label = "sync"});
    const TrafficCounters sync_traffic = comm.traffic();
    comm.reset_traffic();
    CommWork work = comm.iall_reduce(buf(comm, async), op, {.label = "async"});
    work.wait();
    EXPECT_TRUE(work.finished());
    EXPECT_TRUE(bitwise_equal(sync, async)) << "all_reduce chunk " << chunk;
    EXPECT_EQ(comm.traffic().bytes, sync_traffic.bytes);
    EXPECT_EQ(comm.traffic().calls, sync_traffic.calls);
  }
  {
    std::vector<T> in = input, sync(chunk), async(chunk);
    comm.reset_traffic();
    comm.reduce_scatter(buf(comm, in), buf(comm, sync));
    const TrafficCounters sync_traffic = comm.traffic();
    comm.reset_traffic();
    CommWork work = comm.ireduce_scatter(buf(comm, in), buf(comm, async));
    work.wait();
    EXPECT_TRUE(bitwise_equal(sync, async)) << "reduce_scatter chunk " << chunk;
    EXPECT_EQ(comm.traffic().bytes, sync_traffic.bytes);
    EXPECT_EQ(comm.traffic().calls, sync_traffic.calls);
  }
  {
    std::vector<T> in(input.begin(), input.begin() + chunk), sync(chunk * p), async(chunk * p);
    comm.reset_traffic();
    comm.all_gather(buf(comm, in), buf(comm, sync));
    const TrafficCounters sync_traffic = comm.traffic();
    comm.reset_traffic();
    CommWork work = comm.iall_gather(buf(comm, in), buf(comm, async));
    work.wait();
    EXPECT_TRUE(bitwise_equal(sync, async)) << "all_gather chunk " << chunk;
    EXPECT_EQ(comm.traffic().bytes, sync_traffic.bytes);
    EXPECT_EQ(comm.traffic().calls, sync_traffic.calls);
  }
  EXPECT_EQ(comm.outstanding_work(), 0u);
}

TEST(AsyncCollectives, MatchSyncBitwiseF32) {
  // 1000 * p floats: MPI's small-message algorithms; 70001 * p: the large ones.
  for (std::size_t chunk : {1u, 1000u, 70001u}) {
    expect_async_equals_sync<float>(world(), chunk, 11, seeded_f32);
    expect_async_equals_sync<float>(device_world(), chunk, 12, seeded_f32);
  }
}

TEST(AsyncCollectives, MatchSyncBitwiseBf16) {
  for (std::size_t chunk : {1u, 1000u, 70001u}) {
    expect_async_equals_sync<bf16_t>(world(), chunk, 21, seeded_bf16);
    expect_async_equals_sync<bf16_t>(device_world(), chunk, 22, seeded_bf16);
  }
}

TEST(AsyncCollectives, SelfCommunicatorCompletesAtIssue) {
  SelfCommunicator host;
  SelfCommunicator dev("tp", MemSpace::kDevice);
  for (std::size_t chunk : {1u, 333u}) {
    expect_async_equals_sync<float>(host, chunk, 31, seeded_f32);
    expect_async_equals_sync<bf16_t>(dev, chunk, 32, seeded_bf16);
  }
  std::vector<float> v = {1, 2, 3};
  CommWork work = host.iall_reduce(buf(host, v), ReduceOp::kSum);
  EXPECT_EQ(host.outstanding_work(), 1u);  // finished only once waited or tested
  EXPECT_TRUE(work.test());
  EXPECT_EQ(host.outstanding_work(), 0u);
  work.wait();  // no-op once finished
}

TEST(AsyncCollectives, EmptyBuffersCountAndFinish) {
  Communicator& w = world();
  w.reset_traffic();
  std::vector<float> none;
  CommWork a = w.iall_reduce(buf(w, none), ReduceOp::kSum);
  CommWork b = w.iall_gather(buf(w, none), buf(w, none));
  a.wait();
  EXPECT_TRUE(b.test());
  EXPECT_EQ(w.traffic().calls_of(CollectiveKind::kAllReduce), 1);
  EXPECT_EQ(w.traffic().calls_of(CollectiveKind::kAllGather), 1);
  EXPECT_EQ(w.outstanding_work(), 0u);
}

// Several works outstanding at once, interleaved with synchronous calls of the same group,
// waited out of order: every result equals the all-synchronous run's.
TEST(AsyncCollectives, SeveralOutstandingMixedWithSync) {
  Communicator& w = device_world();
  const int p = w.size();
  const std::size_t chunk = 5003;
  const std::vector<float> x = seeded_f32(w.rank(), chunk * p, 41);
  const std::vector<bf16_t> y = seeded_bf16(w.rank(), chunk * p, 42);
  const std::vector<float> z = seeded_f32(w.rank(), chunk, 43);
  const std::vector<float> s = seeded_f32(w.rank(), 777, 44);

  // Reference: all synchronous, same order.
  std::vector<float> x_ref = x, s_ref = s, g_ref(chunk * p), zin = z;
  std::vector<bf16_t> y_in = y, y_ref(chunk);
  w.all_reduce(buf(w, x_ref), ReduceOp::kSum);
  w.reduce_scatter(buf(w, y_in), buf(w, y_ref));
  w.all_reduce(buf(w, s_ref), ReduceOp::kSum);
  w.all_gather(buf(w, zin), buf(w, g_ref));

  std::vector<float> xa = x, sa = s, ga(chunk * p), za = z;
  std::vector<bf16_t> ya = y, yo(chunk);
  CommWork w1 = w.iall_reduce(buf(w, xa), ReduceOp::kSum, {.label = "bucket 0"});
  CommWork w2 = w.ireduce_scatter(buf(w, ya), buf(w, yo), {.label = "bucket 1"});
  w.all_reduce(buf(w, sa), ReduceOp::kSum, {.label = "sync between"});
  CommWork w3 = w.iall_gather(buf(w, za), buf(w, ga), {.label = "prefetch"});
  EXPECT_EQ(w.outstanding_work(), 3u);
  w3.wait();
  w1.wait();
  while (!w2.test()) std::this_thread::yield();
  EXPECT_EQ(w.outstanding_work(), 0u);
  EXPECT_TRUE(bitwise_equal(xa, x_ref));
  EXPECT_TRUE(bitwise_equal(yo, y_ref));
  EXPECT_TRUE(bitwise_equal(sa, s_ref));
  EXPECT_TRUE(bitwise_equal(ga, g_ref));

  // A moved work is waited through its new owner.
  std::vector<float> m = x;
  CommWork moved;
  moved = w.iall_reduce(buf(w, m), ReduceOp::kSum);
  CommWork owner(std::move(moved));
  EXPECT_TRUE(moved.finished());
  owner.wait();
  EXPECT_TRUE(bitwise_equal(m, x_ref));
}

// CommTimes (the overlap instrumentation). A synchronous call is all exposed; an async
// one is hidden as far as it ran while the caller did something else. Rank 1 issues
// 150 ms late, so rank 0's work runs >= ~150 ms and rank 0, waiting at once, is exposed
// for it; rank 1 sleeps 150 ms after issuing (the collective can finish meanwhile, rank 0
// being there), so its wait is short and what the collective ran is hidden.
TEST(AsyncCollectives, TimesSplitExposedAndHidden) {
  Communicator& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<float> data(1024, 1.0f);
  // The first async call of a communicator duplicates it (collectively, at issue).
  w.iall_reduce(buf(w, data), ReduceOp::kSum).wait();
  w.barrier();
  w.reset_traffic();
  w.all_reduce(buf(w, data), ReduceOp::kSum);
  EXPECT_GT(w.times().exposed_s, 0.0);
  EXPECT_EQ(w.times().async_s, 0.0);
  EXPECT_EQ(w.times().hidden_s, 0.0);

  w.barrier();
  w.reset_traffic();
  constexpr auto kDelay = std::chrono::milliseconds(150);
  if (w.rank() == 1) std::this_thread::sleep_for(kDelay);
  CommWork work = w.iall_reduce(buf(w, data), ReduceOp::kSum);
  if (w.rank() == 1) std::this_thread::sleep_for(kDelay);
  work.wait();
  const CommTimes t = w.times();
  std::printf("rank %d: exposed %.1f ms, async %.1f ms, hidden %.1f ms\n", w.rank(),
              t.exposed_s * 1e3, t.async_s * 1e3, t.hidden_s * 1e3);
  EXPECT_GT(t.async_s, 0.0);
  EXPECT_LE(t.hidden_s, t.async_s);
  if (w.rank() == 0) {
    EXPECT_GE(t.async_s, 0.1);    // it could not finish before rank 1 issued
    EXPECT_GE(t.exposed_s, 0.1);  // and rank 0 waited for it
    EXPECT_LT(t.hidden_s, t.async_s);
  }
  if (w.rank() == 1) {
    EXPECT_GT(t.hidden_s, 0.0);
    EXPECT_LT(t.exposed_s, 0.1);  // it had 150 ms to finish a 4 KiB all-reduce
  }
  w.barrier();
}

// CommTimes by collective kind: a synchronous all-reduce, an async all-gather waited for
// after a pause and a synchronous reduce-scatter land in their own kinds' slots, the
// others stay 0, and each split sums to its total. On the MPI world (every np) the
// all-gather runs on the communication thread, so with 2 ranks or more its running time
// behind the pause is hidden, under kAllGather alone; the self communicator completes at
// issue (nothing hidden).
void expect_times_by_kind(Communicator& comm) {
  const int p = comm.size();
  const std::size_t chunk = 1 << 16;
  std::vector<float> x = seeded_f32(comm.rank(), chunk * p, 71), chunk_in(chunk), out(chunk * p);
  comm.iall_reduce(buf(comm, x), ReduceOp::kSum).wait();  // the first async call duplicates
  comm.barrier();
  comm.record_calls(true);
  comm.reset_traffic();
  comm.all_reduce(buf(comm, x), ReduceOp::kSum);
  CommWork gather = comm.iall_gather(buf(comm, chunk_in), buf(comm, out));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  gather.wait();
  comm.reduce_scatter(buf(comm, x), buf(comm, chunk_in));
  const CommTimes t = comm.times();
  std::printf("%s rank %d: exposed all_reduce %.3f, reduce_scatter %.3f, all_gather %.3f ms; "
              "hidden all_gather %.3f ms\n",
              comm.name().c_str(), comm.rank(), t.exposed_of(CollectiveKind::kAllReduce) * 1e3,
              t.exposed_of(CollectiveKind::kReduceScatter) * 1e3,
              t.exposed_of(CollectiveKind::kAllGather) * 1e3,
              t.hidden_of(CollectiveKind::kAllGather) * 1e3);
  double exposed = 0, hidden = 0;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    SCOPED_TRACE(collective_name(kind));
    const bool called = kind == CollectiveKind::kAllReduce ||
                        kind == CollectiveKind::kReduceScatter ||
                        kind == CollectiveKind::kAllGather;
    if (called) {
      EXPECT_GT(t.exposed_of(kind), 0.0);
    } else {
      EXPECT_EQ(t.exposed_of(kind), 0.0);
    }
    if (kind != CollectiveKind::kAllGather) {
      EXPECT_EQ(t.hidden_of(kind), 0.0);
    }
    exposed += t.exposed_of(kind);
    hidden += t.hidden_of(kind);
  }
  EXPECT_NEAR(exposed, t.exposed_s, 1e-12);
  EXPECT_NEAR(hidden, t.hidden_s, 1e-12);
  EXPECT_EQ(t.hidden_of(CollectiveKind::kAllGather), t.hidden_s);  // the only async call
  if (p >= 2 && t.async_s > 0) {
    EXPECT_GT(t.hidden_of(CollectiveKind::kAllGather), 0.0);
  }
  // Each ring collective is one entry of CommTimes::calls, in issue order, with its own
  // time: the all-gather's issue, wait and hidden time together; the barrier none.
  ASSERT_EQ(t.calls.size(), 3u);
  EXPECT_EQ(t.calls[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(t.calls[1].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(t.calls[2].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(t.calls[0].seconds, t.exposed_of(CollectiveKind::kAllReduce));
  EXPECT_NEAR(t.calls[1].seconds,
              t.exposed_of(CollectiveKind::kAllGather) + t.hidden_of(CollectiveKind::kAllGather), 1e-12);
  EXPECT_EQ(t.calls[2].seconds, t.exposed_of(CollectiveKind::kReduceScatter));
  comm.barrier();
  comm.reset_traffic();  // resets the splits with the totals
  EXPECT_EQ(comm.times().exposed_of(CollectiveKind::kAllReduce), 0.0);
  EXPECT_EQ(comm.times().hidden_of(CollectiveKind::kAllGather), 0.0);
  EXPECT_TRUE(comm.times().calls.empty());
  // A work issued before a reset keeps its call out of the times after it.
  CommWork before = comm.iall_reduce(buf(comm, x), ReduceOp::kSum);
  comm.reset_traffic();
  before.wait();
  EXPECT_TRUE(comm.times().calls.empty());
  comm.all_gather(buf(comm, chunk_in), buf(comm, out));
  ASSERT_EQ(comm.times().calls.size(), 1u);
  EXPECT_EQ(comm.times().calls[0].kind, CollectiveKind::kAllGather);
  comm.record_calls(false);  // the default: no list
  comm.all_gather(buf(comm, chunk_in), buf(comm, out));
  EXPECT_EQ(comm.times().calls.size(), 1u);
  comm.barrier();
  comm.reset_traffic();
}

TEST(AsyncCollectives, TimesSplitByKind) {
  expect_times_by_kind(world());
  SelfCommunicator self("self");
  expect_times_by_kind(self);
  EXPECT_EQ(self.times().hidden_s, 0.0);
}

TEST(AsyncCollectives, TestIsEventuallyTrue) {
  Communicator& w = world();
  std::vector<float> v = seeded_f32(w.rank(), 1 << 16, 51), ref = v;
  w.all_reduce(buf(w, ref), ReduceOp::kSum);
  CommWork work = w.iall_reduce(buf(w, v), ReduceOp::kSum);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int polls = 0;
  while (!work.test() && Clock::now() < deadline) {
    ++polls;
    std::this_thread::yield();
  }
  EXPECT_TRUE(work.finished()) << "not complete after " << polls << " polls";
  EXPECT_TRUE(bitwise_equal(v, ref));
}

// ---- device memory under a protecting hook (the checked backend's behaviour) -----------


// The async calls on protected device buffers: the MPI backend (communication thread,
// later MPI calls) works outside any scope, so without staging this faults; the self
// backend completes at issue inside the call's scope and is not staged. Results equal the
// synchronous calls' on host copies of the same inputs, and no scope stays open.
void expect_staged_async_is_correct(Communicator& dev, Communicator& host) {
  const int p = dev.size();
  const std::size_t chunk = 4099;
  const std::size_t bytes = chunk * p * sizeof(float);
  ProtectedDeviceMemory device(4 * bytes);
  const std::vector<float> x = seeded_f32(dev.rank(), chunk * p, 61);
  const std::size_t a = 0, in = bytes, out = 2 * bytes, gathered = 3 * bytes;
  auto at = [&](std::size_t offset) { return device.at(offset, DType::kF32); };
  device.upload(at(a), x);
  device.upload(at(in), x);
  device.upload(at(gathered), std::vector<float>(x.begin(), x.begin() + chunk));

  auto dbuf = [&](std::size_t offset, std::size_t n) { return CommBuf::device(at(offset), n); };
  CommWork ar = dev.iall_reduce(dbuf(a, chunk * p), ReduceOp::kSum, {.label = "staged ar"});
  CommWork rs = dev.ireduce_scatter(dbuf(in, chunk * p), dbuf(out, chunk));
  EXPECT_FALSE(device.is_open()) << "issue must not leave device memory open";
  // A synchronous call in between opens and closes its own scope, while the async ones
  // may be running.
  std::vector<float> ref_ar = x, ref_rs(chunk), ref_in = x, ref_g(chunk * p);
  std::vector<float> g_in(x.begin(), x.begin() + chunk);
  host.all_reduce(CommBuf::host(std::span(ref_ar)), ReduceOp::kSum);
  host.reduce_scatter(CommBuf::host(std::span(ref_in)), CommBuf::host(std::span(ref_rs)));
  host.all_gather(CommBuf::host(std::span(g_in)), CommBuf::host(std::span(ref_g)));
  ar.wait();
  rs.wait();
  // all_gather's output overlaps nothing else; its input is the first chunk at `gathered`,
  // its output the whole `a` range (already read back below first).
  EXPECT_TRUE(bitwise_equal(device.download<float>(at(a), chunk * p), ref_ar));
  EXPECT_TRUE(bitwise_equal(device.download<float>(at(out), chunk), ref_rs));
  CommWork ag = dev.iall_gather(dbuf(gathered, chunk), dbuf(a, chunk * p));
  while (!ag.test()) std::this_thread::yield();
  EXPECT_TRUE(bitwise_equal(device.download<float>(at(a), chunk * p), ref_g));
  EXPECT_FALSE(device.is_open());
}

TEST(AsyncCollectives, CheckedDeviceMemoryIsStagedMpi) {
  expect_staged_async_is_correct(device_world(), world());
}

TEST(AsyncCollectives, CheckedDeviceMemoryIsCorrectSelf) {
  SelfCommunicator dev("tp", MemSpace::kDevice);
  SelfCommunicator host;
  expect_staged_async_is_correct(dev, host);
}

// ---- the watchdog sees a blocking wait ------------------------------------------------

// A 2-rank fake (rank 1) whose async all_reduce and batch never complete until released
// (5 s safety net).
class StuckAsyncCommunicator final : public testing::FakeCommunicator {
 public:
  explicit StuckAsyncCommunicator(const char* group = "dp")
      : FakeCommunicator(group, 1, 2, "stuck") {}
  ~StuckAsyncCommunicator() override { check_no_outstanding_work(); }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }

 protected:
  class Work final : public AsyncCollective {
   public:
    explicit Work(StuckAsyncCommunicator& c) : c_(c) {}
    bool test() override {
      std::lock_guard<std::mutex> lock(c_.mutex_);
      return c_.released_;
    }
    void wait() override {
      std::unique_lock<std::mutex> lock(c_.mutex_);
      c_.cv_.wait_for(lock, std::chrono::seconds(5), [this] { return c_.released_; });
    }

   private:
    StuckAsyncCommunicator& c_;
  };
  std::unique_ptr<AsyncCollective> do_iall_reduce(const CommBuf&, ReduceOp,
                                                  const CollectiveOptions&) override {
    return std::make_unique<Work>(*this);
  }
  std::unique_ptr<AsyncCollective> do_ibatch_p2p(std::span<const P2POp>,
                                                 const CollectiveOptions&) override {
    return std::make_unique<Work>(*this);
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
};

// A watchdog that records each hang report and then releases the stuck communicator.
class HangRecorder {
 public:
  explicit HangRecorder(StuckAsyncCommunicator& comm)
      : watchdog_({.poll_interval = milliseconds(20), .on_hang = [this, &comm](const HangReport& r) {
                     {
                       std::lock_guard<std::mutex> lock(mutex_);
                       reports_.push_back(r);
                     }
                     comm.release();
                   }}) {}
  std::vector<HangReport> reports() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reports_;
  }

 private:
  std::mutex mutex_;
  std::vector<HangReport> reports_;
  Watchdog watchdog_;  // last: destroyed first, so no callback outlives the members
};

TEST(AsyncCollectives, HungWaitIsReportedToTheWatchdog) {
  StuckAsyncCommunicator comm;
  HangRecorder recorder(comm);
  std::vector<float> grads(16, 1.0f);
  CommWork work = comm.iall_reduce(CommBuf::host(std::span(grads)), ReduceOp::kSum,
                                   {.timeout = milliseconds(200), .label = "grad bucket 3"});
  // The issue returned at once; a slow compute phase is not a hang.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(recorder.reports().empty());
  const auto start = Clock::now();
  work.wait();
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 0.2 + 0.5);  // released by the watchdog, not the 5 s safety net
  const std::vector<HangReport> reports = recorder.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].call, "all_reduce (wait)");
  EXPECT_EQ(reports[0].label, "grad bucket 3");
  EXPECT_EQ(reports[0].group, "dp");
  EXPECT_NE(reports[0].message.find("all_reduce (wait) 'grad bucket 3' in group 'dp'"),
            std::string::npos)
      << reports[0].message;
}

// ---- asynchronous batched point-to-point (ibatch_p2p) ---------------------------------

// One ring exchange (send to rank + 1, receive from rank - 1) of an f32 and a bf16 block,
// as ring attention posts it: ibatch_p2p receives bitwise what batch_p2p does (the
// sender's seeded values) and counts the same traffic; two batches may be in flight at
// once and be waited in either order.
TEST(AsyncBatchP2P, RingExchangeMatchesBatchP2P) {
  Communicator& w = world();
  const int p = w.size(), r = w.rank();
  if (p < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const std::size_t n = 40000;  // past Open MPI's eager limit: a rendezvous transfer
  std::vector<float> a = seeded_f32(r, n, 81);
  std::vector<bf16_t> b = seeded_bf16(r, n / 2, 82);
  auto ring_ops = [&](std::vector<float>& fin, std::vector<bf16_t>& bin) {
    return std::vector<P2POp>{{P2POp::kSend, buf(w, a), next, 1},
                              {P2POp::kRecv, buf(w, fin), prev, 1},
                              {P2POp::kSend, buf(w, b), next, 2},
                              {P2POp::kRecv, buf(w, bin), prev, 2}};
  };
  std::vector<float> sync_f(n), async_f(n), second_f(n);
  std::vector<bf16_t> sync_b(n / 2), async_b(n / 2), second_b(n / 2);
  w.reset_traffic();
  w.batch_p2p(ring_ops(sync_f, sync_b), {.label = "sync ring"});
  w.wait_sends();
  const TrafficCounters sync_traffic = w.traffic();
  w.reset_traffic();
  CommWork first = w.ibatch_p2p(ring_ops(async_f, async_b), {.label = "async ring"});
  EXPECT_EQ(w.traffic().bytes, sync_traffic.bytes) << "counted at issue";
  EXPECT_EQ(w.traffic().calls, sync_traffic.calls);
  CommWork second = w.ibatch_p2p(ring_ops(second_f, second_b), {.label = "async ring 2"});
  EXPECT_EQ(w.outstanding_work(), 2u);
  second.wait();
  first.wait();
  EXPECT_EQ(w.outstanding_work(), 0u);
  EXPECT_TRUE(bitwise_equal(sync_f, seeded_f32(prev, n, 81)));
  EXPECT_TRUE(bitwise_equal(sync_b, seeded_bf16(prev, n / 2, 82)));
  EXPECT_TRUE(bitwise_equal(async_f, sync_f));
  EXPECT_TRUE(bitwise_equal(async_b, sync_b));
  EXPECT_TRUE(bitwise_equal(second_f, sync_f));
  EXPECT_TRUE(bitwise_equal(second_b, sync_b));
}

// On protected device memory the MPI backend works on staged copies: the issue leaves no
// scope open, the sends' payload is read at issue, the receives land at wait.
TEST(AsyncBatchP2P, CheckedDeviceMemoryIsStaged) {
  Communicator& dev = device_world();
  const int p = dev.size(), r = dev.rank();
  if (p < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const std::size_t n = 20000, bytes = n * sizeof(float);
  ProtectedDeviceMemory device(2 * bytes);
  const DevPtr send = device.at(0, DType::kF32), recv = device.at(bytes, DType::kF32);
  device.upload(send, seeded_f32(r, n, 83));
  const std::vector<P2POp> ops{{P2POp::kSend, CommBuf::device(send, n), (r + 1) % p, 5},
                               {P2POp::kRecv, CommBuf::device(recv, n), (r + p - 1) % p, 5}};
  CommWork work = dev.ibatch_p2p(ops, {.label = "staged ring"});
  EXPECT_FALSE(device.is_open()) << "issue must not leave device memory open";
  work.wait();
  EXPECT_FALSE(device.is_open());
  EXPECT_TRUE(bitwise_equal(device.download<float>(recv, n), seeded_f32((r + p - 1) % p, n, 83)));
}

TEST(AsyncBatchP2P, HungWaitIsReportedToTheWatchdogWithItsPeer) {
  StuckAsyncCommunicator comm("cp");
  HangRecorder recorder(comm);
  std::vector<float> out(16, 1.0f), in(16);
  const std::vector<P2POp> ops{{P2POp::kSend, CommBuf::host(std::span(out)), 0, 1},
                               {P2POp::kRecv, CommBuf::host(std::span(in)), 0, 1}};
  CommWork work =
      comm.ibatch_p2p(ops, {.timeout = milliseconds(200), .label = "ring attention step 2"});
  std::this_thread::sleep_for(milliseconds(300));  // computing is not a hang
  EXPECT_TRUE(recorder.reports().empty());
  work.wait();
  const std::vector<HangReport> reports = recorder.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].call, "batch_p2p (wait)");
  EXPECT_EQ(reports[0].label, "ring attention step 2");
  EXPECT_EQ(reports[0].group, "cp");
  EXPECT_EQ(reports[0].peer, 0);
}

// ---- misuse ----------------------------------------------------------------------------

TEST(AsyncCollectivesDeathTest, ArgumentErrorsAbortLikeTheSyncCalls) {
  GTEST_FLAG_SET(death_test_style, "fast");  // no re-exec: main() would start MPI again
  SelfCommunicator host;
  std::vector<std::int32_t> i(4);
  EXPECT_DEATH((void)host.iall_reduce(CommBuf::host(std::span(i)), ReduceOp::kSum,
                                      {.label = "ints"}),
               "in group 'world' \\(rank 0/1, self\\) all_reduce 'ints' .*: dtype i32 cannot be "
               "reduced \\(f32, bf16, f64 and i64 can\\)");
  std::vector<float> a(4), b(3);
  EXPECT_DEATH((void)host.ireduce_scatter(CommBuf::host(std::span(a)), CommBuf::host(std::span(b))),
               "reduce_scatter .*: input has 4 elements, output 3; need input = size \\* output");
  EXPECT_DEATH((void)host.iall_gather(CommBuf::host(std::span(a)), CommBuf::host(std::span(b))),
               "all_gather .*: input has 4 elements, output 3; need output = size \\* input");
  SelfCommunicator dev("tp", MemSpace::kDevice);
  EXPECT_DEATH((void)dev.iall_reduce(CommBuf::host(std::span(a)), ReduceOp::kSum),
               "group 'tp' .*all_reduce .*: host buffer passed to a device communicator");
}

TEST(AsyncCollectivesDeathTest, AnUnwaitedWorkAborts) {
  GTEST_FLAG_SET(death_test_style, "fast");
  std::vector<float> a(4);
  EXPECT_DEATH(
      {
        SelfCommunicator host;
        CommWork work = host.iall_reduce(CommBuf::host(std::span(a)), ReduceOp::kSum,
                                         {.label = "bucket 2"});
      },
      "in group 'world' \\(rank 0/1, self\\) all_reduce 'bucket 2' .*: CommWork destroyed "
      "before wait\\(\\)");
  EXPECT_DEATH(
      {
        SelfCommunicator host;
        CommWork work = host.iall_reduce(CommBuf::host(std::span(a)), ReduceOp::kSum);
        work = host.iall_reduce(CommBuf::host(std::span(a)), ReduceOp::kSum);
      },
      "an unfinished CommWork was assigned over");
  EXPECT_DEATH(
      {
        auto comm = std::make_unique<SelfCommunicator>("dp");
        CommWork work = comm->iall_reduce(CommBuf::host(std::span(a)), ReduceOp::kSum);
        comm.reset();
      },
      "communicator 'dp' \\(rank 0/1, self\\) destroyed with 1 unfinished async "
      "collective\\(s\\); wait\\(\\) every CommWork first");
}

// ---- overlap, measured (printed, not asserted) ----------------------------------------

// Arithmetic that never enters MPI: `iters` rounds over a 64 KiB array.
float compute(std::vector<float>& scratch, int iters) {
  float acc = 0;
  for (int it = 0; it < iters; ++it) {
    for (float& v : scratch) {
      v = v * 0.999f + 0.001f;
      acc += v;
    }
  }
  return acc;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Every rank: T_sync = the synchronous all_reduce of N MiB; C = a compute loop calibrated
// to about T_sync alone; then issue + compute + wait. hidden = (T_sync + C - total) /
// T_sync: the fraction of the collective the compute hid; "wait" is the exposed part.
// N: TRIDENT_OVERLAP_MIB (default 4, to keep the suite fast; the report's figures use 64).
// On a machine with fewer cores than ranks the communication thread competes with the
// compute loop for a core, so "compute overlapped" exceeds "compute alone".
TEST(AsyncOverlap, PrintsHowMuchComputeHides) {
  Communicator& w = device_world();
  const char* env = std::getenv("TRIDENT_OVERLAP_MIB");
  const std::size_t mib = env != nullptr ? std::strtoul(env, nullptr, 10) : 4;
  const std::size_t n = mib * (1u << 20) / sizeof(float);
  std::vector<float> data = seeded_f32(w.rank(), n, 71), sync = data;
  std::vector<float> scratch(16384, 1.0f);
  volatile float sink = 0;

  // T_sync: the best of 3 warm calls (the first touches fresh pages and sets MPI up).
  std::vector<float> scratch_sync = data;
  w.all_reduce(buf(w, scratch_sync), ReduceOp::kSum);
  double t_sync = 1e30;
  Clock::time_point t;
  for (int rep = 0; rep < 3; ++rep) {
    sync = data;
    w.barrier();
    t = Clock::now();
    w.all_reduce(buf(w, sync), ReduceOp::kSum);
    t_sync = std::min(t_sync, ms_since(t));
  }
  // Calibrate: iterations per ms alone, then C ~ T_sync (at least 1 ms).
  w.barrier();
  sink = sink + compute(scratch, 20);
  t = Clock::now();
  sink = sink + compute(scratch, 200);
  const double per_iter = std::max(ms_since(t) / 200, 1e-4);
  std::vector<std::int64_t> iters = {static_cast<std::int64_t>(std::max(t_sync, 1.0) / per_iter)};
  // One C for every rank: the smallest, so a rank calibrated while others idled does not
  // stretch the test.
  iters[0] = -iters[0];
  w.all_reduce(buf(w, iters), ReduceOp::kMax);
  iters[0] = std::max<std::int64_t>(-iters[0], 1);
  w.barrier();
  t = Clock::now();
  sink = sink + compute(scratch, static_cast<int>(iters[0]));
  const double c_alone = ms_since(t);

  std::vector<float> async = data;
  w.barrier();
  t = Clock::now();
  CommWork work = w.iall_reduce(buf(w, async), ReduceOp::kSum);
  const double t_issue = ms_since(t);
  sink = sink + compute(scratch, static_cast<int>(iters[0]));
  const double c_overlapped = ms_since(t);
  const auto t_wait = Clock::now();
  work.wait();
  const double wait_ms = ms_since(t_wait);
  const double total = ms_since(t);
  EXPECT_TRUE(bitwise_equal(async, sync));

  // Issue then wait at once: the async path's latency against the synchronous call.
  std::vector<float> again = data;
  w.barrier();
  t = Clock::now();
  CommWork direct = w.iall_reduce(buf(w, again), ReduceOp::kSum);
  direct.wait();
  const double t_direct = ms_since(t);
  EXPECT_TRUE(bitwise_equal(again, sync));

  // The caller off the CPU for 1.5 T_sync (as while a GPU or a peer works): with real
  // progress the wait is then ~0 whatever the core count.
  std::vector<float> slept = data;
  w.barrier();
  CommWork idle = w.iall_reduce(buf(w, slept), ReduceOp::kSum);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(1.5 * t_sync));
  t = Clock::now();
  idle.wait();
  const double wait_after_sleep = ms_since(t);
  EXPECT_TRUE(bitwise_equal(slept, sync));

  const double hidden = t_sync > 0 ? (t_sync + c_alone - total) / t_sync : 0;
  // The slowest rank's times; the hidden fraction's range over ranks.
  std::vector<double> row = {t_sync, t_direct, c_alone, t_issue, c_overlapped, wait_ms, total,
                             hidden, -hidden, wait_after_sleep};
  w.all_reduce(buf(w, row), ReduceOp::kMax);
  if (w.rank() == 0 && w.size() > 1) {  // one rank: nothing to hide
    std::printf(
        "async overlap, all_reduce f32 %zu MiB, %d ranks (ms, max over ranks):\n"
        "  sync %.2f | issue+wait %.2f | compute alone %.2f | issue %.3f | compute overlapped "
        "%.2f | wait %.2f | total %.2f | hidden %.0f%%..%.0f%% of sync\n"
        "  issue, sleep 1.5 x sync, wait: wait %.2f\n",
        mib, w.size(), row[0], row[1], row[2], row[3], row[4], row[5], row[6], -100 * row[8],
        100 * row[7], row[9]);
  }
  (void)sink;
}

}  // namespace
}  // namespace trident::test
