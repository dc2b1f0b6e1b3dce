// Device helpers shared by the kernel translation units (kernels/cuda/*.cu): F loads and
// stores, fixed-order warp and block reductions, and the CPU's exp_fast.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace trident::cuda {

// Widens exactly (bf16 is the upper half of an fp32).
__device__ __forceinline__ float load(FArg a, size_t i) {
  if (a.bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(a.p)[i]);
  return static_cast<const float*>(a.p)[i];
}

// Rounds to nearest even once (the CPU's float_to_bf16; NaN stays a NaN).
__device__ __forceinline__ void store(FArg a, size_t i, float v) {
  if (a.bf16) {
    static_cast<__nv_bfloat16*>(a.p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(a.p)[i] = v;
  }
}

// Sum / max over a warp by a butterfly: every lane gets the same value, and the order of
// the additions depends only on the lane values (deterministic).
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum / max over a block of kBlock threads; every thread gets the result. `shared` holds
// kWarpsPerBlock values; the function synchronises before and after using it, so it can
// be called several times in a row.
template <class T, bool kMax>
__device__ __forceinline__ T block_reduce(T v, T* shared) {
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if constexpr (kMax) {
    v = warp_max(v);
  } else {
    v = warp_sum(v);
  }
  __syncthreads();  // a previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = shared[0];
  for (unsigned w = 1; w < kWarpsPerBlock; ++w) {
    if constexpr (kMax) {
      r = r > shared[w] ? r : shared[w];
    } else {
      r += shared[w];
    }
  }
  return r;
}

// The CPU's exp_fast (kernels/cpu/cpu_util.h), transcribed with the same fmas, so the
// softmaxes of both backends agree to the last bit of each exponential: exp(x) for
// x <= 88.7 within ~2 ulp; x below -87.3 returns 0.
__device__ __forceinline__ float exp_fast(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = fmaxf(x, -87.3f);
  const float t = fmaf(xc, 1.44269504088896341f, kRound);
  const float n = t - kRound;
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float y = fmaf(p, r * r, r) + 1.0f;
  const int32_t ni = __float_as_int(t) - __float_as_int(kRound);
  const float scale = __int_as_float((ni + 127) << 23);
  return x >= -87.3f ? __fmul_rn(y, scale) : 0.0f;
}

// Grid-stride loop index helpers.
__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_threads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

}  // namespace trident::cuda
