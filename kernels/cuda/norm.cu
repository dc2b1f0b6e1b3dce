// LayerNorm and RMSNorm forward / backward, and the column sum of the matmul bias
// gradient. Forward and dinp: one warp per row (launch.h warp_per_row_launch), each lane
// striding the columns, the row sums by a warp butterfly (a fixed order for a given C).
// dweight / dbias / dbias-of-matmul: one thread per column walking the rows in order into
// a register, then added once to the f32 gradient — the CPU's order exactly
// (kernels/cpu/norm.cpp, matmul.cpp), so these gradients agree bitwise with the CPU's
// given the same inputs, and nothing uses atomics.
#include "kernels/cuda/device_util.cuh"

namespace trident::cuda {
namespace {

__device__ __forceinline__ size_t first_row() {
  return static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}
__device__ __forceinline__ size_t row_stride() {
  return static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
}

__global__ void layernorm_forward_kernel(FArg out, float* mean, float* rstd, FArg inp,
                                         FArg weight, FArg bias, int N, int C, float eps) {
  const unsigned lane = threadIdx.x % kWarp;
  for (size_t n = first_row(); n < static_cast<size_t>(N); n += row_stride()) {
    const size_t row = n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += kWarp) sum += load(inp, row + c);
    const float m = warp_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += kWarp) {
      const float d = load(inp, row + c) - m;
      sq += d * d;
    }
    const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);
    for (int c = lane; c < C; c += kWarp) {
      float o = (load(inp, row + c) - m) * s * load(weight, c);
      if (bias.p != nullptr) o += load(bias, c);
      store(out, row + c, o);
    }
    if (lane == 0) {
      if (mean != nullptr) mean[n] = m;
      if (rstd != nullptr) rstd[n] = s;
    }
  }
}

__global__ void layernorm_backward_dinp_kernel(FArg dinp, FArg dout, FArg inp, FArg weight,
                                               const float* mean, const float* rstd, int N,
                                               int C) {
  const unsigned lane = threadIdx.x % kWarp;
  for (size_t n = first_row(); n < static_cast<size_t>(N); n += row_stride()) {
    const size_t row = n * C;
    const float m = mean[n], s = rstd[n];
    float a0 = 0.0f, a1 = 0.0f;
    for (int c = lane; c < C; c += kWarp) {
      const float dnorm = load(dout, row + c) * load(weight, c);
      a0 += dnorm;
      a1 += dnorm * ((load(inp, row + c) - m) * s);
    }
    const float dnorm_mean = warp_sum(a0) / C;
    const float dnorm_norm_mean = warp_sum(a1) / C;
    for (int c = lane; c < C; c += kWarp) {
      const float norm = (load(inp, row + c) - m) * s;
      const float dnorm = load(dout, row + c) * load(weight, c);
      const float g = s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
      store(dinp, row + c, load(dinp, row + c) + g);
    }
  }
}

__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, FArg dout,
                                                 FArg inp, const float* mean, const float* rstd,
                                                 int N, int C) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  float dw = 0.0f, db = 0.0f;
  for (int n = 0; n < N; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    const float g = load(dout, i);
    dw += g * ((load(inp, i) - mean[n]) * rstd[n]);
    db += g;
  }
  if (dweight != nullptr) dweight[c] += dw;
  if (dbias != nullptr) dbias[c] += db;
}

__global__ void rmsnorm_forward_kernel(FArg out, float* rstd, FArg inp, FArg weight, int N, int C,
                                       float eps) {
  const unsigned lane = threadIdx.x % kWarp;
  for (size_t n = first_row(); n < static_cast<size_t>(N); n += row_stride()) {
    const size_t row = n * C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += kWarp) {
      const float x = load(inp, row + c);
      sq += x * x;
    }
    const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);
    for (int c = lane; c < C; c += kWarp)
      store(out, row + c, load(inp, row + c) * s * load(weight, c));
    if (lane == 0 && rstd != nullptr) rstd[n] = s;
  }
}

__global__ void rmsnorm_backward_dinp_kernel(FArg dinp, FArg dout, FArg inp, FArg weight,
                                             const float* rstd, int N, int C) {
  const unsigned lane = threadIdx.x % kWarp;
  for (size_t n = first_row(); n < static_cast<size_t>(N); n += row_stride()) {
    const size_t row = n * C;
    const float s = rstd[n];
    float dot = 0.0f;
    for (int c = lane; c < C; c += kWarp)
      dot += load(dout, row + c) * load(weight, c) * load(inp, row + c);
    const float k = s * s * s * warp_sum(dot) / C;
    for (int c = lane; c < C; c += kWarp) {
      const float g = s * load(weight, c) * load(dout, row + c) - k * load(inp, row + c);
      store(dinp, row + c, load(dinp, row + c) + g);
    }
  }
}

__global__ void rmsnorm_backward_weight_kernel(float* dweight, FArg dout, FArg inp,
                                               const float* rstd, int N, int C) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  float dw = 0.0f;
  for (int n = 0; n < N; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    dw += load(dout, i) * (load(inp, i) * rstd[n]);
  }
  dweight[c] += dw;
}

__global__ void column_sum_kernel(float* dst, FArg src, int N, int C) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  float acc = 0.0f;
  for (int n = 0; n < N; ++n) acc += load(src, static_cast<size_t>(n) * C + c);
  dst[c] += acc;
}

}  // namespace

void layernorm_forward(FArg out, float* mean, float* rstd, FArg inp, FArg weight, FArg bias,
                       int N, int C, float eps, Stream s) {
  const Launch l = warp_per_row_launch(C > 0 ? static_cast<uint64_t>(N) : 0);
  if (l.empty()) return;
  layernorm_forward_kernel<<<l.grid_x, l.block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C,
                                                        eps);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(FArg dinp, float* dweight, float* dbias, FArg dout, FArg inp,
                        FArg weight, const float* mean, const float* rstd, int N, int C,
                        Stream s) {
  if (N <= 0 || C <= 0) return;
  if (dinp.p != nullptr) {
    const Launch l = warp_per_row_launch(static_cast<uint64_t>(N));
    layernorm_backward_dinp_kernel<<<l.grid_x, l.block, 0, s>>>(dinp, dout, inp, weight, mean,
                                                                rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr || dbias != nullptr) {
    const Launch l = column_launch(static_cast<uint64_t>(C));
    layernorm_backward_params_kernel<<<l.grid_x, l.block, 0, s>>>(dweight, dbias, dout, inp, mean,
                                                                  rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
}

void rmsnorm_forward(FArg out, float* rstd, FArg inp, FArg weight, int N, int C, float eps,
                     Stream s) {
  const Launch l = warp_per_row_launch(C > 0 ? static_cast<uint64_t>(N) : 0);
  if (l.empty()) return;
  rmsnorm_forward_kernel<<<l.grid_x, l.block, 0, s>>>(out, rstd, inp, weight, N, C, eps);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(FArg dinp, float* dweight, FArg dout, FArg inp, FArg weight,
                      const float* rstd, int N, int C, Stream s) {
  if (N <= 0 || C <= 0) return;
  if (dinp.p != nullptr) {
    const Launch l = warp_per_row_launch(static_cast<uint64_t>(N));
    rmsnorm_backward_dinp_kernel<<<l.grid_x, l.block, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr) {
    const Launch l = column_launch(static_cast<uint64_t>(C));
    rmsnorm_backward_weight_kernel<<<l.grid_x, l.block, 0, s>>>(dweight, dout, inp, rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
}

void column_sum_accumulate(float* dst, FArg src, int N, int C, Stream s) {
  if (N <= 0 || C <= 0 || dst == nullptr) return;
  const Launch l = column_launch(static_cast<uint64_t>(C));
  column_sum_kernel<<<l.grid_x, l.block, 0, s>>>(dst, src, N, C);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace trident::cuda
