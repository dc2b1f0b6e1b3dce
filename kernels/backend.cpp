#include "kernels/backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/log.h"
#include "kernels/cuda_plugin.h"

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

bool build_has_cuda() { return cuda_plugin().is_ok(); }

int visible_cuda_devices() {
  if (!cuda_plugin().is_ok()) return 0;
  Result<int> count = cuda_plugin()->table->device_count();
  return count.is_ok() ? count.value() : 0;
}

namespace {

bool checked_cpu_requested() {
  const char* check = std::getenv("TRIDENT_CHECK_DEVICE_ACCESS");
  return check != nullptr && std::string(check) == "1";
}

// runtime.device=cuda: the plugin's Ops, or why not.
Result<std::unique_ptr<Ops>> make_cuda_backend() {
  const Result<CudaPluginLibrary>& plugin = cuda_plugin();
  if (!plugin.is_ok()) {
    return Status::invalid_config(
        "runtime.device: cuda: the CUDA backend (" + std::string(kCudaPluginFileName) +
        ") could not be loaded: " + plugin.status().message() +
        " (the trident_cuda target builds it when CMake finds nvcc; " + kCudaPluginEnv +
        "=<path> picks another file)");
  }
  Result<int> count = plugin->table->device_count();
  if (!count.is_ok()) {
    return Status::invalid_config("runtime.device: cuda: no CUDA device is available (" +
                                  count.status().message() + ")");
  }
  return plugin->table->make_ops(count.value());
}

// runtime.device=auto: the plugin's Ops when it loads and sees a device, else null (the
// CPU). Says why in one info line only when a plugin was there and did not load.
Result<std::unique_ptr<Ops>> make_auto_cuda_backend() {
  const char* override_path = std::getenv(kCudaPluginEnv);
  const bool asked = override_path != nullptr && *override_path != '\0';
  if (!asked && !cuda_plugin_file_exists()) {
    return std::unique_ptr<Ops>();  // a build without the CUDA backend: nothing to say
  }
  const Result<CudaPluginLibrary>& plugin = cuda_plugin();
  if (!plugin.is_ok()) {
    log::info("runtime.device: auto: using the CPU; the CUDA backend did not load: {}",
              plugin.status().message());
    return std::unique_ptr<Ops>();
  }
  Result<int> count = plugin->table->device_count();
  if (!count.is_ok()) return std::unique_ptr<Ops>();  // no GPU here: the CPU, quietly
  return plugin->table->make_ops(count.value());
}

}  // namespace

Result<std::unique_ptr<Ops>> make_ops(DeviceKind device, int threads, int ranks_sharing_cores) {
  if (device == DeviceKind::kCuda) return make_cuda_backend();
  // auto: the GPU when the CUDA backend loads and the machine shows a device, except under
  // TRIDENT_CHECK_DEVICE_ACCESS=1, which asks for the checked CPU backend.
  if (device == DeviceKind::kAuto && !checked_cpu_requested()) {
    Result<std::unique_ptr<Ops>> cuda = make_auto_cuda_backend();
    if (!cuda.is_ok() || cuda.value() != nullptr) return cuda;
  }
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
