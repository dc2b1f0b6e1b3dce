// Softmax cross-entropy over the first V of Vp (padded) logit columns, row-parallel.
#include <cmath>

#include "core/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

// max and sum(exp(x - max)) over x[0..V).
void softmax_stats(const float* x, int V, float* max_out, float* sum_out) {
  const float m = max_f(x, V);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int v = 0;
  for (; v + 8 <= V; v += 8)
    for (int j = 0; j < 8; ++j) acc[j] += exp_fast(x[v + j] - m);
  float tail = 0.0f;
  for (; v < V; ++v) tail += exp_fast(x[v] - m);
  *max_out = m;
  *sum_out =
      ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

bool parallel_rows(int N, int Vp) {
  return static_cast<long>(N) * Vp >= static_cast<long>(kParallelMinElems);
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                           int V, int Vp) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, Vp))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<long>(n) * Vp;
    const int t = targets[n];
    TRIDENT_CHECK_MSG(t >= 0 && t < V, "cross_entropy target " + std::to_string(t));
    float m, s;
    softmax_stats(x, V, &m, &s);
    losses[n] = std::log(s) + m - x[t];
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, Vp))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<long>(n) * Vp;
    float* d = dlogits + static_cast<long>(n) * Vp;  // may alias x: stats are read first
    const int t = targets[n];
    TRIDENT_CHECK_MSG(t >= 0 && t < V, "cross_entropy target " + std::to_string(t));
    float m, s;
    softmax_stats(x, V, &m, &s);
    const float inv = 1.0f / s;
    const float xt = x[t];
    for (int v = 0; v < V; ++v) d[v] = dloss * (exp_fast(x[v] - m) * inv);
    d[t] = dloss * (exp_fast(xt - m) * inv - 1.0f);
    for (int v = V; v < Vp; ++v) d[v] = 0.0f;
  }
}

}  // namespace trident::cpu
