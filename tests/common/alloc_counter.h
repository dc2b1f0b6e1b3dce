// Counts heap allocations (operator new) made by the calling thread, for tests that
// check a warm path allocates nothing. alloc_counter.cpp replaces the global operator
// new / delete of each MPI test binary with malloc / free plus this counter.
#pragma once

namespace trident::test {

void set_counting_allocations(bool on);  // for this thread
long allocation_count();                 // counted allocations of every thread so far

// Allocations made by fn on this thread.
template <class Fn>
long allocations_in(Fn&& fn) {
  const long before = allocation_count();
  set_counting_allocations(true);
  fn();
  set_counting_allocations(false);
  return allocation_count() - before;
}

}  // namespace trident::test
