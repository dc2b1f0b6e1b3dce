// The hang watchdog (comm/watchdog.h). In-process tests drive it with a fake
// communicator whose calls block until released, so a hang is reported to a recorder
// instead of ending the process; one test runs real MPI collectives on every rank under a
// running watchdog and checks that nothing fires. The real abort path (a rank made to
// hang, the job ends non-zero naming the call) is the CTest entry
// mpi_watchdog_names_culprit_np2, which runs mpi_main.cpp's --abort_demo=hang.
#include "comm/watchdog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/mpi_test_util.h"
#include "tests/common/fake_communicator.h"

namespace trident::test {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Rank 1 of a 2-rank (or `size`-rank) group whose all_reduce / recv / barrier block until
// release() or, so a broken watchdog fails the test instead of hanging it, for at most
// kSafety; other calls return at once after `delay`. `members`: the world ranks it
// reports (none by default, as a backend that cannot tell).
class StuckCommunicator final : public testing::FakeCommunicator {
 public:
  static constexpr milliseconds kSafety{5000};
  explicit StuckCommunicator(std::string name, int size = 2)
      : FakeCommunicator(std::move(name), 1, size, "stuck") {}
  std::vector<int> world_ranks() const override { return members; }
  std::vector<int> members;

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }
  milliseconds delay{0};

 protected:
  void block() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, kSafety, [this] { return released_; });
    released_ = false;
  }
  void do_all_reduce(const CommBuf&, ReduceOp, const CollectiveOptions&) override { block(); }
  void do_reduce_scatter(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {
    std::this_thread::sleep_for(delay);
  }
  void do_all_gather(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {
    std::this_thread::sleep_for(delay);
  }
  void do_broadcast(const CommBuf&, int, const CollectiveOptions&) override {
    std::this_thread::sleep_for(delay);
  }
  void do_send(const CommBuf&, int, int, const CollectiveOptions&) override {
    std::this_thread::sleep_for(delay);
  }
  void do_recv(const CommBuf&, int, int, const CollectiveOptions&) override { block(); }
  void do_barrier(const CollectiveOptions&) override { block(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
};

// Collects reports and unblocks the stuck call, as the default action's _Exit would.
struct Recorder {
  std::mutex mutex;
  std::vector<HangReport> reports;
  StuckCommunicator* comm = nullptr;
  WatchdogOptions options(milliseconds poll) {
    return {.poll_interval = poll, .on_hang = [this](const HangReport& report) {
              {
                std::lock_guard<std::mutex> lock(mutex);
                reports.push_back(report);
              }
              if (comm != nullptr) comm->release();
            }};
  }
  std::vector<HangReport> snapshot() {
    std::lock_guard<std::mutex> lock(mutex);
    return reports;
  }
};

TEST(Watchdog, OffUnlessOneExists) {
  EXPECT_EQ(call_observer(), nullptr);
  {
    Recorder recorder;
    Watchdog watchdog(recorder.options(milliseconds(10)));
    EXPECT_EQ(call_observer(), &watchdog);
  }
  EXPECT_EQ(call_observer(), nullptr);
  StuckCommunicator comm("tp");
  std::vector<float> data(4, 1.0f);
  // No observer: nothing to tell.
  comm.broadcast(CommBuf::host(std::as_writable_bytes(std::span(data))), 0);
}

TEST(Watchdog, HungCollectiveIsReportedWithCallGroupLabelAndStep) {
  StuckCommunicator comm("tp");
  Recorder recorder;
  recorder.comm = &comm;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  watchdog.set_step(17);
  std::vector<float> data(8, 1.0f);
  const auto start = Clock::now();
  comm.all_reduce(CommBuf::host(std::span(data)), ReduceOp::kSum,
                  {.timeout = milliseconds(200), .label = "attn.o"});
  const double waited = seconds_since(start);
  // Released by the watchdog at its deadline, not by the fake's 5 s safety net.
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 0.2 + 0.5);
  const std::vector<HangReport> reports = recorder.snapshot();
  ASSERT_EQ(reports.size(), 1u);
  const HangReport& r = reports[0];
  EXPECT_EQ(r.call, "all_reduce");
  EXPECT_EQ(r.label, "attn.o");
  EXPECT_EQ(r.group, "tp");
  EXPECT_EQ(r.group_rank, 1);
  EXPECT_EQ(r.group_size, 2);
  EXPECT_EQ(r.peer, -1);
  EXPECT_EQ(r.world_rank, world().rank());
  EXPECT_EQ(r.step, 17);
  EXPECT_DOUBLE_EQ(r.timeout_s, 0.2);
  EXPECT_GE(r.waited_s, 0.2);
  EXPECT_TRUE(std::regex_search(
      r.message, std::regex("^\\[rank " + std::to_string(world().rank()) +
                            " on [^\\]]+\\] watchdog: all_reduce 'attn.o' in group 'tp' "
                            "\\(rank 1/2\\) has not completed after 0\\.[2-6] s \\(timeout "
                            "0\\.2 s\\) at step 17; .*aborting$")))
      << r.message;
  EXPECT_EQ(watchdog.in_flight(), 0u);
}

TEST(Watchdog, CallsThatCompleteInTimeDoNotFire) {
  StuckCommunicator comm("dp");
  comm.delay = milliseconds(30);
  Recorder recorder;
  Watchdog watchdog(recorder.options(milliseconds(10)));
  std::vector<float> in(8, 1.0f), out(4, 0.0f), gathered(16, 0.0f);
  const CollectiveOptions opts{.timeout = milliseconds(150), .label = "grad bucket 0"};
  // Each call takes 30 ms of a 150 ms timeout; together they outlast it, which must not
  // matter: the deadline is per call.
  for (int i = 0; i < 4; ++i) {
    comm.reduce_scatter(CommBuf::host(std::span(in)), CommBuf::host(std::span(out)), opts);
    comm.all_gather(CommBuf::host(std::span(out)), CommBuf::host(std::span(gathered).first(8)),
                    opts);
    comm.send(CommBuf::host(std::span(out)), 0, 3, opts);
  }
  EXPECT_EQ(watchdog.in_flight(), 0u);
  std::this_thread::sleep_for(milliseconds(300));  // past every deadline
  EXPECT_TRUE(recorder.snapshot().empty()) << recorder.snapshot()[0].message;
}

TEST(Watchdog, ZeroTimeoutMeansTheCommunicatorsDefault) {
  StuckCommunicator comm("pp");
  comm.set_default_timeout(milliseconds(150));
  Recorder recorder;
  recorder.comm = &comm;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  const auto start = Clock::now();
  comm.barrier();  // no label, no step set
  EXPECT_LT(seconds_since(start), 0.15 + 0.5);
  const std::vector<HangReport> reports = recorder.snapshot();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_DOUBLE_EQ(reports[0].timeout_s, 0.15);
  EXPECT_NE(reports[0].message.find("watchdog: barrier in group 'pp' (rank 1/2) has not "
                                    "completed after"),
            std::string::npos)
      << reports[0].message;
  EXPECT_NE(reports[0].message.find("before the first step"), std::string::npos);
}

TEST(Watchdog, RecvNamesThePeerItWaitsFor) {
  StuckCommunicator comm("pp");
  Recorder recorder;
  recorder.comm = &comm;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  watchdog.set_step(3);
  std::vector<float> data(4);
  comm.recv(CommBuf::host(std::span(data)), 0, 5,
            {.timeout = milliseconds(100), .label = "activations mb 2"});
  const std::vector<HangReport> reports = recorder.snapshot();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].peer, 0);
  EXPECT_NE(reports[0].message.find("recv 'activations mb 2' from rank 0 in group 'pp' (rank "
                                    "1/2)"),
            std::string::npos)
      << reports[0].message;
}

// With the hosts learnt, a point-to-point wait names the peer's world rank and host, and
// a batch names the rank it receives from ("with": a batch both sends and receives).
TEST(Watchdog, PointToPointNamesThePeersWorldRankAndHost) {
  Recorder recorder;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  watchdog.set_hosts({"node0", "node0", "node1", "node1", "node2", "node2"});
  watchdog.set_step(9);
  StuckCommunicator pp("pp", 3);
  pp.members = {1, 3, 5};  // group rank 0 is world rank 1, rank 2 is world rank 5
  recorder.comm = &pp;
  std::vector<float> data(4), other(4);
  pp.recv(CommBuf::host(std::span(data)), 0, 5, {.timeout = milliseconds(100), .label = "act"});
  const P2POp batch[] = {{.kind = P2POp::kSend, .buf = CommBuf::host(std::span(other)), .peer = 0},
                         {.kind = P2POp::kRecv, .buf = CommBuf::host(std::span(data)), .peer = 2}};
  pp.batch_p2p(batch, {.timeout = milliseconds(100), .label = "pipeline"});
  const std::vector<HangReport> reports = recorder.snapshot();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].peer, 0);
  EXPECT_EQ(reports[0].peer_world_rank, 1);
  EXPECT_EQ(reports[0].peer_host, "node0");
  EXPECT_NE(reports[0].message.find("recv 'act' from rank 0 in group 'pp' (rank 1/3) has not "
                                    "completed"),
            std::string::npos)
      << reports[0].message;
  EXPECT_NE(reports[0].message.find(" at step 9; rank 0 is world rank 1 on host node0; a peer"),
            std::string::npos)
      << reports[0].message;
  // The receive's peer, not the first op's.
  EXPECT_EQ(reports[1].peer, 2);
  EXPECT_NE(reports[1].message.find("batch_p2p 'pipeline' with rank 2 in group 'pp' (rank 1/3)"),
            std::string::npos)
      << reports[1].message;
  EXPECT_NE(reports[1].message.find("; rank 2 is world rank 5 on host node2; "), std::string::npos)
      << reports[1].message;
}

// A collective names the hosts of its group (each once, at most 8); without learnt hosts
// or members' world ranks the line is as before.
TEST(Watchdog, CollectiveNamesTheHostsOfItsGroup) {
  Recorder recorder;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  std::vector<std::string> hosts;
  for (int h = 0; h < 12; ++h) hosts.push_back("n" + std::to_string(h));
  std::vector<float> data(2);
  const CollectiveOptions opts{.timeout = milliseconds(100), .label = ""};
  StuckCommunicator dp("dp", 4);
  dp.members = {0, 1, 6, 7};
  recorder.comm = &dp;
  dp.all_reduce(CommBuf::host(std::span(data)), ReduceOp::kSum, opts);  // no hosts yet
  watchdog.set_hosts({"a", "a", "b", "b", "b", "b", "c", "c"});
  dp.all_reduce(CommBuf::host(std::span(data)), ReduceOp::kSum, opts);
  watchdog.set_hosts(hosts);
  StuckCommunicator world("world", 12);
  world.members.resize(12);
  std::iota(world.members.begin(), world.members.end(), 0);
  recorder.comm = &world;
  world.barrier(opts);
  StuckCommunicator unknown("tp");  // no members: no hosts
  recorder.comm = &unknown;
  unknown.barrier(opts);
  const std::vector<HangReport> r = recorder.snapshot();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].group_hosts.empty());
  EXPECT_EQ(r[0].message.find("host"), std::string::npos) << r[0].message;
  EXPECT_EQ(r[1].group_hosts, (std::vector<std::string>{"a", "c"}));
  EXPECT_NE(r[1].message.find("before the first step; the group's ranks are on hosts a, c; a "
                              "peer of this group is hung"),
            std::string::npos)
      << r[1].message;
  EXPECT_EQ(r[2].group_hosts.size(), 12u);
  EXPECT_NE(r[2].message.find("; the group's ranks are on hosts n0, n1, n2, n3, n4, n5, n6, n7 "
                              "and 4 more; a peer"),
            std::string::npos)
      << r[2].message;
  EXPECT_EQ(r[3].message.find("host"), std::string::npos) << r[3].message;
}

// Only the call that overstays is reported, and only once, among calls of other groups.
TEST(Watchdog, ReportsEachHungCallOnceAmongHealthyOnes) {
  StuckCommunicator stuck("tp");
  StuckCommunicator healthy("dp");
  healthy.delay = milliseconds(5);
  Recorder recorder;  // does not release: the fake's safety net ends the call
  Watchdog watchdog(recorder.options(milliseconds(10)));
  std::thread hung([&] {
    std::vector<float> data(2);
    stuck.all_reduce(CommBuf::host(std::span(data)), ReduceOp::kMax,
                     {.timeout = milliseconds(100), .label = "hung"});
  });
  std::vector<float> data(2);
  for (int i = 0; i < 40; ++i) {
    healthy.broadcast(CommBuf::host(std::as_writable_bytes(std::span(data))), 0,
                      {.timeout = milliseconds(100), .label = "healthy"});
  }
  std::this_thread::sleep_for(milliseconds(200));
  std::vector<HangReport> reports = recorder.snapshot();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].group, "tp");
  EXPECT_EQ(reports[0].label, "hung");
  EXPECT_EQ(watchdog.in_flight(), 1u);  // still stuck, reported once
  stuck.release();
  hung.join();
  EXPECT_EQ(watchdog.in_flight(), 0u);
  EXPECT_EQ(recorder.snapshot().size(), 1u);
}

// Real MPI traffic on every rank under a running watchdog: correct results, no report.
// The timeout is generous because -np 8 runs oversubscribed on two cores.
TEST(Watchdog, RealCollectivesThatCompleteDoNotFire) {
  Communicator& comm = world();
  Recorder recorder;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  const CollectiveOptions opts{.timeout = milliseconds(10000), .label = "watchdog check"};
  for (int step = 0; step < 5; ++step) {
    watchdog.set_step(step);
    std::vector<double> data(64, comm.rank() + 1.0);
    comm.all_reduce(CommBuf::host(std::span(data)), ReduceOp::kSum, opts);
    const double expected = comm.size() * (comm.size() + 1) / 2.0;
    EXPECT_EQ(data[0], expected);
    EXPECT_EQ(data[63], expected);
    comm.barrier(opts);
  }
  EXPECT_EQ(watchdog.in_flight(), 0u);
  comm.barrier(opts);
  EXPECT_TRUE(recorder.snapshot().empty()) << recorder.snapshot()[0].message;
}

// The MPI backend knows its members' world ranks, in a split child too, and learn_hosts
// gathers every rank's host name (on this machine the same for all).
TEST(Watchdog, MpiGroupsKnowTheirMembersAndTheHostsAreLearnt) {
  Communicator& comm = world();
  std::vector<int> all(static_cast<std::size_t>(comm.size()));
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(comm.world_ranks(), all);
  // Ranks of one parity, the highest first (key = -rank).
  std::unique_ptr<Communicator> parity = comm.split(comm.rank() % 2, -comm.rank(), "parity");
  ASSERT_NE(parity, nullptr);
  std::vector<int> expected;
  for (int r = comm.size() - 1; r >= 0; --r) {
    if (r % 2 == comm.rank() % 2) expected.push_back(r);
  }
  EXPECT_EQ(parity->world_ranks(), expected);
  EXPECT_EQ(parity->world_ranks()[static_cast<std::size_t>(parity->rank())], comm.rank());

  Recorder recorder;
  Watchdog watchdog(recorder.options(milliseconds(20)));
  EXPECT_TRUE(watchdog.hosts().empty());
  watchdog.learn_hosts(comm);
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(watchdog.hosts(), std::vector<std::string>(static_cast<std::size_t>(comm.size()), host));
  StuckCommunicator stuck("tp");
  stuck.members = {comm.rank(), comm.size() - 1};
  recorder.comm = &stuck;
  std::vector<float> data(2);
  stuck.recv(CommBuf::host(std::span(data)), 0, 1, {.timeout = milliseconds(100), .label = ""});
  const std::vector<HangReport> r = recorder.snapshot();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].peer_world_rank, comm.rank());
  EXPECT_EQ(r[0].peer_host, host);
  comm.barrier();
}

}  // namespace
}  // namespace trident::test
