// A stack of device buffers carved from one allocation made at construction, so that the
// buffers a training step takes and gives back (ZeRO-2/3 gathered parameter groups and
// full group gradients) cost no allocation inside the step loop (on a GPU an allocation
// there is a cudaMalloc, and a synchronisation).
//
// push(bytes) returns the slice on top of the stack, pop(slice) gives back the top one:
// the owner's acquisitions must nest (last acquired, first released), which the model's
// use of a ParamStore does (a tied one-stage head acquires the head group, then group 0,
// and releases them in the other order). Both a request past the capacity and a pop of
// anything but the top CHECK-fail with a message naming the stack and the buffers: a
// planning error, not a run-time condition. Slices are packed end to end: their
// alignment is the base's (64 bytes) plus the sizes pushed below them (the stores push
// whole groups, multiples of 16 elements). Not thread-safe; the Ops must outlive it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace trident {

class BufferStack {
 public:
  BufferStack() = default;
  // One allocation of `capacity_bytes` (none for 0). `name` labels messages.
  BufferStack(Ops& ops, size_t capacity_bytes, std::string name);

  // The next `bytes` on top of the stack (u8; callers .as() their dtype), zero-filled
  // when `zeroed`. `what` names the buffer in messages.
  DevPtr push(size_t bytes, bool zeroed, const std::string& what);
  // Gives back the top slice, which must be `slice`.
  void pop(DevPtr slice);

  size_t capacity() const { return buffer_.bytes(); }  // allocated bytes
  size_t used() const { return used_; }
  size_t depth() const { return entries_.size(); }

 private:
  struct Entry {
    size_t offset = 0, bytes = 0;
    std::string what;
  };
  Ops* ops_ = nullptr;
  std::string name_;
  DeviceBuffer buffer_;
  std::vector<Entry> entries_;
  size_t used_ = 0;
};

}  // namespace trident
