// What the CUDA runtime sees on this machine, and which device this process uses. Part of
// the CUDA backend plugin (kernels/cuda_plugin.h; built when CMake finds nvcc). No CUDA
// header here: the plugin's entry point (kernels/cuda/plugin_entry.cpp) and the host tests
// include it.
#pragma once

#include <functional>

#include "core/status.h"

namespace trident {

// Visible CUDA devices; 0 when there is none or no usable driver.
int cuda_device_count();

// Visible CUDA devices (at least 1), or an error whose message is
// "cudaGetDeviceCount: <cudaGetErrorString>" (no driver, no device) or
// "cudaGetDeviceCount: 0 devices".
Result<int> cuda_device_count_or_error();

// This process's rank among the processes of its machine, from the launcher's environment:
// the first of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun),
// MPI_LOCALRANKID (MPICH / Intel MPI), LOCAL_RANK (torchrun-style) that is set; -1 when
// none is. A set but malformed value (not a non-negative integer) is an invalid_config
// error naming the variable and the value. getenv_fn is std::getenv in production and a
// map lookup in tests.
Result<int> local_rank_from_env(const std::function<const char*(const char*)>& getenv_fn);

// The device a process with `local_rank` uses: local_rank % device_count (one GPU per
// rank; ranks beyond the GPU count share round-robin); device 0 for local_rank -1.
// device_count >= 1.
int device_for_local_rank(int local_rank, int device_count);

}  // namespace trident
