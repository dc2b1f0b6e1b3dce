// Memory spaces and device pointers (docs/ARCHITECTURE.md "Memory, dtypes and streams").
//
// Every buffer that crosses Ops, a Communicator or a checkpoint box says its dtype and its
// memory space: a DevPtr is device memory of one dtype; host buffers are plain pointers or
// spans of a typed element. Host code (trainer, checkpoint, data, metrics) holds, offsets
// and passes DevPtrs but never dereferences one; it reaches device memory only through Ops
// upload/download/copy. Only an Ops backend, and a communicator that serves device memory,
// call raw(). The checked CPU backend (kernels/cpu/checked_memory.h) makes a host access
// fault, so a test finds every place that forgets this.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace trident {

enum class MemSpace : uint8_t { kHost, kDevice };
const char* mem_space_name(MemSpace space);  // "host", "device"

class DevPtr {
 public:
  constexpr DevPtr() = default;
  // For backends and allocators: an address the backend handed out, seen as `dtype`.
  static DevPtr wrap(void* address, DType dtype) {
    DevPtr p;
    p.address_ = address;
    p.dtype_ = dtype;
    return p;
  }
  DType dtype() const { return dtype_; }
  bool is_null() const { return address_ == nullptr; }
  explicit operator bool() const { return address_ != nullptr; }
  // The same address seen as another dtype (arena slices, opaque state): no conversion.
  DevPtr as(DType dtype) const { return wrap(address_, dtype); }
  // Offset by `elements` of dtype(); a null pointer stays null.
  DevPtr operator+(size_t elements) const {
    return byte_offset(elements * dtype_size(dtype_));
  }
  // Offset in bytes (arena offsets); dtype unchanged; a null pointer stays null.
  DevPtr byte_offset(size_t bytes) const {
    return address_ == nullptr ? *this : wrap(static_cast<char*>(address_) + bytes, dtype_);
  }
  // The address, for backends and device-serving communicators only.
  void* raw() const { return address_; }
  // raw() as T*; CHECK-fails unless dtype() == dtype_of<T>() or the pointer is null.
  template <class T>
  T* raw_as() const {
    if (address_ != nullptr && dtype_ != dtype_of<T>()) dtype_mismatch(dtype_of<T>());
    return static_cast<T*>(address_);
  }
  bool operator==(const DevPtr&) const = default;

 private:
  [[noreturn]] void dtype_mismatch(DType wanted) const;

  void* address_ = nullptr;
  DType dtype_ = DType::kU8;
};

}  // namespace trident
