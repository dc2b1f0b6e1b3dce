// The seam through which a checked backend (kernels/cpu/checked_memory.h) makes device
// memory unreadable to host code: device memory may be touched only while a
// DeviceAccessScope is open. Every Ops backend call opens one around its device work, and
// so does every communicator call on device memory (a communicator serving device memory
// is device code, like NCCL). Without an installed hook a scope costs one atomic load.
// Scopes nest (the hook counts depth; only the outermost open/close act) and may be
// opened from any thread (the hook synchronises itself).
#pragma once

#include <cstddef>

namespace trident {

class DeviceAccessHook {
 public:
  virtual ~DeviceAccessHook() = default;
  virtual void open() = 0;   // device memory becomes accessible
  virtual void close() = 0;  // ... and inaccessible again
  // Whether [address, address + bytes) lies inside one live device allocation; lets a
  // communicator verify the memory space a caller claims. Only a checked backend knows.
  virtual bool is_device_range(const void* address, size_t bytes) const = 0;
};

// nullptr (the default) = none. Installed once by the checked backend before its first
// device allocation; never removed while device memory is live.
void set_device_access_hook(DeviceAccessHook* hook);
DeviceAccessHook* device_access_hook();

class DeviceAccessScope {
 public:
  DeviceAccessScope() : hook_(device_access_hook()) {
    if (hook_ != nullptr) hook_->open();
  }
  ~DeviceAccessScope() {
    if (hook_ != nullptr) hook_->close();
  }
  DeviceAccessScope(const DeviceAccessScope&) = delete;
  DeviceAccessScope& operator=(const DeviceAccessScope&) = delete;

 private:
  DeviceAccessHook* hook_;
};

}  // namespace trident
