// TRIDENT_CUDA_CHECK(call): every CUDA runtime call of the backend goes through it. A
// failure is a programming or device error, not bad input: it aborts (check_failed) with
// file:line, the call's text and cudaGetErrorString, so a run on a remote GPU says which
// call failed and why. TRIDENT_CUDA_CHECK_LAUNCH() checks the last kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/check.h"

#define TRIDENT_CUDA_CHECK(call)                                                         \
  do {                                                                                   \
    const cudaError_t _trident_err = (call);                                             \
    if (_trident_err != cudaSuccess) {                                                   \
      ::trident::check_failed(#call,                                                     \
                              std::string("CUDA error ") + cudaGetErrorName(_trident_err) + \
                                  ": " + cudaGetErrorString(_trident_err),               \
                              __FILE__, __LINE__);                                       \
    }                                                                                    \
  } while (0)

#define TRIDENT_CUDA_CHECK_LAUNCH() TRIDENT_CUDA_CHECK(cudaGetLastError())
