// LayerNorm and RMSNorm. Forward and dinp are row-parallel; dweight / dbias are
// reductions over rows computed column-block-parallel from the saved mean / rstd, rows
// summed in order, so they do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

bool parallel_rows(int N, int C) {
  return static_cast<long>(N) * C >= static_cast<long>(kParallelMinElems);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, C))
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* o = out + static_cast<long>(n) * C;
    const float m = sum_f(x, C) / C;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
      for (int j = 0; j < 8; ++j) {
        float d = x[c + j] - m;
        acc[j] += d * d;
      }
    float tail = 0.0f;
    for (; c < C; ++c) tail += (x[c] - m) * (x[c] - m);
    const float var =
        (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail) /
        C;
    const float s = 1.0f / std::sqrt(var + eps);
    if (bias != nullptr) {
      for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    } else {
      for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i];
    }
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  if (dinp != nullptr) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, C))
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* g = dout + static_cast<long>(n) * C;
      float* d = dinp + static_cast<long>(n) * C;
      const float m = mean[n], s = rstd[n];
      float a0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int c = 0;
      for (; c + 8 <= C; c += 8)
        for (int j = 0; j < 8; ++j) {
          float dnorm = g[c + j] * weight[c + j];
          a0[j] += dnorm;
          a1[j] += dnorm * ((x[c + j] - m) * s);
        }
      float t0 = 0.0f, t1 = 0.0f;
      for (; c < C; ++c) {
        float dnorm = g[c] * weight[c];
        t0 += dnorm;
        t1 += dnorm * ((x[c] - m) * s);
      }
      const float dnorm_mean =
          (((a0[0] + a0[1]) + (a0[2] + a0[3])) + ((a0[4] + a0[5]) + (a0[6] + a0[7])) + t0) / C;
      const float dnorm_norm_mean =
          (((a1[0] + a1[1]) + (a1[2] + a1[3])) + ((a1[4] + a1[5]) + (a1[6] + a1[7])) + t1) / C;
      for (int i = 0; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        d[i] += s * (g[i] * weight[i] - dnorm_mean - norm * dnorm_norm_mean);
      }
    }
  }
  if (dweight == nullptr && dbias == nullptr) return;
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (parallel_rows(N, C) && blocks > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    float dw[kColumnBlock] = {}, db[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* g = dout + static_cast<long>(n) * C;
      const float m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c - c0] += g[c] * ((x[c] - m) * s);
        db[c - c0] += g[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      if (dweight != nullptr) dweight[c] += dw[c - c0];
      if (dbias != nullptr) dbias[c] += db[c - c0];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                     int C, float eps) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, C))
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* o = out + static_cast<long>(n) * C;
    const float s = 1.0f / std::sqrt(dot_f(x, x, C) / C + eps);
    for (int i = 0; i < C; ++i) o[i] = x[i] * s * weight[i];
    if (rstd != nullptr) rstd[n] = s;
  }
}

// d inp_j = s * w_j * g_j - s^3 / C * x_j * sum_k(g_k * w_k * x_k).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  if (dinp != nullptr) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, C))
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* g = dout + static_cast<long>(n) * C;
      float* d = dinp + static_cast<long>(n) * C;
      const float s = rstd[n];
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int c = 0;
      for (; c + 8 <= C; c += 8)
        for (int j = 0; j < 8; ++j) acc[j] += g[c + j] * weight[c + j] * x[c + j];
      float tail = 0.0f;
      for (; c < C; ++c) tail += g[c] * weight[c] * x[c];
      const float dot =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
      const float k = s * s * s * dot / C;
      for (int i = 0; i < C; ++i) d[i] += s * weight[i] * g[i] - k * x[i];
    }
  }
  if (dweight == nullptr) return;
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (parallel_rows(N, C) && blocks > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    float dw[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* g = dout + static_cast<long>(n) * C;
      const float s = rstd[n];
      for (int c = c0; c < c1; ++c) dw[c - c0] += g[c] * (x[c] * s);
    }
    for (int c = c0; c < c1; ++c) dweight[c] += dw[c - c0];
  }
}

}  // namespace trident::cpu
