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
#pragma once

#include <cstddef>

namespace trident::cpu {

void* checked_allocate(size_t bytes);
void checked_free(void* address);
// Live checked allocations (for tests).
size_t checked_live_allocations();

}  // namespace trident::cpu
