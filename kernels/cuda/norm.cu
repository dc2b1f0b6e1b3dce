// LayerNorm and RMSNorm forward / backward, and the column sum of the matmul bias
// gradient. Forward and dinp: one warp per row (launch.h warp_per_row_launch), each lane
// striding the columns, the row sums by a warp butterfly (a fixed order for a given C).
// dweight / dbias / dbias-of-matmul: two passes (launch.h column_chunk_launch): a thread
// per (column, chunk of kColumnRowChunk rows) sums its rows in order into a partial, then
// a thread per column adds the partials in chunk order and adds the total once to the f32
// gradient. The order depends only on N (deterministic, no atomics); for N <=
// kColumnRowChunk it is the CPU's (kernels/cpu/norm.cpp, matmul.cpp) bit for bit.
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

// The rows of chunk r: [r * kColumnRowChunk, min(N, (r + 1) * kColumnRowChunk)).
__device__ __forceinline__ int chunk_begin(int r) { return r * static_cast<int>(kColumnRowChunk); }
__device__ __forceinline__ int chunk_end(int r, int N) {
  return min(N, (r + 1) * static_cast<int>(kColumnRowChunk));
}

__global__ void layernorm_params_partial_kernel(float* pw, float* pb, FArg dout, FArg inp,
                                                const float* mean, const float* rstd, int N,
                                                int C, int chunks) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  for (int r = blockIdx.y; r < chunks; r += gridDim.y) {
    float dw = 0.0f, db = 0.0f;
    for (int n = chunk_begin(r); n < chunk_end(r, N); ++n) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const float g = load(dout, i);
      dw += g * ((load(inp, i) - mean[n]) * rstd[n]);
      db += g;
    }
    const size_t p = static_cast<size_t>(r) * C + c;
    if (pw != nullptr) pw[p] = dw;
    if (pb != nullptr) pb[p] = db;
  }
}

// Pass 2: dst[c] += the partials of column c, in chunk order.
__global__ void column_finish_kernel(float* dst, const float* partial, int chunks, int C) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  float acc = 0.0f;
  for (int r = 0; r < chunks; ++r) acc += partial[static_cast<size_t>(r) * C + c];
  dst[c] += acc;
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

__global__ void rmsnorm_weight_partial_kernel(float* pw, FArg dout, FArg inp, const float* rstd,
                                              int N, int C, int chunks) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  for (int r = blockIdx.y; r < chunks; r += gridDim.y) {
    float dw = 0.0f;
    for (int n = chunk_begin(r); n < chunk_end(r, N); ++n) {
      const size_t i = static_cast<size_t>(n) * C + c;
      dw += load(dout, i) * (load(inp, i) * rstd[n]);
    }
    pw[static_cast<size_t>(r) * C + c] = dw;
  }
}

__global__ void column_sum_partial_kernel(float* partial, FArg src, int N, int C, int chunks) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  for (int r = blockIdx.y; r < chunks; r += gridDim.y) {
    float acc = 0.0f;
    for (int n = chunk_begin(r); n < chunk_end(r, N); ++n)
      acc += load(src, static_cast<size_t>(n) * C + c);
    partial[static_cast<size_t>(r) * C + c] = acc;
  }
}

// Pass 2 of every column reduction.
void finish_columns(float* dst, const float* partial, int N, int C, Stream s) {
  const Launch l = column_launch(static_cast<uint64_t>(C));
  column_finish_kernel<<<l.grid_x, l.block, 0, s>>>(dst, partial,
                                                    static_cast<int>(column_chunks(N)), C);
  TRIDENT_CUDA_CHECK_LAUNCH();
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
                        float* partials, Stream s) {
  if (N <= 0 || C <= 0) return;
  if (dinp.p != nullptr) {
    const Launch l = warp_per_row_launch(static_cast<uint64_t>(N));
    layernorm_backward_dinp_kernel<<<l.grid_x, l.block, 0, s>>>(dinp, dout, inp, weight, mean,
                                                                rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr || dbias != nullptr) {
    const size_t per = column_chunks(N) * static_cast<size_t>(C);
    float* pw = dweight != nullptr ? partials : nullptr;
    float* pb = dbias != nullptr ? partials + per : nullptr;
    const Launch l = column_chunk_launch(static_cast<uint64_t>(C), static_cast<uint64_t>(N));
    layernorm_params_partial_kernel<<<dim3(l.grid_x, l.grid_y), l.block, 0, s>>>(
        pw, pb, dout, inp, mean, rstd, N, C, static_cast<int>(column_chunks(N)));
    TRIDENT_CUDA_CHECK_LAUNCH();
    if (dweight != nullptr) finish_columns(dweight, pw, N, C, s);
    if (dbias != nullptr) finish_columns(dbias, pb, N, C, s);
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
                      const float* rstd, int N, int C, float* partials, Stream s) {
  if (N <= 0 || C <= 0) return;
  if (dinp.p != nullptr) {
    const Launch l = warp_per_row_launch(static_cast<uint64_t>(N));
    rmsnorm_backward_dinp_kernel<<<l.grid_x, l.block, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr) {
    const Launch l = column_chunk_launch(static_cast<uint64_t>(C), static_cast<uint64_t>(N));
    rmsnorm_weight_partial_kernel<<<dim3(l.grid_x, l.grid_y), l.block, 0, s>>>(
        partials, dout, inp, rstd, N, C, static_cast<int>(column_chunks(N)));
    TRIDENT_CUDA_CHECK_LAUNCH();
    finish_columns(dweight, partials, N, C, s);
  }
}

void column_sum_accumulate(float* dst, FArg src, int N, int C, float* partials, Stream s) {
  if (N <= 0 || C <= 0 || dst == nullptr) return;
  const Launch l = column_chunk_launch(static_cast<uint64_t>(C), static_cast<uint64_t>(N));
  column_sum_partial_kernel<<<dim3(l.grid_x, l.grid_y), l.block, 0, s>>>(
      partials, src, N, C, static_cast<int>(column_chunks(N)));
  TRIDENT_CUDA_CHECK_LAUNCH();
  finish_columns(dst, partials, N, C, s);
}

}  // namespace trident::cuda
