// "Device memory" that faults outside a DeviceAccessScope, as the checked backend's does:
// one mapping, PROT_NONE except while a scope is open. Installed as the process's
// DeviceAccessHook for its lifetime (one at a time). For the tests of the communicators'
// scoping: a collective that touches device memory outside a scope crashes.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/device_access.h"
#include "core/memory.h"

namespace trident::test {

class ProtectedDeviceMemory final : public DeviceAccessHook {
 public:
  explicit ProtectedDeviceMemory(std::size_t bytes) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = (bytes + page - 1) / page * page;
    base_ = static_cast<std::byte*>(
        mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    set_device_access_hook(this);
  }
  ~ProtectedDeviceMemory() override {
    set_device_access_hook(nullptr);
    munmap(base_, bytes_);
  }
  ProtectedDeviceMemory(const ProtectedDeviceMemory&) = delete;
  ProtectedDeviceMemory& operator=(const ProtectedDeviceMemory&) = delete;

  void open() override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++opens_;
    if (depth_++ == 0) mprotect(base_, bytes_, PROT_READ | PROT_WRITE);
  }
  void close() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--depth_ == 0) mprotect(base_, bytes_, PROT_NONE);
  }
  bool is_device_range(const void* address, std::size_t bytes) const override {
    const auto* a = static_cast<const std::byte*>(address);
    return a >= base_ && a + bytes <= base_ + bytes_;
  }

  DevPtr at(std::size_t byte_offset, DType dtype) const {
    return DevPtr::wrap(base_ + byte_offset, dtype);
  }
  // Host <-> device copies, inside a scope (what Ops upload/download do).
  template <class T>
  void upload(DevPtr dst, const std::vector<T>& src) {
    DeviceAccessScope scope;
    std::memcpy(dst.raw(), src.data(), src.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> download(DevPtr src, std::size_t n) {
    DeviceAccessScope scope;
    std::vector<T> out(n);
    std::memcpy(out.data(), src.raw(), n * sizeof(T));
    return out;
  }
  int opens() const { return opens_; }
  bool is_open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return depth_ > 0;
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::mutex mutex_;
  int depth_ = 0;
  int opens_ = 0;
};

}  // namespace trident::test
