// SelfCommunicator (single process, no launcher; any group of one), launcher detection and
// the launch-environment text. No MPI traffic: every rank runs these alone.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/common/mpi_test_util.h"
#include "tests/common/protected_device_memory.h"

namespace trident::test {
namespace {

TEST(SelfCommunicator, CollectivesAreIdentities) {
  SelfCommunicator self;
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.name(), "world");
  EXPECT_STREQ(self.backend(), "self");

  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  self.all_reduce(CommBuf::host(std::span(f)), ReduceOp::kSum);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::vector<std::int64_t> k = {5, -7};
  self.all_reduce(CommBuf::host(std::span<std::int64_t>(k)), ReduceOp::kMax);
  EXPECT_EQ(k, (std::vector<std::int64_t>{5, -7}));

  std::vector<float> out(3, 0.0f);
  self.reduce_scatter(CommBuf::host(std::span(f)), CommBuf::host(std::span(out)));
  EXPECT_EQ(out, f);
  std::vector<float> gathered(3, 0.0f);
  self.all_gather(CommBuf::host(std::span(f)), CommBuf::host(std::span(gathered)));
  EXPECT_EQ(gathered, f);

  std::vector<std::byte> bytes = {std::byte{1}, std::byte{2}};
  self.broadcast(CommBuf::host(std::span(bytes)), 0);
  EXPECT_EQ(bytes[1], std::byte{2});
  self.barrier();

  // Counted like any backend: the payload, even with nobody to send it to.
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllReduce), 3 * 4 + 2 * 8);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kReduceScatter), 12);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllGather), 12);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kBroadcast), 2);
}

TEST(SelfCommunicator, SplitAndProcessGroups) {
  SelfCommunicator self;
  self.set_default_timeout(std::chrono::milliseconds(1234));
  auto child = self.split(3, 0, "tp");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->name(), "tp");
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->default_timeout().count(), 1234);
  EXPECT_EQ(self.split(kNoGroup, 0, "none"), nullptr);

  auto groups = make_process_groups(self, ParallelLayout{1, 1, 1}, /*tied_embeddings=*/true);
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  EXPECT_EQ(groups->tp->size(), 1);
  EXPECT_EQ(groups->dp->name(), "dp");
  EXPECT_EQ(groups->pp->name(), "pp");
  EXPECT_EQ(groups->embedding, nullptr);  // pp == 1: no embedding group
  // The world carries host values; the groups, device memory.
  EXPECT_EQ(groups->world->space(), MemSpace::kHost);
  EXPECT_EQ(groups->dp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->tp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->pp->space(), MemSpace::kDevice);

  auto mismatch = make_process_groups(self, ParallelLayout{2, 1, 1}, false);
  ASSERT_FALSE(mismatch.is_ok());
  EXPECT_EQ(mismatch.status().exit_code(), 2);
  EXPECT_EQ(mismatch.status().message().rfind("parallel: dp*tp*pp = 2 but the world size is 1", 0),
            0u)
      << mismatch.status().message();
}

// Device memory that host code can never address, as a GPU's: the addresses handed to
// the communicator lie in a PROT_NONE view of a memory file (even inside a
// DeviceAccessScope); only this fake device's copy, upload and download reach the bytes,
// through a second, readable view. A host memmove of a device buffer crashes.
class OpaqueDevice {
 public:
  explicit OpaqueDevice(std::size_t bytes) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = (bytes + page - 1) / page * page;
    fd_ = memfd_create("opaque_device", 0);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes_)), 0);
    device_ = static_cast<std::byte*>(mmap(nullptr, bytes_, PROT_NONE, MAP_SHARED, fd_, 0));
    host_ = static_cast<std::byte*>(
        mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(device_, MAP_FAILED);
    EXPECT_NE(host_, MAP_FAILED);
  }
  ~OpaqueDevice() {
    munmap(device_, bytes_);
    munmap(host_, bytes_);
    close(fd_);
  }
  OpaqueDevice(const OpaqueDevice&) = delete;
  OpaqueDevice& operator=(const OpaqueDevice&) = delete;

  void* at(std::size_t byte_offset) const { return device_ + byte_offset; }
  // The device's own copy (what Ops::copy / cudaMemcpyAsync do), counted.
  DeviceCopy copier() {
    return [this](void* dst, const void* src, std::size_t bytes) {
      ++copies;
      copied_bytes += bytes;
      std::memmove(view(dst, bytes), view(src, bytes), bytes);
    };
  }
  template <class T>
  void upload(void* dst, const std::vector<T>& v) {
    std::memcpy(view(dst, v.size() * sizeof(T)), v.data(), v.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> download(const void* src, std::size_t n) {
    std::vector<T> v(n);
    std::memcpy(v.data(), view(src, n * sizeof(T)), n * sizeof(T));
    return v;
  }

  int copies = 0;
  std::size_t copied_bytes = 0;

 private:
  std::byte* view(const void* device_address, std::size_t bytes) const {
    const auto* a = static_cast<const std::byte*>(device_address);
    EXPECT_TRUE(a >= device_ && a + bytes <= device_ + bytes_) << "not device memory";
    return host_ + (a - device_);
  }
  int fd_ = -1;
  std::size_t bytes_ = 0;
  std::byte* device_ = nullptr;
  std::byte* host_ = nullptr;
};

TEST(DeviceSelfCommunicator, DataMovesGoThroughTheDeviceCopyAndReductionsAreNoOps) {
  OpaqueDevice dev(1 << 16);
  SelfCommunicator dp("dp", MemSpace::kDevice, dev.copier());
  EXPECT_TRUE(dp.has_device_copy());
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 8.0f};
  void* a = dev.at(0);
  void* b = dev.at(4096);
  void* c = dev.at(8192);
  dev.upload(a, v);
  const CommBuf da(a, v.size(), DType::kF32, MemSpace::kDevice);
  const CommBuf db(b, v.size(), DType::kF32, MemSpace::kDevice);
  const CommBuf dc(c, v.size(), DType::kF32, MemSpace::kDevice);

  dp.all_reduce(da, ReduceOp::kSum);  // one rank: the input, no copy
  dp.all_reduce(da, ReduceOp::kMax);
  dp.broadcast(da, 0);
  dp.barrier();
  EXPECT_EQ(dev.copies, 0);
  dp.reduce_scatter(da, db);
  EXPECT_EQ(dev.copies, 1);
  EXPECT_EQ(dev.download<float>(b, v.size()), v);
  dp.all_gather(db, dc);
  EXPECT_EQ(dev.copies, 2);
  EXPECT_EQ(dev.download<float>(c, v.size()), v);
  dp.reduce_scatter(da, da);  // in place: nothing to move
  dp.all_gather(da, da);
  EXPECT_EQ(dev.copies, 2);
  EXPECT_EQ(dev.copied_bytes, 2 * v.size() * sizeof(float));

  // bf16 moves its own bytes (2 per element).
  const std::vector<bf16_t> h = {float_to_bf16(0.5f), float_to_bf16(-3.0f), float_to_bf16(7.0f)};
  dev.upload(a, h);
  dp.all_gather(CommBuf(a, h.size(), DType::kBF16, MemSpace::kDevice),
                CommBuf(b, h.size(), DType::kBF16, MemSpace::kDevice));
  EXPECT_EQ(dev.download<bf16_t>(b, h.size()), h);
  EXPECT_EQ(dev.copied_bytes, 2 * v.size() * sizeof(float) + h.size() * 2);

  // Async calls complete at issue, through the same copy.
  dev.upload(a, v);
  {
    CommWork rs = dp.ireduce_scatter(da, dc);
    CommWork ar = dp.iall_reduce(db, ReduceOp::kSum);
    EXPECT_EQ(dp.outstanding_work(), 2u);
    EXPECT_TRUE(rs.test());
    ar.wait();
    EXPECT_EQ(dp.outstanding_work(), 0u);
  }
  EXPECT_EQ(dev.download<float>(c, v.size()), v);
  CommWork ag = dp.iall_gather(da, db);
  ag.wait();
  EXPECT_EQ(dev.download<float>(b, v.size()), v);
  EXPECT_EQ(dev.copies, 5);

  // Counted like any backend (the payload, even with nobody to send it to).
  EXPECT_EQ(dp.traffic().calls_of(CollectiveKind::kAllReduce), 3);
  EXPECT_EQ(dp.traffic().bytes_of(CollectiveKind::kAllReduce), 3 * 16);
  EXPECT_EQ(dp.traffic().bytes_of(CollectiveKind::kReduceScatter), 3 * 16);
  EXPECT_EQ(dp.traffic().bytes_of(CollectiveKind::kAllGather), 3 * 16 + 6);
  EXPECT_EQ(dp.traffic().bytes_of(CollectiveKind::kBroadcast), 16);
}

TEST(DeviceSelfCommunicator, SplitsAndProcessGroupsInheritTheDeviceCopy) {
  OpaqueDevice dev(1 << 16);
  SelfCommunicator world("world", MemSpace::kHost, dev.copier());
  auto groups = make_process_groups(world, ParallelLayout{1, 1, 1}, /*tied_embeddings=*/true);
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  const std::vector<float> v = {4.0f, -1.0f};
  dev.upload(dev.at(0), v);
  for (Communicator* g : {groups->dp.get(), groups->tp.get(), groups->pp.get()}) {
    SCOPED_TRACE(g->name());
    ASSERT_TRUE(dynamic_cast<SelfCommunicator&>(*g).has_device_copy());
    const int before = dev.copies;
    g->all_gather(CommBuf(dev.at(0), 2, DType::kF32, MemSpace::kDevice),
                  CommBuf(dev.at(4096), 2, DType::kF32, MemSpace::kDevice));
    EXPECT_EQ(dev.copies, before + 1);
    EXPECT_EQ(dev.download<float>(dev.at(4096), 2), v);
    // A group of one splits again into groups of one that copy the same way.
    std::unique_ptr<Communicator> sub = g->split(0, 0, "sub");
    ASSERT_NE(sub, nullptr);
    EXPECT_TRUE(dynamic_cast<SelfCommunicator&>(*sub).has_device_copy());
  }
  // Host values never go through the device copy.
  std::vector<float> host = {1.0f, 2.0f}, out(2, 0.0f);
  const int before = dev.copies;
  world.all_gather(CommBuf::host(std::span(host)), CommBuf::host(std::span(out)));
  EXPECT_EQ(out, host);
  EXPECT_EQ(dev.copies, before);
}

// The control: without a device copy a SelfCommunicator memmoves, which is right where
// device memory is host RAM (the CPU backend) and crashes on memory a host cannot address.
TEST(DeviceSelfCommunicator, WithoutADeviceCopyAHostMemmoveOfOpaqueMemoryCrashes) {
  GTEST_FLAG_SET(death_test_style, "fast");  // no re-exec: main() would start MPI again
  OpaqueDevice dev(1 << 16);
  SelfCommunicator dp("dp", MemSpace::kDevice);
  EXPECT_FALSE(dp.has_device_copy());
  EXPECT_DEATH(dp.all_gather(CommBuf(dev.at(0), 4, DType::kF32, MemSpace::kDevice),
                             CommBuf(dev.at(4096), 4, DType::kF32, MemSpace::kDevice)),
               "");
}

// Under a DeviceAccessHook (the checked backend) other backends stage an async call's
// device buffers on the host; the self backend must not, or its device copy would be
// handed host staging addresses (and, on a GPU, copy garbage).
TEST(DeviceSelfCommunicator, AsyncCallsHandTheDeviceCopyDeviceAddressesUnderAHook) {
  ProtectedDeviceMemory mem(1 << 16);
  std::vector<std::string> wrong;
  int copies = 0;
  SelfCommunicator dp("dp", MemSpace::kDevice,
                      [&](void* dst, const void* src, std::size_t bytes) {
                        ++copies;
                        if (!mem.is_device_range(dst, bytes) || !mem.is_device_range(src, bytes)) {
                          wrong.push_back("a copy of host addresses");
                        }
                        if (!mem.is_open()) wrong.push_back("a copy outside a scope");
                        std::memmove(dst, src, bytes);
                      });
  const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f};
  const DevPtr a = mem.at(0, DType::kF32), b = mem.at(4096, DType::kF32);
  mem.upload(a, v);
  CommWork rs = dp.ireduce_scatter(CommBuf::device(a, 4), CommBuf::device(b, 4));
  rs.wait();
  EXPECT_EQ(mem.download<float>(b, 4), v);
  mem.upload(b, std::vector<float>(4, 0.0f));
  CommWork ag = dp.iall_gather(CommBuf::device(a, 4), CommBuf::device(b, 4));
  ag.wait();
  EXPECT_EQ(mem.download<float>(b, 4), v);
  EXPECT_EQ(copies, 2);
  EXPECT_TRUE(wrong.empty()) << wrong.front();
}

std::map<std::string, std::string>* g_fake_env = nullptr;
const char* fake_env(const char* key) {
  auto it = g_fake_env->find(key);
  return it == g_fake_env->end() ? nullptr : it->second.c_str();
}

TEST(DetectLauncher, FromEnvironment) {
  std::map<std::string, std::string> env;
  g_fake_env = &env;
  EXPECT_EQ(detect_launcher(fake_env), "");
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  EXPECT_EQ(detect_launcher(fake_env), "");  // a 1-task step needs no MPI
  env = {{"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "5"}};
  EXPECT_EQ(detect_launcher(fake_env), "");  // an sbatch script itself, not a step
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}};
  EXPECT_EQ(detect_launcher(fake_env), "SLURM_STEP_ID");
  env = {{"PMIX_RANK", "3"}};
  EXPECT_EQ(detect_launcher(fake_env), "PMIX_RANK");
  env = {{"PMI_RANK", "3"}};
  EXPECT_EQ(detect_launcher(fake_env), "PMI_RANK");
  env = {{"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "1"}};
  EXPECT_EQ(detect_launcher(fake_env), "OMPI_COMM_WORLD_SIZE");
  g_fake_env = nullptr;
  // This binary runs under mpirun.
  EXPECT_FALSE(detect_launcher().empty());
}

TEST(LaunchEnvironment, NamesTheLauncherItsRankVariablesAndTheVisibleDevices) {
  std::map<std::string, std::string> env;
  g_fake_env = &env;
  EXPECT_EQ(launch_environment(fake_env),
            "no launcher; no rank variables; CUDA_VISIBLE_DEVICES unset");
  env = {{"OMPI_COMM_WORLD_SIZE", "2"},
         {"OMPI_COMM_WORLD_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"CUDA_VISIBLE_DEVICES", "0,1"},
         {"HOME", "/root"}};
  EXPECT_EQ(launch_environment(fake_env),
            "launcher OMPI_COMM_WORLD_SIZE; OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "
            "OMPI_COMM_WORLD_LOCAL_RANK=1; CUDA_VISIBLE_DEVICES=0,1");
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_PROCID", "3"},
         {"SLURM_LOCALID", "3"}, {"CUDA_VISIBLE_DEVICES", ""}};
  EXPECT_EQ(launch_environment(fake_env),
            "launcher SLURM_STEP_ID; SLURM_PROCID=3 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=4 "
            "SLURM_LOCALID=3; CUDA_VISIBLE_DEVICES=\"\" (hides every GPU)");
  // torchrun-style variables are no launcher this binary knows, but they are shown.
  env = {{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "0"}};
  EXPECT_EQ(launch_environment(fake_env),
            "no launcher; RANK=0 WORLD_SIZE=8 LOCAL_RANK=0; CUDA_VISIBLE_DEVICES unset");
  g_fake_env = nullptr;
  // This binary runs under mpirun: the real environment names Open MPI's variables.
  EXPECT_NE(launch_environment().find("OMPI_COMM_WORLD_RANK="), std::string::npos)
      << launch_environment();
}

}  // namespace
}  // namespace trident::test
