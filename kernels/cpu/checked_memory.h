// Device memory for the checked CPU backend (tests): memory that host code cannot read or
// write outside an Ops call or a device-serving communicator call, so that a missed
// upload/download anywhere (trainer, checkpoint, communicators, data) faults at once.
// Each allocation is its own anonymous mmap (page-rounded, zero-filled, 64-byte aligned
// as Ops requires), kept PROT_NONE; the hook installed by the first checked_allocate
// (core/device_access.h) makes every live allocation PROT_READ|PROT_WRITE while a
// DeviceAccessScope is open (outermost open/close only; thread-safe) and PROT_NONE after.
// A host access outside a scope is SIGSEGV; the SIGSEGV handler installed with the hook
// prints "device memory read/written by host code outside an Ops call at <address>
// (allocation of N bytes)" to stderr and then re-raises with the default action, so the
// process dies with SIGSEGV and a message naming the fault.
//
// Limits, by construction of mprotect: protection is per process, not per thread, so
// while any thread holds a scope open every thread may touch device memory (the check
// finds accesses made while no Ops call runs anywhere). At most kMaxCheckedAllocations
// allocations are live at once (a CHECK failure beyond). The alternate signal stack is
// installed on the thread of the first checked_allocate; a fault on another thread runs
// the handler on that thread's own stack. A zero-byte allocation still gets a page.
#pragma once

#include <cstddef>

namespace trident::cpu {

inline constexpr size_t kMaxCheckedAllocations = size_t{1} << 16;

void* checked_allocate(size_t bytes);
// nullptr is a no-op; an address checked_allocate did not return is a CHECK failure.
void checked_free(void* address);
// Live checked allocations (for tests).
size_t checked_live_allocations();

}  // namespace trident::cpu
