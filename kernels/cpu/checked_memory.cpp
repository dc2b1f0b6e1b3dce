// Placeholder; the PROT_NONE implementation replaces this file. Plain 64-byte aligned,
// zero-filled host memory with a live-allocation counter, so that make_cpu_ops(threads,
// /*checked=*/true) links and behaves like the unchecked backend until then. It installs
// no DeviceAccessHook and catches no host access.
#include "kernels/cpu/checked_memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"

namespace trident::cpu {
namespace {
std::atomic<size_t> g_live{0};
}  // namespace

void* checked_allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0);
  void* p = std::aligned_alloc(64, rounded);
  TRIDENT_CHECK_MSG(p != nullptr, "checked allocate of " + std::to_string(bytes) + " bytes failed");
  std::memset(p, 0, rounded);
  g_live.fetch_add(1);
  return p;
}

void checked_free(void* address) {
  if (address == nullptr) return;
  std::free(address);
  g_live.fetch_sub(1);
}

size_t checked_live_allocations() { return g_live.load(); }

}  // namespace trident::cpu
