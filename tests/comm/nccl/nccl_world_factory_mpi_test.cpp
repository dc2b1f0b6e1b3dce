// The NCCL world factory (comm/nccl_world.h) under mpirun without a GPU: every rank gets
// an error naming its rank and the missing device, fast (the ranks agree over MPI before
// anyone enters NCCL, so none waits in ncclCommInitRankConfig for a peer that gave up).
#if TRIDENT_HAVE_NCCL

#include <gtest/gtest.h>

#include "comm/nccl_world.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "tests/common/mpi_test_util.h"

namespace trident {
namespace {

TEST(NcclWorldFactory, WithoutAGpuEveryRankFailsFastNamingItsRank) {
  Communicator& w = test::world();
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is visible: the GPU check runs NCCL";
  ASSERT_TRUE(build_has_nccl());
  const Timer timer;
  Result<std::unique_ptr<Communicator>> world =
      make_nccl_world(w.split(0, w.rank(), "world", MemSpace::kHost));
  ASSERT_FALSE(world.is_ok()) << "an NCCL world without a GPU?";
  EXPECT_LT(timer.elapsed_s(), 10.0);
  const std::string want = "NCCL world: rank " + std::to_string(w.rank()) + " of " +
                           std::to_string(w.size()) +
                           ": no usable CUDA device (cudaGetDeviceCount: ";
  EXPECT_NE(world.status().message().find(want), std::string::npos) << world.status().message();
  w.barrier();  // every rank is back: nobody hangs in the factory
}

}  // namespace
}  // namespace trident

#endif  // TRIDENT_HAVE_NCCL
