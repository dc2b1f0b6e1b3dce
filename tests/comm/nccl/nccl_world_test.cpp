// NCCL on one GPU (comm/nccl/nccl_bootstrap.h): a world of one (the id shared over a
// one-process host communicator) initialises, checks and tears down. NCCL refuses two
// ranks on one GPU, so this is what a one-GPU machine can run (scripts/gpu_check.sh runs
// comm_nccl_tests there); without a device it must fail with NCCL's reason, not hang.
#include "comm/nccl/nccl_bootstrap.h"

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace trident {
namespace {

TEST(NcclWorldOfOne, InitialisesOnAGpuAndFailsCleanlyWithout) {
  SelfCommunicator host("world");
  Result<NcclUniqueId> id = share_nccl_unique_id(host);
  ASSERT_TRUE(id.is_ok()) << id.status().message();
  const Status s = init_nccl_world(id.value(), 1, 0);
  if (visible_cuda_devices() == 0) {
    ASSERT_FALSE(s.is_ok()) << "NCCL initialised without a GPU?";
    EXPECT_NE(s.message().find("rank 0 of 1: ncclCommInitRankConfig failed"), std::string::npos)
        << s.message();
    GTEST_SKIP() << "no CUDA device; without one NCCL failed as it should: " << s.message();
  }
  EXPECT_TRUE(s.is_ok()) << s.message() << " (" << nccl_version_string() << ")";
}

}  // namespace
}  // namespace trident
