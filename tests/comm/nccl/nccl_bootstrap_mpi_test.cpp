// The NCCL bootstrap (comm/nccl/nccl_bootstrap.h) under mpirun: every rank gets the same
// unique-id bytes over MPI and through the file rendezvous, a rendezvous that never sees
// its file times out naming it, and without a GPU NCCL's initialisation fails with its
// reason on every rank instead of hanging.
#if TRIDENT_HAVE_NCCL

#include "comm/nccl/nccl_bootstrap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/mpi_test_util.h"

namespace trident {
namespace {

// Every rank's id, gathered over the world.
std::vector<NcclUniqueId> gather_ids(Communicator& w, const NcclUniqueId& mine) {
  std::vector<std::byte> all(kNcclUniqueIdBytes * static_cast<size_t>(w.size()));
  w.all_gather(CommBuf::host(std::span<const std::byte>(mine)), CommBuf::host(std::span(all)));
  std::vector<NcclUniqueId> ids(static_cast<size_t>(w.size()));
  for (size_t r = 0; r < ids.size(); ++r) {
    std::copy_n(all.begin() + static_cast<ptrdiff_t>(r * kNcclUniqueIdBytes), kNcclUniqueIdBytes,
                ids[r].begin());
  }
  return ids;
}

void expect_one_nonzero_id(const std::vector<NcclUniqueId>& ids) {
  for (size_t r = 1; r < ids.size(); ++r) EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
  EXPECT_TRUE(std::any_of(ids[0].begin(), ids[0].end(), [](std::byte b) { return b != std::byte{0}; }));
}

TEST(NcclBootstrap, EveryRankGetsRankZerosUniqueIdOverMpi) {
  Communicator& w = test::world();
  Result<NcclUniqueId> id = share_nccl_unique_id(w);
  ASSERT_TRUE(id.is_ok()) << id.status().message();
  expect_one_nonzero_id(gather_ids(w, id.value()));
}

TEST(NcclBootstrap, TheFileRendezvousGivesEveryRankTheSameId) {
  Communicator& w = test::world();
  // A directory every rank sees, named by rank 0's pid so concurrent jobs do not meet.
  long pid = static_cast<long>(getpid());
  w.broadcast(CommBuf::host(std::span<long>(&pid, 1)), 0);
  const std::string dir = "/tmp/trident_nccl_rendezvous_" + std::to_string(pid);
  // A pid repeats on a fresh machine: an id file an earlier run left there is not ours.
  if (w.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  w.barrier();
  Result<NcclUniqueId> id =
      rendezvous_nccl_unique_id(dir, "job1.step0", w.rank(), std::chrono::seconds(20));
  ASSERT_TRUE(id.is_ok()) << id.status().message();
  expect_one_nonzero_id(gather_ids(w, id.value()));
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(NcclBootstrap, ARendezvousWithoutItsFileTimesOutNamingIt) {
  const std::string dir = "/tmp/trident_nccl_rendezvous_missing_" + std::to_string(getpid());
  Result<NcclUniqueId> id =
      rendezvous_nccl_unique_id(dir, "never", 1, std::chrono::milliseconds(50));
  ASSERT_FALSE(id.is_ok());
  EXPECT_NE(id.status().message().find(dir + "/nccl_id.never"), std::string::npos)
      << id.status().message();
  EXPECT_NE(id.status().message().find("rank 1 waited 50 ms"), std::string::npos)
      << id.status().message();
}

TEST(NcclBootstrap, WithoutAGpuInitialisationFailsWithNcclsReason) {
  Communicator& w = test::world();
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is visible: the GPU check runs NCCL";
  Result<NcclUniqueId> id = share_nccl_unique_id(w);
  ASSERT_TRUE(id.is_ok()) << id.status().message();
  const Status s = init_nccl_world(id.value(), w.size(), w.rank());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank " + std::to_string(w.rank()) + " of " +
                             std::to_string(w.size()) + ": ncclCommInitRankConfig failed"),
            std::string::npos)
      << s.message();
  EXPECT_NE(nccl_version_string().find("NCCL 2."), std::string::npos) << nccl_version_string();
}

}  // namespace
}  // namespace trident

#endif  // TRIDENT_HAVE_NCCL
