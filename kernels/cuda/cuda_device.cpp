#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

namespace trident {

int cuda_device_count() {
  int n = 0;
  // No driver or no device is an error code here, not a crash: report "none".
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Result<int> cuda_device_count_or_error() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state for later calls
    return Status::internal(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err));
  }
  if (n <= 0) return Status::internal("cudaGetDeviceCount: 0 devices");
  return n;
}

Result<int> local_rank_from_env(const std::function<const char*(const char*)>& getenv_fn) {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    const char* value = getenv_fn(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(value, &end, 10);
    // Digits only: strtol alone would accept " 2", "+2" and "-1".
    const bool digits = *value >= '0' && *value <= '9' && *end == '\0';
    if (!digits || errno != 0 || v > INT_MAX) {
      return Status::invalid_config(std::string("environment ") + name +
                                    ": expected a local rank (an integer >= 0), got '" + value +
                                    "'");
    }
    return static_cast<int>(v);
  }
  return -1;
}

int device_for_local_rank(int local_rank, int device_count) {
  if (local_rank < 0 || device_count <= 0) return 0;
  return local_rank % device_count;
}

}  // namespace trident
