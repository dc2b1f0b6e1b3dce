#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>

namespace trident {

int cuda_device_count() {
  int n = 0;
  // No driver or no device is an error code here, not a crash: report "none".
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace trident
