#include "kernels/backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#if TRIDENT_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace trident {

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

bool build_has_cuda() { return TRIDENT_HAVE_CUDA != 0; }

int visible_cuda_devices() {
#if TRIDENT_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

namespace {

bool checked_cpu_requested() {
  const char* check = std::getenv("TRIDENT_CHECK_DEVICE_ACCESS");
  return check != nullptr && std::string(check) == "1";
}

}  // namespace

#if TRIDENT_HAVE_CUDA
namespace {

// The CUDA Ops on this process's device (its local rank modulo the visible devices).
Result<std::unique_ptr<Ops>> make_cuda_backend(int device_count) {
  Result<int> local_rank = local_rank_from_env([](const char* name) { return std::getenv(name); });
  if (!local_rank.is_ok()) return local_rank.status();
  return cuda::make_cuda_ops(device_for_local_rank(local_rank.value(), device_count));
}

}  // namespace
#endif

Result<std::unique_ptr<Ops>> make_ops(DeviceKind device, int threads, int ranks_sharing_cores) {
  if (device == DeviceKind::kCuda) {
#if TRIDENT_HAVE_CUDA
    Result<int> count = cuda_device_count_or_error();
    if (!count.is_ok()) {
      return Status::invalid_config("runtime.device: cuda: no CUDA device is available (" +
                                    count.status().message() + ")");
    }
    return make_cuda_backend(count.value());
#else
    return Status::invalid_config(
        "runtime.device: cuda: this build has no CUDA backend (built without nvcc)");
#endif
  }
#if TRIDENT_HAVE_CUDA
  // auto: the GPU when this build has CUDA and the machine shows a device, except under
  // TRIDENT_CHECK_DEVICE_ACCESS=1, which asks for the checked CPU backend.
  if (device == DeviceKind::kAuto && !checked_cpu_requested()) {
    Result<int> count = cuda_device_count_or_error();
    if (count.is_ok()) return make_cuda_backend(count.value());
  }
#endif
  // kAuto and kCpu. CPU ranks on one machine share its cores.
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, ranks_sharing_cores));
  }
  // Tests run whole programs on the checked backend, where a host access to device memory
  // outside an Ops call faults (kernels/cpu/checked_memory.h).
  return make_cpu_ops(threads, checked_cpu_requested());
}

}  // namespace trident
