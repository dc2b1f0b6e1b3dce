// The checked device memory (kernels/cpu/checked_memory.h): host access works only inside
// a DeviceAccessScope, and a host access outside one kills the process with SIGSEGV and a
// message that names it. The death tests are the self-test of the whole check: if a
// deliberate host read did not fault, no missed upload/download elsewhere would either.
#include "kernels/cpu/checked_memory.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include "core/device_access.h"

namespace trident::cpu {
namespace {

constexpr char kFault[] = "device memory read/written by host code outside an Ops call at 0x";

// A read the compiler cannot drop.
int read_int(const void* p) { return *static_cast<const volatile int*>(p); }
void write_int(void* p, int v) { *static_cast<volatile int*>(p) = v; }

TEST(CheckedMemory, InsideAScopeWritesAndReadsBack) {
  const size_t before = checked_live_allocations();
  void* p = checked_allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_NE(device_access_hook(), nullptr);
  EXPECT_EQ(checked_live_allocations(), before + 1);
  {
    DeviceAccessScope scope;
    auto* ints = static_cast<int*>(p);
    EXPECT_EQ(ints[249], 0);  // zero-filled
    for (int i = 0; i < 250; ++i) ints[i] = i * 7;
    int sum = 0;
    for (int i = 0; i < 250; ++i) sum += ints[i];
    EXPECT_EQ(sum, 7 * 249 * 250 / 2);
  }
  checked_free(p);
  EXPECT_EQ(checked_live_allocations(), before);
}

TEST(CheckedMemoryDeathTest, HostReadOutsideAScopeFaultsWithTheMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = checked_allocate(4096 + 8);
  {
    DeviceAccessScope scope;
    write_int(p, 42);  // fine here
  }
  EXPECT_EXIT(read_int(p), testing::KilledBySignal(SIGSEGV),
              std::string(kFault) + "[0-9a-f]+ \\(allocation of 4104 bytes\\)");
  // The last page (past the requested bytes but inside the mapping) is device memory too.
  EXPECT_EXIT(read_int(static_cast<char*>(p) + 4100), testing::KilledBySignal(SIGSEGV),
              "device memory read/written by host code");
  checked_free(p);
}

TEST(CheckedMemoryDeathTest, HostWriteOutsideAScopeFaultsWithTheMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = checked_allocate(64);
  EXPECT_EXIT(write_int(p, 1), testing::KilledBySignal(SIGSEGV),
              std::string(kFault) + "[0-9a-f]+ \\(allocation of 64 bytes\\)");
  void* empty = checked_allocate(0);  // still a page, still protected
  ASSERT_NE(empty, nullptr);
  EXPECT_EXIT(write_int(empty, 1), testing::KilledBySignal(SIGSEGV),
              "\\(allocation of 0 bytes\\)");
  checked_free(empty);
  checked_free(p);
}

TEST(CheckedMemoryDeathTest, NestedScopesKeepAccessUntilTheOutermostCloses) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = checked_allocate(16);
  {
    DeviceAccessScope outer;
    {
      DeviceAccessScope inner;
      write_int(p, 5);
    }
    EXPECT_EQ(read_int(p), 5);  // the inner close did not protect
    void* late = checked_allocate(8);  // made inside a scope: accessible at once
    write_int(late, 9);
    EXPECT_EQ(read_int(late), 9);
    checked_free(late);
  }
  EXPECT_EXIT(read_int(p), testing::KilledBySignal(SIGSEGV), kFault);
  checked_free(p);
}

TEST(CheckedMemory, IsDeviceRangeAnswersFromTheRegistry) {
  void* p = checked_allocate(100);
  const DeviceAccessHook* hook = device_access_hook();
  ASSERT_NE(hook, nullptr);
  const char* c = static_cast<const char*>(p);
  EXPECT_TRUE(hook->is_device_range(c, 100));
  EXPECT_TRUE(hook->is_device_range(c + 40, 60));
  EXPECT_FALSE(hook->is_device_range(c + 40, 61));  // runs past the end
  EXPECT_FALSE(hook->is_device_range(c, 4096));     // the page's slack is not the buffer
  char stack_buffer[16] = {};
  EXPECT_FALSE(hook->is_device_range(stack_buffer, sizeof(stack_buffer)));
  checked_free(p);
}

TEST(CheckedMemory, FreeingRemovesFromTheRegistry) {
  const size_t before = checked_live_allocations();
  void* a = checked_allocate(32);
  void* b = checked_allocate(32);
  EXPECT_EQ(checked_live_allocations(), before + 2);
  checked_free(a);
  EXPECT_EQ(checked_live_allocations(), before + 1);
  EXPECT_FALSE(device_access_hook()->is_device_range(a, 32));
  EXPECT_TRUE(device_access_hook()->is_device_range(b, 32));
  checked_free(b);
  checked_free(nullptr);
  EXPECT_EQ(checked_live_allocations(), before);
}

TEST(CheckedMemoryDeathTest, ConcurrentScopesDoNotLoseProtectionState) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Each thread opens and closes scopes in a tight loop and touches its own buffer
  // inside: a close by one thread must not protect memory the other is still using
  // (a fault here kills the test), and after both are done everything is protected.
  void* a = checked_allocate(256);
  void* b = checked_allocate(256);
  std::atomic<bool> go{false};
  auto work = [&go](void* p) {
    while (!go.load()) {
    }
    for (int i = 0; i < 20000; ++i) {
      DeviceAccessScope scope;
      write_int(p, i);
      if (read_int(p) != i) std::abort();
    }
  };
  std::thread ta(work, a), tb(work, b);
  go.store(true);
  ta.join();
  tb.join();
  EXPECT_EXIT(read_int(a), testing::KilledBySignal(SIGSEGV), kFault);
  EXPECT_EXIT(read_int(b), testing::KilledBySignal(SIGSEGV), kFault);
  checked_free(a);
  checked_free(b);
}

}  // namespace
}  // namespace trident::cpu
