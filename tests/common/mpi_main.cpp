// main() of every MPI test binary (tests/<folder>/*_mpi_test.cpp), run under mpirun
// (CMakeLists.txt registers -np 1, 2, 4, 8).
// - Initializes MPI itself (so make_world_communicator must cope with an initialized
//   MPI and leave finalizing to us), then makes the world communicator.
// - Rank 0 prints gtest's usual output; other ranks print only their failures, tagged
//   "[rank N]", so a failure on any rank is visible once.
// - The exit code is agreed over all ranks (max), so any rank's failed assertion makes
//   every rank, hence mpirun, hence ctest, fail.
// - Two extra modes for the CTest checks of the failure paths themselves:
//   --abort_demo=self_send: the last rank sends to itself (an argument CHECK);
//   --abort_demo=truncate: rank 0 sends 8 floats, the last rank receives 4 (an MPI error,
//   MPI_ERR_TRUNCATE, that must reach TRIDENT_MPI_CHECK rather than MPI's own handler).
//   Either way the message must name rank, group and collective (PASS_REGULAR_EXPRESSION).
//   --abort_demo=hang: the hang watchdog (comm/watchdog.h) runs on every rank; the
//   last rank sleeps outside any collective (a hung peer) while the others enter an
//   all_reduce with a 2 s timeout at step 17; their watchdogs must end the job, naming
//   the all_reduce, its group and the step (mpi_watchdog_names_culprit_np2).
#include <gtest/gtest.h>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/watchdog.h"
#include "tests/common/mpi_test_util.h"

namespace trident::test {

namespace {
Communicator* g_world = nullptr;  // set once in main before any test runs
Communicator* g_device_world = nullptr;

// Prints only failed assertions, with the rank, for ranks other than 0.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};
}  // namespace

Communicator& world() { return *g_world; }
Communicator& device_world() { return *g_device_world; }

}  // namespace trident::test

int main(int argc, char** argv) {
  int provided = 0;
  // MULTIPLE, as make_world_communicator asks: the async collectives' threads need it.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  std::string abort_demo;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--abort_demo=", 13) == 0) abort_demo = argv[i] + 13;
  }

  int rc = 0;
  {
    std::unique_ptr<trident::Communicator> world = trident::make_world_communicator(&argc, &argv);
    trident::test::g_world = world.get();
    std::unique_ptr<trident::Communicator> device_world =
        world->split(0, world->rank(), "world", trident::MemSpace::kDevice);
    trident::test::g_device_world = device_world.get();
    const int rank = world->rank();

    if (!abort_demo.empty()) {
      std::vector<float> data(8, 1.0f);
      const int last = world->size() - 1;
      if (abort_demo == "self_send" && rank == last) {
        // aborts: no send to self
        world->send(trident::CommBuf::host(std::span(data)), rank, 7, {.label = "abort demo"});
      } else if (abort_demo == "truncate") {
        if (rank == 0) {
          world->send(trident::CommBuf::host(std::span(data)), last, 7, {.label = "abort demo"});
        }
        if (rank == last) {
          world->recv(trident::CommBuf::host(std::span(data).first(4)), 0, 7,
                      {.label = "abort demo"});
        }
      } else if (abort_demo == "hang") {
        trident::Watchdog watchdog({.poll_interval = std::chrono::milliseconds(100), .on_hang = {}});
        watchdog.set_step(17);
        // The hung rank: mpirun kills it once a watchdog has ended another rank.
        if (rank == last) std::this_thread::sleep_for(std::chrono::seconds(60));
        // For measuring how long after the deadline the job ends (the CTest entry prints
        // the epoch time at which mpirun returned).
        const auto epoch = std::chrono::system_clock::now().time_since_epoch();
        std::fprintf(stderr, "hang demo: rank %d enters the all_reduce at epoch ms %lld\n", rank,
                     static_cast<long long>(
                         std::chrono::duration_cast<std::chrono::milliseconds>(epoch).count()));
        std::fflush(stderr);
        world->all_reduce(trident::CommBuf::host(std::span(data)), trident::ReduceOp::kSum,
                          {.timeout = std::chrono::milliseconds(2000), .label = "watchdog demo"});
      }
      world->barrier();  // the others wait here until mpirun takes the job down
      std::fprintf(stderr, "abort demo: the job should not get here\n");
      return 0;  // rc 0 on purpose: the CTest check looks for the CHECK message
    }

    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new trident::test::RankFailurePrinter(rank));
    }
    rc = RUN_ALL_TESTS();

    // Agree on the outcome: every rank exits non-zero if any rank failed.
    int any_failed = rc != 0 ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    std::vector<int> failed_by_rank(world->size(), 0);
    const int mine = rc != 0 ? 1 : 0;
    MPI_Gather(&mine, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0 && any_failed) {
      std::string ranks;
      for (int r = 0; r < world->size(); ++r)
        if (failed_by_rank[r]) ranks.append(" ").append(std::to_string(r));
      const std::string binary = std::filesystem::path(argv[0]).filename().string();
      std::fprintf(stderr, "%s: failures on rank(s)%s of %d\n", binary.c_str(), ranks.c_str(),
                   world->size());
    }
    rc = any_failed ? 1 : 0;
    trident::test::g_world = nullptr;
    trident::test::g_device_world = nullptr;
  }  // the world communicator is freed before MPI_Finalize
  MPI_Finalize();
  return rc;
}
