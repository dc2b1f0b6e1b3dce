#include "kernels/cpu/checked_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "core/check.h"
#include "core/device_access.h"

namespace trident::cpu {
namespace {

// The registry. The SIGSEGV handler reads it without locks, so a slot is published by
// storing `begin` last (release) and retired by clearing `begin` first; the sizes of a
// slot are written only while its `begin` is 0. Writers (allocate, free, open, close)
// serialise on g_mutex.
struct Slot {
  std::atomic<uintptr_t> begin{0};  // 0 = free
  std::atomic<size_t> bytes{0};     // as requested
  std::atomic<size_t> mapped{0};    // page-rounded, what mmap/mprotect cover
};
Slot g_slots[kMaxCheckedAllocations];
std::atomic<size_t> g_high_water{0};  // slots [0, g_high_water) may be in use
std::atomic<size_t> g_live{0};
std::mutex g_mutex;
int g_depth = 0;  // open DeviceAccessScopes, all threads together (under g_mutex)

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

void protect(uintptr_t begin, size_t mapped, int prot) {
  const int rc = ::mprotect(reinterpret_cast<void*>(begin), mapped, prot);
  TRIDENT_CHECK_MSG(rc == 0, "mprotect of checked device memory failed: " +
                                 std::string(std::strerror(errno)));
}

// Under g_mutex.
void protect_all(int prot) {
  const size_t n = g_high_water.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t begin = g_slots[i].begin.load(std::memory_order_relaxed);
    if (begin != 0) protect(begin, g_slots[i].mapped.load(std::memory_order_relaxed), prot);
  }
}

class CheckedAccessHook final : public DeviceAccessHook {
 public:
  void open() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
  }
  void close() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    TRIDENT_CHECK_MSG(g_depth > 0, "DeviceAccessScope closed more often than opened");
    if (--g_depth == 0) protect_all(PROT_NONE);
  }
  bool is_device_range(const void* address, size_t bytes) const override {
    std::lock_guard<std::mutex> lock(g_mutex);  // exact even while others allocate or free
    const uintptr_t a = reinterpret_cast<uintptr_t>(address);
    const size_t n = g_high_water.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      const uintptr_t begin = g_slots[i].begin.load(std::memory_order_acquire);
      if (begin == 0 || a < begin) continue;
      const size_t size = g_slots[i].bytes.load(std::memory_order_relaxed);
      if (a - begin <= size && bytes <= size - (a - begin)) return true;
    }
    return false;
  }
};

// ---- the SIGSEGV handler: async-signal-safe only (write(2), no allocation) ----------

void write_str(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void write_unsigned(uint64_t v, int base) {
  char buf[24];
  int i = sizeof(buf) - 1;
  buf[i] = '\0';
  do {
    const int d = static_cast<int>(v % static_cast<uint64_t>(base));
    buf[--i] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
    v /= static_cast<uint64_t>(base);
  } while (v != 0);
  write_str(buf + i);
}

void on_sigsegv(int sig, siginfo_t* info, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  const size_t n = g_high_water.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t begin = g_slots[i].begin.load(std::memory_order_acquire);
    if (begin == 0 || a < begin || a - begin >= g_slots[i].mapped.load(std::memory_order_relaxed)) {
      continue;
    }
    write_str("device memory read/written by host code outside an Ops call at 0x");
    write_unsigned(a, 16);
    write_str(" (allocation of ");
    write_unsigned(g_slots[i].bytes.load(std::memory_order_relaxed), 10);
    write_str(" bytes)\n");
    break;
  }
  // Default action, re-raised: SIGSEGV is blocked inside the handler, so the raised one
  // is delivered when it returns (and a real fault would repeat on return anyway).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGSEGV, &dfl, nullptr);
  ::raise(sig);
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: the hook must outlive every device allocation and every
    // DeviceAccessScope, including those run by static destructors.
    static CheckedAccessHook* hook = new CheckedAccessHook;
    static const size_t stack_bytes = 64 * 1024;
    stack_t ss;
    std::memset(&ss, 0, sizeof(ss));
    ss.ss_sp = new char[stack_bytes];
    ss.ss_size = stack_bytes;
    TRIDENT_CHECK(::sigaltstack(&ss, nullptr) == 0);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigsegv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    TRIDENT_CHECK(::sigaction(SIGSEGV, &sa, nullptr) == 0);
    set_device_access_hook(hook);
  });
}

}  // namespace

void* checked_allocate(size_t bytes) {
  install_once();
  const size_t page = page_size();
  const size_t mapped = (bytes == 0 ? page : (bytes + page - 1) / page * page);
  void* p = ::mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TRIDENT_CHECK_MSG(p != MAP_FAILED, "mmap of " + std::to_string(bytes) +
                                         " bytes of checked device memory failed: " +
                                         std::strerror(errno));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_depth > 0) protect(begin, mapped, PROT_READ | PROT_WRITE);  // inside an Ops call
  size_t n = g_high_water.load(std::memory_order_relaxed);
  size_t i = 0;
  while (i < n && g_slots[i].begin.load(std::memory_order_relaxed) != 0) ++i;
  TRIDENT_CHECK_MSG(i < kMaxCheckedAllocations,
                    "more than " + std::to_string(kMaxCheckedAllocations) +
                        " live checked device allocations");
  g_slots[i].bytes.store(bytes, std::memory_order_relaxed);
  g_slots[i].mapped.store(mapped, std::memory_order_relaxed);
  g_slots[i].begin.store(begin, std::memory_order_release);
  if (i == n) g_high_water.store(n + 1, std::memory_order_release);
  g_live.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void checked_free(void* address) {
  if (address == nullptr) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  std::lock_guard<std::mutex> lock(g_mutex);
  const size_t n = g_high_water.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    if (g_slots[i].begin.load(std::memory_order_relaxed) != a) continue;
    g_slots[i].begin.store(0, std::memory_order_release);
    const size_t mapped = g_slots[i].mapped.load(std::memory_order_relaxed);
    TRIDENT_CHECK(::munmap(address, mapped) == 0);
    g_live.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  TRIDENT_CHECK_MSG(false, "checked_free of an address checked_allocate did not return");
}

size_t checked_live_allocations() { return g_live.load(std::memory_order_relaxed); }

}  // namespace trident::cpu
