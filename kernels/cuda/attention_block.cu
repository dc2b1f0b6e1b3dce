// Block attention's kernels (contract: attention_block.h).
#include "kernels/cuda/attention_block.h"

#include <cfloat>
#include <cmath>
#include <string>

#include "core/check.h"
#include "kernels/cuda/device_util.cuh"

namespace trident::cuda {
namespace {

__device__ __forceinline__ int64_t block_rows(const BlockDims& d) {  // rows() on the device
  return static_cast<int64_t>(d.B) * d.NH * d.Tq;
}

__device__ __forceinline__ int visible_keys(const BlockDims& d, int i) {
  const int64_t n = d.offset + i + 1;
  return n <= 0 ? 0 : (n >= d.Tk ? d.Tk : static_cast<int>(n));
}

// Row r = (b * NH + h) * Tq + i of the block: its first q / out element and the first
// k / v element of its kv head.
struct Row {
  int b, h, i;
  size_t q, kv, lse;
};
__device__ __forceinline__ Row row_of(const BlockDims& d, int64_t r) {
  Row w;
  w.i = static_cast<int>(r % d.Tq);
  const int64_t bh = r / d.Tq;
  w.h = static_cast<int>(bh % d.NH);
  w.b = static_cast<int>(bh / d.NH);
  const int kvh = w.h / (d.NH / d.NKV);
  w.q = (static_cast<size_t>(w.b) * d.q_rows + w.i) * d.NH * d.HD + static_cast<size_t>(w.h) * d.HD;
  w.kv = static_cast<size_t>(w.b) * d.kv_rows * d.NKV * d.HD + static_cast<size_t>(kvh) * d.HD;
  w.lse = static_cast<size_t>(bh) * d.q_rows + w.i;
  return w;
}

__device__ __forceinline__ float dot(FArg a, size_t ia, FArg b, size_t ib, int n) {
  float acc = 0.0f;
  for (int e = 0; e < n; ++e) acc += load(a, ia + e) * load(b, ib + e);
  return acc;
}

// One block per row: the scores, their max and sum (block reductions in a fixed order),
// then each output element as the sum over the keys of probability * value.
__global__ void block_forward_kernel(FArg out, float* lse, FArg q, FArg k, FArg v, float* scores,
                                     BlockDims d, float scale) {
  __shared__ float shared[kWarpsPerBlock];
  const int64_t r = blockIdx.x;
  const Row w = row_of(d, r);
  const int n = visible_keys(d, w.i);
  const size_t kv_row = static_cast<size_t>(d.NKV) * d.HD;
  if (n == 0) {  // a masked row (uniform over the block)
    for (int e = threadIdx.x; e < d.HD; e += blockDim.x) store(out, w.q + e, 0.0f);
    if (threadIdx.x == 0) lse[w.lse] = -INFINITY;
    return;
  }
  float* s = scores + r * d.Tk;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    s[j] = scale * dot(q, w.q, k, w.kv + j * kv_row, d.HD);
    m = fmaxf(m, s[j]);
  }
  m = block_reduce<float, true>(m, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    s[j] = expf(s[j] - m);
    sum += s[j];
  }
  sum = block_reduce<float, false>(sum, shared);  // its __syncthreads also publish every s[j]
  for (int e = threadIdx.x; e < d.HD; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += s[j] * load(v, w.kv + j * kv_row + e);
    store(out, w.q + e, acc / sum);
  }
  if (threadIdx.x == 0) lse[w.lse] = m + logf(sum);
}

// One thread per row.
__global__ void block_merge_kernel(FArg out, float* lse, FArg block_out, const float* block_lse,
                                   BlockDims d) {
  for (size_t r = global_thread(); r < static_cast<size_t>(block_rows(d)); r += grid_threads()) {
    const Row w = row_of(d, static_cast<int64_t>(r));
    const float a = lse[w.lse], c = block_lse[w.lse];
    const float m = fmaxf(a, c);
    if (m == -INFINITY) {  // neither has seen a key
      for (int e = 0; e < d.HD; ++e) store(out, w.q + e, 0.0f);
      lse[w.lse] = -INFINITY;
      continue;
    }
    const float merged = m + log1pf(expf(fminf(a, c) - m));
    const float wa = expf(a - merged), wc = expf(c - merged);
    for (int e = 0; e < d.HD; ++e) {
      store(out, w.q + e, wa * load(out, w.q + e) + wc * load(block_out, w.q + e));
    }
    lse[w.lse] = merged;
  }
}

// One block per row: D = rowsum(dout * out), then per key P = exp(scale q.k - lse) and
// dS = P (dout.v - D) (unscaled) into scratch rows of Tk (0 for keys the row does not see).
__global__ void block_backward_rows_kernel(float* P, float* dS, FArg dout, FArg out,
                                           const float* lse, FArg q, FArg k, FArg v, BlockDims d,
                                           float scale) {
  __shared__ float shared[kWarpsPerBlock];
  const int64_t r = blockIdx.x;
  const Row w = row_of(d, r);
  const float l = lse[w.lse];
  const int n = l == -INFINITY ? 0 : visible_keys(d, w.i);
  float part = 0.0f;
  for (int e = threadIdx.x; e < d.HD; e += blockDim.x) {
    part += load(dout, w.q + e) * load(out, w.q + e);
  }
  const float D = block_reduce<float, false>(part, shared);
  const size_t kv_row = static_cast<size_t>(d.NKV) * d.HD;
  for (int j = threadIdx.x; j < d.Tk; j += blockDim.x) {
    float p = 0.0f, ds = 0.0f;
    if (j < n) {
      p = expf(scale * dot(q, w.q, k, w.kv + j * kv_row, d.HD) - l);
      ds = p * (dot(dout, w.q, v, w.kv + j * kv_row, d.HD) - D);
    }
    P[r * d.Tk + j] = p;
    dS[r * d.Tk + j] = ds;
  }
}

// dq[b, i, h, e] += scale * sum_j dS[(b, h, i), j] k[b, j, kvh, e]; one thread per element.
__global__ void block_dq_kernel(FArg dq, const float* dS, FArg k, BlockDims d, float scale) {
  const size_t n = static_cast<size_t>(block_rows(d)) * d.HD;
  const size_t kv_row = static_cast<size_t>(d.NKV) * d.HD;
  for (size_t x = global_thread(); x < n; x += grid_threads()) {
    const int e = static_cast<int>(x % d.HD);
    const int64_t r = static_cast<int64_t>(x / d.HD);
    const Row w = row_of(d, r);
    float acc = 0.0f;
    for (int j = 0; j < d.Tk; ++j) acc += dS[r * d.Tk + j] * load(k, w.kv + j * kv_row + e);
    store(dq, w.q + e, load(dq, w.q + e) + scale * acc);
  }
}

// dk[b, j, kvh, e] += scale * sum over the group's heads g and rows i of dS q, and dv of
// P dout; one thread per element of the key block.
__global__ void block_dkv_kernel(FArg dk, FArg dv, const float* P, const float* dS, FArg q,
                                 FArg dout, BlockDims d, float scale) {
  const int group = d.NH / d.NKV;
  const size_t n = static_cast<size_t>(d.B) * d.Tk * d.NKV * d.HD;
  for (size_t x = global_thread(); x < n; x += grid_threads()) {
    const int e = static_cast<int>(x % d.HD);
    size_t rest = x / d.HD;
    const int kvh = static_cast<int>(rest % d.NKV);
    rest /= d.NKV;
    const int j = static_cast<int>(rest % d.Tk);
    const int b = static_cast<int>(rest / d.Tk);
    float acc_k = 0.0f, acc_v = 0.0f;
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int i = 0; i < d.Tq; ++i) {
        const int64_t r = (static_cast<int64_t>(b) * d.NH + h) * d.Tq + i;
        const size_t qi =
            (static_cast<size_t>(b) * d.q_rows + i) * d.NH * d.HD + static_cast<size_t>(h) * d.HD + e;
        acc_k += dS[r * d.Tk + j] * load(q, qi);
        acc_v += P[r * d.Tk + j] * load(dout, qi);
      }
    }
    const size_t ki = (static_cast<size_t>(b) * d.kv_rows + j) * d.NKV * d.HD +
                      static_cast<size_t>(kvh) * d.HD + e;
    if (dk.p != nullptr) store(dk, ki, load(dk, ki) + scale * acc_k);
    if (dv.p != nullptr) store(dv, ki, load(dv, ki) + acc_v);
  }
}

void check_dims(const BlockDims& d, const char* kernel) {
  TRIDENT_CHECK_MSG(d.B > 0 && d.Tq > 0 && d.Tk > 0 && d.q_rows >= d.Tq && d.kv_rows >= d.Tk &&
                        d.NKV > 0 && d.NH % d.NKV == 0 && d.HD > 0 &&
                        static_cast<uint64_t>(d.rows()) <= kMaxGridX,
                    std::string(kernel) + ": B " + std::to_string(d.B) + " Tq " +
                        std::to_string(d.Tq) + " Tk " + std::to_string(d.Tk) + " q_rows " +
                        std::to_string(d.q_rows) + " kv_rows " + std::to_string(d.kv_rows) +
                        " NH " + std::to_string(d.NH) + " NKV " + std::to_string(d.NKV));
}

float scale_of(const BlockDims& d) { return 1.0f / std::sqrt(static_cast<float>(d.HD)); }

}  // namespace

void attention_block_forward(FArg out, float* lse, FArg q, FArg k, FArg v, float* scores,
                             const BlockDims& d, Stream s) {
  check_dims(d, "attention_block_forward");
  block_forward_kernel<<<static_cast<unsigned>(d.rows()), kBlock, 0, s>>>(out, lse, q, k, v,
                                                                         scores, d, scale_of(d));
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void attention_block_merge(FArg out, float* lse, FArg block_out, const float* block_lse,
                           const BlockDims& d, Stream s) {
  TRIDENT_CHECK_MSG(d.B > 0 && d.Tq > 0 && d.q_rows >= d.Tq && d.NH > 0 && d.HD > 0,
                    "attention_block_merge: B " + std::to_string(d.B) + " Tq " +
                        std::to_string(d.Tq) + " q_rows " + std::to_string(d.q_rows));
  const Launch l = elementwise_launch(static_cast<uint64_t>(d.rows()));
  block_merge_kernel<<<l.grid_x, l.block, 0, s>>>(out, lse, block_out, block_lse, d);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void attention_block_backward(FArg dq, FArg dk, FArg dv, FArg dout, FArg out, const float* lse,
                              FArg q, FArg k, FArg v, float* scratch, const BlockDims& d,
                              Stream s) {
  check_dims(d, "attention_block_backward");
  if (dq.p == nullptr && dk.p == nullptr && dv.p == nullptr) return;
  const float scale = scale_of(d);
  float* P = scratch;
  float* dS = scratch + static_cast<size_t>(d.rows()) * d.Tk;
  block_backward_rows_kernel<<<static_cast<unsigned>(d.rows()), kBlock, 0, s>>>(
      P, dS, dout, out, lse, q, k, v, d, scale);
  TRIDENT_CUDA_CHECK_LAUNCH();
  if (dq.p != nullptr) {
    const Launch l = elementwise_launch(static_cast<uint64_t>(d.rows()) * d.HD);
    block_dq_kernel<<<l.grid_x, l.block, 0, s>>>(dq, dS, k, d, scale);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
  if (dk.p != nullptr || dv.p != nullptr) {
    const Launch l =
        elementwise_launch(static_cast<uint64_t>(d.B) * d.Tk * d.NKV * d.HD);
    block_dkv_kernel<<<l.grid_x, l.block, 0, s>>>(dk, dv, P, dS, q, dout, d, scale);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace trident::cuda
