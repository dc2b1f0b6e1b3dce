// Communicator::all_to_all (per-peer counts, MPI_Alltoallv semantics): on the MPI world
// at every launched size (ctest runs this binary at np 1, 2, 4, 8, and its AllToAll tests
// at np 3), with uneven counts, zero counts included, every element checked exactly
// against the value its sender wrote, and the traffic counters against the analytic
// volume of the counts; the self communicator; misuse messages; the hang watchdog.
// Assertions come after the collectives (EXPECT, not ASSERT) so a failing rank still
// calls the same collectives as the others.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "comm/watchdog.h"
#include "tests/common/fake_communicator.h"
#include "tests/common/mpi_test_util.h"

namespace trident::test {
namespace {

// Elements rank `src` sends rank `dst` in round `round`: uneven, and zero for about a
// third of the pairs (a rank's own chunk included in some rounds).
std::size_t pair_count(int src, int dst, int round) {
  if ((src + 2 * dst + round) % 3 == 0) return 0;
  return static_cast<std::size_t>((src * 7 + dst * 3 + round * 5) % 11 + 1);
}

// The value of element i of the chunk src sends dst: exact in f32, i64 and bf16 alike
// (small integers), and distinct for every (src, dst, i) with i < 64 in f32 and i64.
double element(int src, int dst, std::size_t i) {
  return static_cast<double>(src * 4096 + dst * 64 + static_cast<int>(i % 64));
}
double bf16_element(int src, int dst, std::size_t i) {  // 8 bits of mantissa: keep it small
  return static_cast<double>((src * 37 + dst * 11 + static_cast<int>(i)) % 200);
}

template <class T>
T make(double v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return float_to_bf16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double value_of(T v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return bf16_to_float(v);
  } else {
    return static_cast<double>(v);
  }
}

struct Exchange {
  std::vector<std::size_t> send_counts, recv_counts;
};
Exchange counts_of(int me, int p, int round) {
  Exchange e;
  for (int r = 0; r < p; ++r) {
    e.send_counts.push_back(pair_count(me, r, round));
    e.recv_counts.push_back(pair_count(r, me, round));
  }
  return e;
}

// One exchange of dtype T on `comm` (`space` its memory space); returns the elements that
// arrived wrong.
template <class T>
int exchange_and_check(Communicator& comm, MemSpace space, int round) {
  const int me = comm.rank(), p = comm.size();
  const Exchange e = counts_of(me, p, round);
  auto value = [](int src, int dst, std::size_t i) {
    return std::is_same_v<T, bf16_t> ? bf16_element(src, dst, i) : element(src, dst, i);
  };
  std::vector<T> in;
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < e.send_counts[static_cast<std::size_t>(r)]; ++i) {
      in.push_back(make<T>(value(me, r, i)));
    }
  }
  const std::size_t n_out = std::accumulate(e.recv_counts.begin(), e.recv_counts.end(), std::size_t{0});
  std::vector<T> out(n_out, make<T>(-1.0));
  comm.all_to_all(CommBuf(in.data(), in.size(), dtype_of<T>(), space), e.send_counts,
                  CommBuf(out.data(), out.size(), dtype_of<T>(), space), e.recv_counts,
                  {.label = "round " + std::to_string(round)});
  int wrong = 0;
  std::size_t at = 0;
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < e.recv_counts[static_cast<std::size_t>(r)]; ++i) {
      wrong += value_of(out[at++]) != value(r, me, i);
    }
  }
  return wrong;
}

// The bytes every rank of the group counts, summed over the group, analytically: each
// element sent once.
std::int64_t analytic_group_bytes(int p, int rounds, std::size_t esize) {
  std::int64_t total = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int s = 0; s < p; ++s) {
      for (int d = 0; d < p; ++d) total += static_cast<std::int64_t>(pair_count(s, d, round) * esize);
    }
  }
  return total;
}

TEST(AllToAll, UnevenCountsArriveExactlyAndAreCountedAsTheirPayload) {
  Communicator& w = world();
  const int p = w.size();
  constexpr int kRounds = 4;
  w.reset_traffic();
  int wrong = 0;
  for (int round = 0; round < kRounds; ++round) wrong += exchange_and_check<float>(w, MemSpace::kHost, round);
  const TrafficCounters traffic = w.traffic();
  EXPECT_EQ(wrong, 0);
  // This rank's payload: what it sent (its own chunk included), every round.
  std::int64_t mine = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int d = 0; d < p; ++d) mine += static_cast<std::int64_t>(pair_count(w.rank(), d, round) * 4);
  }
  EXPECT_EQ(traffic.bytes_of(CollectiveKind::kAllToAll), mine);
  EXPECT_EQ(traffic.calls_of(CollectiveKind::kAllToAll), kRounds);
  EXPECT_EQ(traffic.bytes_of(CollectiveKind::kSend), 0);  // one collective, not p2p calls
  std::vector<std::int64_t> total = {traffic.bytes_of(CollectiveKind::kAllToAll)};
  w.all_reduce(CommBuf::host(std::span(total)), ReduceOp::kSum);
  EXPECT_EQ(total[0], analytic_group_bytes(p, kRounds, 4));
}

TEST(AllToAll, AnyDtypeMovesItsOwnBytes) {
  Communicator& w = world();
  w.reset_traffic();
  const int wrong_bf16 = exchange_and_check<bf16_t>(w, MemSpace::kHost, 1);
  const std::int64_t bf16_bytes = w.traffic().bytes_of(CollectiveKind::kAllToAll);
  const int wrong_i64 = exchange_and_check<std::int64_t>(w, MemSpace::kHost, 1);
  const std::int64_t i64_bytes = w.traffic().bytes_of(CollectiveKind::kAllToAll) - bf16_bytes;
  EXPECT_EQ(wrong_bf16, 0);
  EXPECT_EQ(wrong_i64, 0);
  EXPECT_EQ(i64_bytes, 4 * bf16_bytes);  // 8 bytes an element against 2
}

TEST(AllToAll, AllZeroCountsStillTakePart) {
  // Every rank calls with nothing to move, then a real exchange must still line up.
  Communicator& w = world();
  const std::vector<std::size_t> zeros(static_cast<std::size_t>(w.size()), 0);
  w.reset_traffic();
  w.all_to_all(CommBuf(nullptr, 0, DType::kF32, MemSpace::kHost), zeros,
               CommBuf(nullptr, 0, DType::kF32, MemSpace::kHost), zeros, {.label = "empty"});
  EXPECT_EQ(w.traffic().calls_of(CollectiveKind::kAllToAll), 1);
  EXPECT_EQ(w.traffic().bytes_of(CollectiveKind::kAllToAll), 0);
  EXPECT_EQ(exchange_and_check<float>(w, MemSpace::kHost, 2), 0);
}

TEST(AllToAll, RankWithNothingToSendOrReceive) {
  // Rank 0 neither sends nor receives anything; the others exchange among themselves.
  Communicator& w = world();
  const int me = w.rank(), p = w.size();
  std::vector<std::size_t> sc(static_cast<std::size_t>(p)), rc(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    sc[static_cast<std::size_t>(r)] = me == 0 || r == 0 ? 0 : static_cast<std::size_t>(me + r);
    rc[static_cast<std::size_t>(r)] = me == 0 || r == 0 ? 0 : static_cast<std::size_t>(r + me);
  }
  std::vector<float> in, out(std::accumulate(rc.begin(), rc.end(), std::size_t{0}), -1.0f);
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < sc[static_cast<std::size_t>(r)]; ++i) {
      in.push_back(static_cast<float>(element(me, r, i)));
    }
  }
  w.all_to_all(CommBuf::host(std::span(in)), sc, CommBuf::host(std::span(out)), rc);
  int wrong = 0;
  std::size_t at = 0;
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < rc[static_cast<std::size_t>(r)]; ++i) {
      wrong += out[at++] != static_cast<float>(element(r, me, i));
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(at, out.size());
}

TEST(AllToAll, OnADeviceSubgroup) {
  // A split child serving device memory (the expert-parallel group is one): even and odd
  // world ranks form two groups; each exchanges with its own counts.
  Communicator& w = world();
  std::unique_ptr<Communicator> half =
      w.split(w.rank() % 2, w.rank(), "ep", MemSpace::kDevice, {.label = "ep split"});
  ASSERT_NE(half, nullptr);
  half->reset_traffic();
  const int wrong = exchange_and_check<float>(*half, MemSpace::kDevice, 3);
  EXPECT_EQ(wrong, 0);
  std::int64_t mine = 0;
  for (int d = 0; d < half->size(); ++d) mine += static_cast<std::int64_t>(pair_count(half->rank(), d, 3) * 4);
  EXPECT_EQ(half->traffic().bytes_of(CollectiveKind::kAllToAll), mine);
}

TEST(AllToAll, BusFactorIsThatOfAnAllToAll) {
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::kAllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::kAllToAll, 1), 0.0);
  EXPECT_STREQ(collective_name(CollectiveKind::kAllToAll), "all_to_all");
}

// ---- the self communicator -----------------------------------------------------------

TEST(AllToAllSelf, CopiesTheOwnChunkAndCountsIt) {
  SelfCommunicator self;
  const std::vector<float> in = {1.5f, -2.0f, 3.25f, 9.0f, 0.125f};
  std::vector<float> out(5, 0.0f);
  const std::vector<std::size_t> counts = {5};
  self.all_to_all(CommBuf::host(std::span(in)), counts, CommBuf::host(std::span(out)), counts);
  EXPECT_EQ(out, in);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllToAll), 20);
  EXPECT_EQ(self.traffic().calls_of(CollectiveKind::kAllToAll), 1);
  const std::vector<std::size_t> zero = {0};
  self.all_to_all(CommBuf(nullptr, 0, DType::kF32, MemSpace::kHost), zero,
                  CommBuf(nullptr, 0, DType::kF32, MemSpace::kHost), zero);
  EXPECT_EQ(self.traffic().calls_of(CollectiveKind::kAllToAll), 2);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllToAll), 20);
}

TEST(AllToAllSelf, DeviceBuffersGoThroughTheDeviceCopy) {
  int copies = 0;
  std::size_t copied = 0;
  SelfCommunicator ep("ep", MemSpace::kDevice, [&](void* dst, const void* src, std::size_t bytes) {
    ++copies;
    copied += bytes;
    std::memcpy(dst, src, bytes);
  });
  const std::vector<bf16_t> in = {float_to_bf16(0.5f), float_to_bf16(-3.0f), float_to_bf16(7.0f)};
  std::vector<bf16_t> out(3);
  const std::vector<std::size_t> counts = {3};
  ep.all_to_all(CommBuf(const_cast<bf16_t*>(in.data()), 3, DType::kBF16, MemSpace::kDevice), counts,
                CommBuf(out.data(), 3, DType::kBF16, MemSpace::kDevice), counts);
  EXPECT_EQ(out, in);
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(copied, 6u);
}

TEST(AllToAllSelf, MisuseAbortsNamingTheCall) {
  GTEST_FLAG_SET(death_test_style, "fast");  // no re-exec: main() would start MPI again
  SelfCommunicator self("ep");
  std::vector<float> in(4), out(4);
  const std::vector<std::size_t> four = {4}, three = {3}, two = {2, 2};
  EXPECT_DEATH(self.all_to_all(CommBuf::host(std::span(in)), two, CommBuf::host(std::span(out)),
                               two, {.label = "dispatch"}),
               "all_to_all 'dispatch'.*2 send counts and 2 receive counts; need one per rank");
  EXPECT_DEATH(self.all_to_all(CommBuf::host(std::span(in)), three, CommBuf::host(std::span(out)),
                               three),
               "input has 4 elements, output 4; the counts sum to 3 sent and 3 received");
  std::vector<float> out3(3);
  EXPECT_DEATH(self.all_to_all(CommBuf::host(std::span(in)), four, CommBuf::host(std::span(out3)),
                               three),
               "sends itself 4 elements but expects 3");
  std::vector<double> d(4);
  EXPECT_DEATH(self.all_to_all(CommBuf::host(std::span(in)), four, CommBuf::host(std::span(d)),
                               four),
               "input is f32, output f64");
  EXPECT_DEATH(self.all_to_all(CommBuf::host(std::span(in)), four, CommBuf::host(std::span(in)),
                               four),
               "input and output overlap");
  EXPECT_DEATH(self.all_to_all(CommBuf(in.data(), 4, DType::kF32, MemSpace::kDevice), four,
                               CommBuf(out.data(), 4, DType::kF32, MemSpace::kDevice), four),
               "device buffer passed to a host communicator");
}

// ---- the hang watchdog ---------------------------------------------------------------

// Rank 1 of 2 whose all_to_all blocks until released (at most 5 s, so a broken watchdog
// fails the test instead of hanging it).
class StuckAllToAll final : public testing::FakeCommunicator {
 public:
  StuckAllToAll() : FakeCommunicator("ep", 1, 2, "stuck") {}
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }

 protected:
  void do_all_to_all(const CommBuf&, std::span<const std::size_t>, const CommBuf&,
                     std::span<const std::size_t>, const CollectiveOptions&) override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, std::chrono::seconds(5), [this] { return released_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST(AllToAllWatchdog, AHungAllToAllIsReportedWithItsLabel) {
  StuckAllToAll comm;
  std::mutex mutex;
  std::vector<HangReport> reports;
  Watchdog watchdog({.poll_interval = std::chrono::milliseconds(10),
                     .on_hang = [&](const HangReport& report) {
                       {
                         std::lock_guard<std::mutex> lock(mutex);
                         reports.push_back(report);
                       }
                       comm.release();
                     }});
  std::vector<float> in(3, 1.0f), out(5, 0.0f);
  const std::vector<std::size_t> sc = {1, 2}, rc = {3, 2};
  const auto start = std::chrono::steady_clock::now();
  comm.all_to_all(CommBuf::host(std::span(in)), sc, CommBuf::host(std::span(out)), rc,
                  {.timeout = std::chrono::milliseconds(100), .label = "moe dispatch layer 2"});
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited, 2.0);  // released by the watchdog, not the 5 s safety net
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].call, "all_to_all");
  EXPECT_EQ(reports[0].label, "moe dispatch layer 2");
  EXPECT_EQ(reports[0].group, "ep");
  EXPECT_EQ(reports[0].peer, -1);
  EXPECT_NE(reports[0].message.find("all_to_all 'moe dispatch layer 2' in group 'ep' (rank 1/2)"),
            std::string::npos)
      << reports[0].message;
  EXPECT_EQ(watchdog.in_flight(), 0u);
}

}  // namespace
}  // namespace trident::test
