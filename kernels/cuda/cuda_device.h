// What the CUDA runtime sees on this machine. Built only when CMake finds nvcc
// (TRIDENT_HAVE_CUDA); kernels/backend.cpp is its one caller.
#pragma once

namespace trident {

// Visible CUDA devices; 0 when there is none or no usable driver.
int cuda_device_count();

}  // namespace trident
