// Choosing the compute backend: the one place above kernels/<backend>/ that names one
// (the CUDA backend is a plugin, kernels/cuda_plugin.h).
// The trainer asks for `runtime.device` and gets an Ops; it includes no backend header,
// computes no backend-specific thread count and measures no peak itself (Ops::peak_flops).
#pragma once

#include <memory>

#include "core/status.h"
#include "kernels/ops.h"

namespace trident {

// runtime.device (docs/CONFIG.md "runtime"). kAuto picks the best backend this build and machine
// offer: CUDA when the CUDA backend plugin loads (kernels/cuda_plugin.h) and a device is
// visible, else the CPU.
enum class DeviceKind { kAuto, kCpu, kCuda };
const char* device_kind_name(DeviceKind kind);  // "auto", "cpu", "cuda"

// Whether this process has the CUDA backend: the plugin libtrident_cuda.so (built when
// CMake found nvcc) loads, with its CUDA libraries (kernels/cuda_plugin.h). Loads it.
bool build_has_cuda();
// The CUDA devices this process sees: 0 without the CUDA backend, without a driver or
// without a GPU (tests that need, or need the absence of, a GPU ask this). Loads the plugin.
int visible_cuda_devices();

// Makes the Ops for `device`. `threads` > 0: CPU threads for this process; <= 0: the
// machine's cores divided by `ranks_sharing_cores` (the ranks on this machine), at least
// one. CUDA: the device is this process's local rank (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, MPI_LOCALRANKID or LOCAL_RANK; 0 without one) modulo the visible devices
// (kernels/cuda/cuda_device.h). Errors are invalid_config (exit 2) naming runtime.device
// and the reason: "the CUDA backend (libtrident_cuda.so) could not be loaded: cannot load
// <path>: <dlerror>" (no plugin, a CUDA library of the plugin missing, a plugin of another
// build), "no CUDA device is available (cudaGetDeviceCount: <CUDA's error text>)", or a
// malformed local-rank variable. kAuto without the plugin, with one that does not load
// (one info line saying why) or without a device is the CPU. With
// TRIDENT_CHECK_DEVICE_ACCESS=1 in the environment the CPU backend is the checked one
// (make_cpu_ops(threads, true)), and kAuto picks it even on a GPU machine (without loading
// the plugin): tests use it to find host code that touches device memory.
Result<std::unique_ptr<Ops>> make_ops(DeviceKind device, int threads, int ranks_sharing_cores);

}  // namespace trident
