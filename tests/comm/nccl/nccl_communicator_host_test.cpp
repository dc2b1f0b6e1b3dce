// The NCCL backend's host side (comm/nccl/nccl_communicator.h, nccl_abort.h), run without
// a GPU: the dtype / reduce-op / split-color tables against nccl.h, the messages (NCCL
// error name and text, the timeout line naming call, group, rank and label), the world
// factory failing cleanly and fast without a device, and the abort path (newest first,
// once, exit 1 within its bound even when an abort hangs).
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_abort.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl_world.h"
#include "core/timer.h"
#include "kernels/backend.h"

namespace trident {
namespace {

TEST(NcclMapping, EveryDtypeMapsToItsNcclType) {
  const struct {
    DType dtype;
    ncclDataType_t nccl;
    const char* name;
  } table[] = {
      {DType::kF32, ncclFloat32, "ncclFloat32"}, {DType::kBF16, ncclBfloat16, "ncclBfloat16"},
      {DType::kI32, ncclInt32, "ncclInt32"},     {DType::kF64, ncclFloat64, "ncclFloat64"},
      {DType::kI64, ncclInt64, "ncclInt64"},     {DType::kU8, ncclUint8, "ncclUint8"}};
  for (const auto& row : table) {
    ASSERT_TRUE(nccl_data_type(row.dtype).has_value()) << dtype_name(row.dtype);
    EXPECT_EQ(*nccl_data_type(row.dtype), static_cast<int>(row.nccl)) << dtype_name(row.dtype);
    EXPECT_STREQ(nccl_data_type_name(row.dtype), row.name);
  }
}

TEST(NcclMapping, ReduceOpsAndSplitColors) {
  EXPECT_EQ(nccl_red_op(ReduceOp::kSum), static_cast<int>(ncclSum));
  EXPECT_EQ(nccl_red_op(ReduceOp::kMax), static_cast<int>(ncclMax));
  EXPECT_EQ(nccl_split_color(kNoGroup), NCCL_SPLIT_NOCOLOR);
  EXPECT_EQ(nccl_split_color(0), 0);
  EXPECT_EQ(nccl_split_color(7), 7);
}

TEST(NcclMessages, AResultNamesTheErrorNcclsTextAndTheLastError) {
  const std::string text = nccl_result_text(
      ncclUnhandledCudaError, "Cuda failure 35 'CUDA driver version is insufficient'");
  EXPECT_EQ(text.rfind("ncclUnhandledCudaError (1): ", 0), 0u) << text;
  EXPECT_NE(text.find(ncclGetErrorString(ncclUnhandledCudaError)), std::string::npos) << text;
  EXPECT_NE(text.find(": Cuda failure 35 'CUDA driver version is insufficient'"), std::string::npos)
      << text;
  EXPECT_EQ(nccl_result_text(ncclRemoteError, nullptr).rfind("ncclRemoteError (6): ", 0), 0u);
  const std::string bare = nccl_result_text(ncclInvalidUsage, "");
  EXPECT_EQ(bare, std::string("ncclInvalidUsage (5): ") + ncclGetErrorString(ncclInvalidUsage));
}

TEST(NcclMessages, ATimeoutNamesCallLabelGroupRankAndTimes) {
  const std::string m =
      nccl_timeout_message("dp", 1, 4, "all_reduce", "grad bucket 3",
                           std::chrono::milliseconds(31000), std::chrono::milliseconds(30000));
  EXPECT_EQ(m,
            "NCCL: all_reduce 'grad bucket 3' in group 'dp' (rank 1/4) still in progress after "
            "31000 ms (timeout 30000 ms + 1000 ms grace); aborting every NCCL communicator");
  EXPECT_EQ(nccl_timeout_message("tp", 0, 2, "split", "", std::chrono::milliseconds(5),
                                 std::chrono::milliseconds(4))
                .rfind("NCCL: split in group 'tp' (rank 0/2) still", 0),
            0u);
}

TEST(NcclWorld, WithoutAGpuTheFactoryFailsFastNamingTheRank) {
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is visible: the GPU tests run the world";
  const std::size_t before = registered_nccl_aborts();
  const Timer timer;
  Result<std::unique_ptr<Communicator>> world =
      make_nccl_world_communicator(std::make_unique<SelfCommunicator>("world"));
  ASSERT_FALSE(world.is_ok()) << "an NCCL world without a GPU?";
  EXPECT_LT(timer.elapsed_s(), 10.0) << "failing must not wait for a timeout";
  EXPECT_NE(world.status().message().find(
                "NCCL world: rank 0 of 1: no usable CUDA device (cudaGetDeviceCount: "),
            std::string::npos)
      << world.status().message();
  // ... and the launch environment this rank saw.
  EXPECT_NE(world.status().message().find(" (" + launch_environment() + ")"), std::string::npos)
      << world.status().message();
  EXPECT_EQ(registered_nccl_aborts(), before) << "a failed world left an abort registered";
}

TEST(NcclMessages, AFailedWorldNamesNcclsReasonAndTheLaunchEnvironment) {
  const std::string reason =
      "ncclCommInitRankConfig failed: " +
      nccl_result_text(ncclSystemError, "socketStartConnect: Connect to 10.0.0.2<43123> failed");
  const std::string env =
      "launcher OMPI_COMM_WORLD_SIZE; OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "
      "OMPI_COMM_WORLD_LOCAL_RANK=1; CUDA_VISIBLE_DEVICES=1";
  EXPECT_EQ(nccl_world_error_text(1, 2, reason, env),
            std::string("NCCL world: rank 1 of 2: ncclCommInitRankConfig failed: ncclSystemError "
                        "(2): ") +
                ncclGetErrorString(ncclSystemError) +
                ": socketStartConnect: Connect to 10.0.0.2<43123> failed (" + env + ")");
}

TEST(NcclWorld, TheCommFacadeHasNcclAndFailsTheSameWay) {
  EXPECT_TRUE(build_has_nccl());
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is visible: the GPU tests run the world";
  Result<std::unique_ptr<Communicator>> world =
      make_nccl_world(std::make_unique<SelfCommunicator>("world"), {.device = 0});
  ASSERT_FALSE(world.is_ok());
  EXPECT_NE(world.status().message().find("NCCL world: rank 0 of 1: no usable CUDA device"),
            std::string::npos)
      << world.status().message();
}

TEST(NcclAbort, RunsEveryActionOnceNewestFirst) {
  std::vector<int> order;
  const std::uint64_t a =
      register_nccl_abort("group 'world' (rank 0/1)", [&] { order.push_back(1); });
  const std::uint64_t b = register_nccl_abort("group 'dp' (rank 0/1)", [&] { order.push_back(2); });
  register_nccl_abort("group 'tp' (rank 0/1)", [&] { order.push_back(3); });
  unregister_nccl_abort(b);
  unregister_nccl_abort(b);  // twice: a no-op
  EXPECT_EQ(registered_nccl_aborts(), 2u);
  const NcclAbortOutcome outcome = abort_nccl_communicators(std::chrono::seconds(5));
  EXPECT_EQ(order, (std::vector<int>{3, 1}));
  EXPECT_EQ(outcome.aborted, 2u);
  EXPECT_EQ(outcome.pending, 0u);
  EXPECT_EQ(outcome.names, "group 'tp' (rank 0/1), group 'world' (rank 0/1)");
  EXPECT_EQ(registered_nccl_aborts(), 0u);
  unregister_nccl_abort(a);  // already run: a no-op
  EXPECT_EQ(abort_nccl_communicators(std::chrono::seconds(1)).aborted, 0u);
  EXPECT_EQ(order.size(), 2u) << "an action ran twice";
  EXPECT_EQ(nccl_abort_summary(outcome, std::chrono::seconds(2)),
            "watchdog: aborted 2 NCCL communicators (group 'tp' (rank 0/1), group 'world' (rank "
            "0/1)); exiting 1");
}

TEST(NcclAbortDeathTest, ExitsOneWithinItsBoundEvenWhenAnAbortHangs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Timer timer;
  EXPECT_EXIT(
      {
        // The world's abort hangs; the child's (newer, so first) returns.
        register_nccl_abort("group 'world' (rank 0/1)",
                            [] { std::this_thread::sleep_for(std::chrono::hours(1)); });
        register_nccl_abort("group 'dp' (rank 0/1)", [] {});
        abort_nccl_and_exit("[rank 0] watchdog: all_reduce 'x' in group 'dp' hung",
                            std::chrono::milliseconds(300));
      },
      testing::ExitedWithCode(1),
      "watchdog: all_reduce 'x' in group 'dp' hung\n.*1 of 2 NCCL communicators not aborted "
      "after 0.3 s \\(group 'dp' \\(rank 0/1\\), group 'world' \\(rank 0/1\\)\\); exiting 1 "
      "anyway");
  EXPECT_LT(timer.elapsed_s(), 10.0);
}

TEST(NcclAbortDeathTest, TheWatchdogHandlerReportsTheHangAndExitsOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  HangReport report;
  report.message =
      "[rank 0 on n1] watchdog: all_reduce 'attn.o' in group 'tp' (rank 1/2) has not completed "
      "after 2.0 s (timeout 2.0 s) at step 17; aborting";
  EXPECT_EXIT(
      {
        register_nccl_abort("group 'tp' (rank 1/2)", [] {});
        nccl_hang_handler(std::chrono::milliseconds(500))(report);
      },
      testing::ExitedWithCode(1),
      "in group 'tp' \\(rank 1/2\\) has not completed after 2.0 s \\(timeout 2.0 s\\) at step 17; "
      "aborting\nwatchdog: aborted 1 NCCL communicator \\(group 'tp' \\(rank 1/2\\)\\); exiting 1");
}

}  // namespace
}  // namespace trident
