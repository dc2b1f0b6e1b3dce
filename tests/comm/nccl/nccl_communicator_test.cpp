// GPU tests of the NCCL backend (comm/nccl/nccl_communicator.h) on a world of one, the
// only NCCL world a one-GPU machine can make (NCCL refuses two ranks on one device):
// the world from the factory, device splits (NCCL groups of one, forced with
// nccl_groups_of_one; and the default SelfCommunicator for a group of one; and kNoGroup,
// and host splits), every
// collective in f32 and bf16 (all_reduce also f64 and i64, sum and max) against host
// references, both stream modes (host-synchronous and stream-ordered on a caller's
// stream), traffic counting, and the abort path (in process, and abort-and-exit in a
// child). Each test skips ("no CUDA device: ...") without a device. Send/recv and
// batch_p2p need a peer (peer != rank), so a world of one cannot run them: they wait
// for a multi-GPU machine (tests/comm/collectives_mpi_test.cpp, parametrised by backend).
// scripts/gpu_check.sh's nccl step runs this file's tests (--gtest_filter=Nccl*).
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl/nccl_abort.h"
#include "core/tensor.h"

namespace trident {
namespace {

struct World {
  std::unique_ptr<Communicator> world;
  std::string skip;  // why there is none
};

// groups_of_one: NCCL for the groups of one too (the tests of the NCCL collectives: a
// world of one has no other groups); false: the production default (SelfCommunicators).
World make_world(void* stream = nullptr, bool nccl_groups_of_one = true) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return {nullptr, std::string("no CUDA device: ") +
                         (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")};
  }
  NcclWorldOptions options;
  options.device = 0;
  options.compute_stream = stream;
  options.nccl_groups_of_one = nccl_groups_of_one;
  Result<std::unique_ptr<Communicator>> w =
      make_nccl_world_communicator(std::make_unique<SelfCommunicator>("world"), options);
  if (!w.is_ok())
    return {nullptr, "a GPU is visible but the NCCL world failed: " + w.status().message()};
  return {std::move(w).value(), ""};
}

#define TRIDENT_REQUIRE_NCCL_WORLD(name, ...)                                               \
  World name##_made = make_world(__VA_ARGS__);                                              \
  if (!name##_made.world) {                                                                 \
    if (name##_made.skip.rfind("no CUDA device", 0) == 0) GTEST_SKIP() << name##_made.skip; \
    FAIL() << name##_made.skip;                                                             \
  }                                                                                         \
  Communicator& name = *name##_made.world

// A device copy of host values; freed at scope end.
class DeviceArray {
 public:
  template <class T>
  explicit DeviceArray(const std::vector<T>& host)
      : bytes_(host.size() * sizeof(T)), count_(host.size()) {
    dtype_ = dtype_of<T>();
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ == 0 ? 1 : bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  CommBuf buf() const { return CommBuf(ptr_, count_, dtype_, MemSpace::kDevice); }
  template <class T>
  std::vector<T> host() const {
    std::vector<T> v(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_, count_;
  DType dtype_;
};

std::vector<float> values_f32(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return v;
}
std::vector<bf16_t> values_bf16(std::size_t n) {
  std::vector<bf16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float_to_bf16(0.125f * static_cast<float>(i) - 1.0f);
  return v;
}

TEST(NcclWorldGpu, TheWorldIsHostSpaceAndSplitsIntoDeviceGroups) {
  TRIDENT_REQUIRE_NCCL_WORLD(w);
  EXPECT_STREQ(w.backend(), "nccl");
  EXPECT_EQ(w.space(), MemSpace::kHost);
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.size(), 1);
  // Host values go to the host world.
  double x = 2.5;
  w.all_reduce(CommBuf::host(std::span<double>(&x, 1)), ReduceOp::kSum);
  EXPECT_EQ(x, 2.5);
  w.set_default_timeout(std::chrono::seconds(30));
  std::unique_ptr<Communicator> dp = w.split(0, 0, "dp", MemSpace::kDevice, {.label = "dp group"});
  ASSERT_NE(dp, nullptr);
  EXPECT_STREQ(dp->backend(), "nccl");
  EXPECT_EQ(dp->space(), MemSpace::kDevice);
  EXPECT_EQ(dp->name(), "dp");
  EXPECT_EQ(dp->rank(), 0);
  EXPECT_EQ(dp->size(), 1);
  EXPECT_EQ(dp->default_timeout(), std::chrono::seconds(30));
  EXPECT_EQ(w.split(kNoGroup, 0, "none", MemSpace::kDevice), nullptr);
  std::unique_ptr<Communicator> host = w.split(0, 0, "host twin", MemSpace::kHost);
  ASSERT_NE(host, nullptr);
  EXPECT_STREQ(host->backend(), "self");
  // A device group splits again (ncclCommSplit of a split), and a barrier runs.
  std::unique_ptr<Communicator> tp = dp->split(0, 0, "tp", MemSpace::kDevice);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->size(), 1);
  tp->barrier();
  EXPECT_GE(registered_nccl_aborts(), 3u);  // world, dp, tp
}

void all_reduce_case(Communicator& dp) {
  // World of one: the sum and the max are the input, exactly (no rounding anywhere).
  {
    const std::vector<float> v = values_f32(1001);
    DeviceArray d(v);
    dp.all_reduce(d.buf(), ReduceOp::kSum, {.label = "f32 sum"});
    EXPECT_EQ(d.host<float>(), v);
    dp.all_reduce(d.buf(), ReduceOp::kMax, {.label = "f32 max"});
    EXPECT_EQ(d.host<float>(), v);
  }
  {
    const std::vector<bf16_t> v = values_bf16(777);
    DeviceArray d(v);
    dp.all_reduce(d.buf(), ReduceOp::kSum, {.label = "bf16 sum"});
    EXPECT_EQ(d.host<bf16_t>(), v);
    dp.all_reduce(d.buf(), ReduceOp::kMax, {.label = "bf16 max"});
    EXPECT_EQ(d.host<bf16_t>(), v);
  }
  {
    const std::vector<double> v = {1.5, -2.25, 1e300};
    DeviceArray d(v);
    dp.all_reduce(d.buf(), ReduceOp::kSum);
    EXPECT_EQ(d.host<double>(), v);
  }
  {
    const std::vector<std::int64_t> v = {std::int64_t{1} << 60, -7, 0};
    DeviceArray d(v);
    dp.all_reduce(d.buf(), ReduceOp::kMax);
    EXPECT_EQ(d.host<std::int64_t>(), v);
  }
}

template <class T>
void chunked_case(Communicator& dp, const std::vector<T>& v) {
  DeviceArray in(v);
  DeviceArray out(std::vector<T>(v.size()));
  dp.reduce_scatter(in.buf(), out.buf(), {.label = "rs"});
  EXPECT_EQ(out.host<T>(), v);
  DeviceArray gathered(std::vector<T>(v.size()));
  dp.all_gather(out.buf(), gathered.buf(), {.label = "ag"});
  EXPECT_EQ(gathered.host<T>(), v);
  dp.broadcast(gathered.buf(), 0, {.label = "bcast"});
  EXPECT_EQ(gathered.host<T>(), v);
}

TEST(NcclWorldGpu, CollectivesMatchTheHostReferenceHostSynchronous) {
  TRIDENT_REQUIRE_NCCL_WORLD(w);
  std::unique_ptr<Communicator> dp = w.split(0, 0, "dp", MemSpace::kDevice);
  ASSERT_NE(dp, nullptr);
  all_reduce_case(*dp);
  chunked_case(*dp, values_f32(513));
  chunked_case(*dp, values_bf16(513));
  // Counted by the base class, in the buffer's dtype.
  EXPECT_EQ(dp->traffic().calls_of(CollectiveKind::kAllReduce), 6);
  EXPECT_EQ(dp->traffic().bytes_of(CollectiveKind::kReduceScatter), 513 * 4 + 513 * 2);
}

// all_to_all on an NCCL group of one: the own chunk (a stream-ordered device copy) is the
// whole exchange; a zero-count call still runs. Peers need a multi-GPU machine.
TEST(NcclWorldGpu, AllToAllOfAGroupOfOneIsItsOwnChunk) {
  TRIDENT_REQUIRE_NCCL_WORLD(w);
  std::unique_ptr<Communicator> ep = w.split(0, 0, "ep", MemSpace::kDevice);
  ASSERT_NE(ep, nullptr);
  EXPECT_STREQ(ep->backend(), "nccl");
  const std::vector<float> v = values_f32(257);
  DeviceArray in(v);
  DeviceArray out(std::vector<float>(v.size(), -1.0f));
  const std::vector<std::size_t> counts = {v.size()}, zero = {0};
  ep->all_to_all(in.buf(), counts, out.buf(), counts, {.label = "dispatch"});
  EXPECT_EQ(out.host<float>(), v);
  ep->all_to_all(CommBuf(nullptr, 0, DType::kF32, MemSpace::kDevice), zero,
                 CommBuf(nullptr, 0, DType::kF32, MemSpace::kDevice), zero);
  EXPECT_EQ(ep->traffic().calls_of(CollectiveKind::kAllToAll), 2);
  EXPECT_EQ(ep->traffic().bytes_of(CollectiveKind::kAllToAll), 257 * 4);
}

TEST(NcclWorldGpu, CollectivesAreStreamOrderedOnTheCallersStream) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device: cannot create a stream";
  }
  {
    TRIDENT_REQUIRE_NCCL_WORLD(w, stream);
    std::unique_ptr<Communicator> tp = w.split(0, 0, "tp", MemSpace::kDevice);
    ASSERT_NE(tp, nullptr);
    // Upload on the stream, all-reduce, then download on the stream: the collective must
    // sit between the two in stream order (no host sync in between).
    const std::vector<float> v = values_f32(1 << 20);
    std::vector<float> back(v.size(), 0.0f);
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, v.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
        cudaSuccess);
    tp->all_reduce(CommBuf(d, v.size(), DType::kF32, MemSpace::kDevice), ReduceOp::kSum);
    ASSERT_EQ(
        cudaMemcpyAsync(back.data(), d, v.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(back, v);
    cudaFree(d);
    chunked_case(*tp, values_bf16(64));
  }
  cudaStreamDestroy(stream);
}

// The async path (overlap): on the communication stream, joined to the caller's stream by
// wait(). A world of one: all-reduce leaves the values, reduce-scatter and all-gather copy
// them; the download, queued on the caller's stream after wait(), must see the result.
TEST(NcclWorldGpu, AsyncCollectivesJoinTheCallersStream) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device: cannot create a stream";
  }
  {
    TRIDENT_REQUIRE_NCCL_WORLD(w, stream);
    std::unique_ptr<Communicator> dp = w.split(0, 0, "dp", MemSpace::kDevice);
    ASSERT_NE(dp, nullptr);
    const std::vector<float> v = values_f32(1 << 20);
    const std::size_t bytes = v.size() * sizeof(float);
    float* a = nullptr;
    float* b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
    const CommBuf da(a, v.size(), DType::kF32, MemSpace::kDevice);
    const CommBuf db(b, v.size(), DType::kF32, MemSpace::kDevice);
    for (const char* which : {"all_reduce", "reduce_scatter", "all_gather"}) {
      SCOPED_TRACE(which);
      ASSERT_EQ(cudaMemcpyAsync(a, v.data(), bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(b, 0, bytes, stream), cudaSuccess);
      const std::string kind = which;
      CommWork work = kind == "all_reduce"       ? dp->iall_reduce(da, ReduceOp::kSum)
                      : kind == "reduce_scatter" ? dp->ireduce_scatter(da, db)
                                                 : dp->iall_gather(da, db);
      work.wait();
      std::vector<float> back(v.size(), -1.0f);
      ASSERT_EQ(cudaMemcpyAsync(back.data(), kind == "all_reduce" ? a : b, bytes,
                                cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(back, v);
    }
    EXPECT_EQ(dp->outstanding_work(), 0u);
    // A work finished by test() has completed on the device: its own running time (CUDA
    // events) goes into times(). (One finished by wait() may not have completed yet.)
    dp->reset_traffic();
    CommWork polled = dp->iall_reduce(da, ReduceOp::kSum);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!polled.test() && std::chrono::steady_clock::now() < until) {
    }
    ASSERT_TRUE(polled.finished());
    EXPECT_GT(dp->times().async_s, 0.0);
    cudaFree(a);
    cudaFree(b);
  }
  cudaStreamDestroy(stream);
}

// The production default: a group of one is a SelfCommunicator (no NCCL communicator),
// its copies cudaMemcpyAsync on the caller's stream, sync and async, in stream order.
TEST(NcclWorldGpu, AGroupOfOneIsASelfCommunicatorOrderedOnTheCallersStream) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device: cannot create a stream";
  }
  {
    TRIDENT_REQUIRE_NCCL_WORLD(w, stream, /*nccl_groups_of_one=*/false);
    const std::size_t aborts = registered_nccl_aborts();
    std::unique_ptr<Communicator> dp = w.split(0, 0, "dp", MemSpace::kDevice);
    ASSERT_NE(dp, nullptr);
    EXPECT_STREQ(dp->backend(), "self");
    EXPECT_EQ(dp->space(), MemSpace::kDevice);
    EXPECT_EQ(registered_nccl_aborts(), aborts) << "a group of one made an NCCL communicator";
    EXPECT_EQ(w.split(kNoGroup, 0, "none", MemSpace::kDevice), nullptr);
    const std::vector<float> v = values_f32(1 << 20);
    const std::size_t bytes = v.size() * sizeof(float);
    const DeviceArray da_(std::vector<float>(v.size())), db_(std::vector<float>(v.size()));
    const CommBuf da = da_.buf(), db = db_.buf();
    void* a = da.data;
    void* b = db.data;
    for (const bool async : {false, true}) {
      SCOPED_TRACE(async ? "async" : "sync");
      ASSERT_EQ(cudaMemcpyAsync(a, v.data(), bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(b, 0, bytes, stream), cudaSuccess);
      if (async) {
        CommWork work = dp->iall_gather(da, db);
        work.wait();
      } else {
        dp->all_reduce(da, ReduceOp::kSum);
        dp->reduce_scatter(da, db);
      }
      std::vector<float> back(v.size(), -1.0f);
      ASSERT_EQ(cudaMemcpyAsync(back.data(), b, bytes, cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(back, v);
    }
  }
  cudaStreamDestroy(stream);
}

TEST(NcclWorldGpu, AbortingEveryCommunicatorStopsLaterCalls) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TRIDENT_REQUIRE_NCCL_WORLD(w);
  std::unique_ptr<Communicator> dp = w.split(0, 0, "dp", MemSpace::kDevice);
  ASSERT_NE(dp, nullptr);
  ASSERT_EQ(registered_nccl_aborts(), 2u);
  const NcclAbortOutcome outcome = abort_nccl_communicators(std::chrono::seconds(5));
  EXPECT_EQ(outcome.aborted, 2u);
  EXPECT_EQ(outcome.pending, 0u);
  EXPECT_EQ(outcome.names, "group 'dp' (rank 0/1), group 'world' (rank 0/1)");
  std::vector<float> v = values_f32(8);
  DeviceArray d(v);
  EXPECT_DEATH(dp->all_reduce(d.buf(), ReduceOp::kSum, {.label = "after abort"}),
               "group 'dp' \\(rank 0/1, nccl\\) all_reduce 'after abort'.*was aborted");
  // Destruction after an abort must not touch the freed NCCL communicators.
  dp.reset();
}

TEST(NcclWorldGpu, AbortAndExitEndsTheProcessWithOneNamingTheGroups) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  if (int n = 0; cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device";
  }
  EXPECT_EXIT(
      {
        World made = make_world();
        if (!made.world) std::_Exit(3);
        std::unique_ptr<Communicator> dp = made.world->split(0, 0, "dp", MemSpace::kDevice);
        abort_nccl_and_exit("[rank 0] watchdog: test hang in group 'dp'");
      },
      testing::ExitedWithCode(1),
      "test hang in group 'dp'\nwatchdog: aborted 2 NCCL communicators \\(group 'dp' \\(rank "
      "0/1\\), group 'world' \\(rank 0/1\\)\\); exiting 1");
}

}  // namespace
}  // namespace trident
