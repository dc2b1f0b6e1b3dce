#include "kernels/backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#if TRIDENT_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
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

Result<std::unique_ptr<Ops>> make_ops(DeviceKind device, int threads, int ranks_sharing_cores) {
  if (device == DeviceKind::kCuda) {
#if TRIDENT_HAVE_CUDA
    if (cuda_device_count() == 0) {
      return Status::invalid_config("runtime.device: cuda: no CUDA device");
    }
    return Status::invalid_config(
        "runtime.device: cuda: the CUDA backend is not written yet (kernels/cuda/); use cpu");
#else
    return Status::invalid_config(
        "runtime.device: cuda: this build has no CUDA backend (built without nvcc)");
#endif
  }
  // kAuto and kCpu. CPU ranks on one machine share its cores.
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, ranks_sharing_cores));
  }
  // Tests run whole programs on the checked backend, where a host access to device memory
  // outside an Ops call faults (kernels/cpu/checked_memory.h).
  const char* check = std::getenv("TRIDENT_CHECK_DEVICE_ACCESS");
  return make_cpu_ops(threads, check != nullptr && std::string(check) == "1");
}

}  // namespace trident
