// The plain attention path's kernels (contract: attention_kernels.h). Simple, checked
// kernels: one thread per element for the permutes, one warp per row for the softmaxes
// (fp32 math, llm.c attention.cuh's softmax_forward_kernel5 shape without its tricks).
#include "kernels/cuda/attention_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <string>

#include "core/check.h"

namespace trident::cuda {

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
// __float2bfloat16 rounds to nearest even, as every bf16 store in Trident.
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// to_bhtd: dst[b, h, t, d] = src[b, t, h, d]; else the inverse. Indexed by the dst element.
template <class T, bool kToBhtd>
__global__ void permute_kernel(T* dst, const T* src, int B, int Tn, int H, int D) {
  const int64_t n = static_cast<int64_t>(B) * Tn * H * D;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t d = i % D;
  int64_t rest = i / D;
  if (kToBhtd) {  // i = ((b * H + h) * T + t) * D + d
    const int64_t t = rest % Tn;
    rest /= Tn;
    const int64_t h = rest % H;
    const int64_t b = rest / H;
    dst[i] = src[((b * Tn + t) * H + h) * D + d];
  } else {  // i = ((b * T + t) * H + h) * D + d
    const int64_t h = rest % H;
    rest /= H;
    const int64_t t = rest % Tn;
    const int64_t b = rest / Tn;
    dst[i] = src[((b * H + h) * Tn + t) * D + d];
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class P>
__global__ void softmax_forward_kernel(P* p, const float* s, int64_t rows, int Tn, int64_t ld, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSoftmaxRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps exit together: the shuffles below stay full-warp
  const int t = static_cast<int>(row % Tn);
  const float* srow = s + row * ld;
  // Online max and sum of exp over j <= t, per lane, then combined across the warp.
  float m = -FLT_MAX, sum = 0.0f;
  for (int j = lane; j <= t; j += 32) {
    const float x = scale * srow[j];
    if (x > m) {
      sum *= expf(m - x);
      m = x;
    }
    sum += expf(x - m);
  }
  const float row_max = warp_max(m);
  sum *= expf(m - row_max);  // lanes without a column: sum 0 stays 0
  const float inv = 1.0f / warp_sum(sum);
  P* prow = p + row * ld;
  for (int64_t j = lane; j < ld; j += 32) {
    const float v = j <= t ? expf(scale * srow[j] - row_max) * inv : 0.0f;
    store(prow, j, v);
  }
}

template <class T>
__global__ void softmax_backward_kernel(T* ds, const T* p, const float* dp, int64_t rows, int Tn, int64_t ld,
                                        float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSoftmaxRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % Tn);
  const T* prow = p + row * ld;
  const float* dprow = dp + row * ld;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += load(prow, j) * dprow[j];
  dot = warp_sum(dot);
  T* dsrow = ds + row * ld;
  for (int64_t j = lane; j < ld; j += 32) {
    const float v = j <= t ? scale * load(prow, j) * (dprow[j] - dot) : 0.0f;
    store(dsrow, j, v);
  }
}

// Sum or max over the kCachedAttentionBlock threads, in a fixed order; every thread gets
// the result. `shared` holds one value per warp; synchronises before and after its use.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
  constexpr int kWarps = kCachedAttentionBlock / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, shared[w]) : r + shared[w];
  return r;
}

template <class T>
__global__ void cached_attention_kernel(T* out, const T* q, const T* k, const T* v, float* scores,
                                        int Tq, int pos, int capacity, int NH, int NKV, int HD,
                                        float scale) {
  __shared__ float shared[kCachedAttentionBlock / 32];
  const int h = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (NH / NKV);
  const int keys = pos + i + 1;  // positions 0 .. pos + i
  const int64_t row = (static_cast<int64_t>(b) * Tq + i) * NH + h;
  const T* qr = q + row * HD;
  float* s = scores + row * (pos + Tq);
  const int64_t kv_row = static_cast<int64_t>(NKV) * HD;
  const T* kb = k + static_cast<int64_t>(b) * capacity * kv_row + static_cast<int64_t>(kvh) * HD;
  const T* vb = v + static_cast<int64_t>(b) * capacity * kv_row + static_cast<int64_t>(kvh) * HD;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    float dot = 0.0f;
    for (int e = 0; e < HD; ++e) dot += load(qr, e) * load(kb, j * kv_row + e);
    s[j] = scale * dot;
    m = fmaxf(m, s[j]);
  }
  m = block_reduce<true>(m, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    s[j] = expf(s[j] - m);
    sum += s[j];
  }
  sum = block_reduce<false>(sum, shared);  // its __syncthreads also publish every s[j]
  const float inv = 1.0f / sum;
  for (int e = threadIdx.x; e < HD; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < keys; ++j) acc += s[j] * load(vb, j * kv_row + e);
    store(out + row * HD, e, acc * inv);
  }
}

void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  TRIDENT_CHECK_MSG(e == cudaSuccess, std::string(kernel) + " launch: " + cudaGetErrorString(e));
}

void check_dtype(DType dtype, const char* kernel) {
  TRIDENT_CHECK_MSG(dtype == DType::kF32 || dtype == DType::kBF16,
                    std::string(kernel) + ": dtype " + dtype_name(dtype) + " is not f32 or bf16");
}

template <bool kToBhtd>
void permute(void* dst, const void* src, DType dtype, int B, int T, int H, int D, CUstream_st* stream,
             const char* name) {
  check_dtype(dtype, name);
  const LaunchDims l = elementwise_launch(static_cast<int64_t>(B) * T * H * D);
  if (l.grid == 0) return;
  if (dtype == DType::kF32) {
    permute_kernel<float, kToBhtd><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<float*>(dst), static_cast<const float*>(src), B, T, H, D);
  } else {
    permute_kernel<__nv_bfloat16, kToBhtd><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<__nv_bfloat16*>(dst), static_cast<const __nv_bfloat16*>(src), B, T, H, D);
  }
  check_launch(name);
}

}  // namespace

LaunchDims elementwise_launch(int64_t n) {
  if (n <= 0) return {0, kBlock};
  return {(n + kBlock - 1) / kBlock, kBlock};
}

LaunchDims softmax_launch(int64_t rows) {
  if (rows <= 0) return {0, 32 * kSoftmaxRowsPerBlock};
  return {(rows + kSoftmaxRowsPerBlock - 1) / kSoftmaxRowsPerBlock, 32 * kSoftmaxRowsPerBlock};
}

void permute_bthd_to_bhtd(void* dst, const void* src, DType dtype, int B, int T, int H, int D,
                          CUstream_st* stream) {
  permute<true>(dst, src, dtype, B, T, H, D, stream, "permute_bthd_to_bhtd");
}

void permute_bhtd_to_bthd(void* dst, const void* src, DType dtype, int B, int T, int H, int D,
                          CUstream_st* stream) {
  permute<false>(dst, src, dtype, B, T, H, D, stream, "permute_bhtd_to_bthd");
}

void causal_softmax_forward(void* p, DType p_dtype, const float* s, int64_t rows, int T, int64_t ld,
                            float scale, CUstream_st* stream) {
  check_dtype(p_dtype, "causal_softmax_forward");
  TRIDENT_CHECK_MSG(ld >= T && T > 0, "causal_softmax_forward: ld " + std::to_string(ld) + " < T " +
                                          std::to_string(T));
  const LaunchDims l = softmax_launch(rows);
  if (l.grid == 0) return;
  if (p_dtype == DType::kF32) {
    softmax_forward_kernel<float><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<float*>(p), s, rows, T, ld, scale);
  } else {
    softmax_forward_kernel<__nv_bfloat16><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<__nv_bfloat16*>(p), s, rows, T, ld, scale);
  }
  check_launch("causal_softmax_forward");
}

void causal_softmax_backward(void* ds, const void* p, DType dtype, const float* dp, int64_t rows, int T,
                             int64_t ld, float scale, CUstream_st* stream) {
  check_dtype(dtype, "causal_softmax_backward");
  TRIDENT_CHECK_MSG(ld >= T && T > 0, "causal_softmax_backward: ld " + std::to_string(ld) + " < T " +
                                          std::to_string(T));
  const LaunchDims l = softmax_launch(rows);
  if (l.grid == 0) return;
  if (dtype == DType::kF32) {
    softmax_backward_kernel<float><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<float*>(ds), static_cast<const float*>(p), dp, rows, T, ld, scale);
  } else {
    softmax_backward_kernel<__nv_bfloat16><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
        static_cast<__nv_bfloat16*>(ds), static_cast<const __nv_bfloat16*>(p), dp, rows, T, ld, scale);
  }
  check_launch("causal_softmax_backward");
}

void cached_attention_forward(void* out, const void* q, const void* k_cache, const void* v_cache,
                              DType dtype, float* scores, int B, int Tq, int pos, int capacity,
                              int NH, int NKV, int HD, CUstream_st* stream) {
  check_dtype(dtype, "cached_attention_forward");
  TRIDENT_CHECK_MSG(B > 0 && Tq > 0 && pos >= 0 && pos + Tq <= capacity && NKV > 0 &&
                        NH % NKV == 0 && HD > 0 && Tq <= 65535 && B <= 65535,
                    "cached_attention_forward: B " + std::to_string(B) + " Tq " +
                        std::to_string(Tq) + " pos " + std::to_string(pos) + " capacity " +
                        std::to_string(capacity));
  const dim3 grid(static_cast<unsigned>(NH), static_cast<unsigned>(Tq), static_cast<unsigned>(B));
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  if (dtype == DType::kF32) {
    cached_attention_kernel<float><<<grid, kCachedAttentionBlock, 0, stream>>>(
        static_cast<float*>(out), static_cast<const float*>(q), static_cast<const float*>(k_cache),
        static_cast<const float*>(v_cache), scores, Tq, pos, capacity, NH, NKV, HD, scale);
  } else {
    cached_attention_kernel<__nv_bfloat16><<<grid, kCachedAttentionBlock, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(q),
        static_cast<const __nv_bfloat16*>(k_cache), static_cast<const __nv_bfloat16*>(v_cache),
        scores, Tq, pos, capacity, NH, NKV, HD, scale);
  }
  check_launch("cached_attention_forward");
}

}  // namespace trident::cuda
