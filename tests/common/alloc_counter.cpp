// The replacement operator new / delete behind alloc_counter.h (its own file: GCC's
// -Wmismatched-new-delete misfires when a replaced new is inlined next to its free).
#include "tests/common/alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
thread_local bool t_counting = false;
std::atomic<long> g_allocations{0};
}  // namespace

namespace trident::test {
void set_counting_allocations(bool on) { t_counting = on; }
long allocation_count() { return g_allocations.load(); }
}  // namespace trident::test

void* operator new(std::size_t bytes) {
  if (t_counting) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
