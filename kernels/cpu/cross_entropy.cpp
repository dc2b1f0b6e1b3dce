// Softmax cross-entropy over the first V of Vp (padded) logit columns, row-parallel: the
// fused op and the three local steps of the vocab-parallel decomposition.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "core/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

// sum(exp(x - m)) over x[0..n), 8 lanes combined in a fixed order. The fused and the
// vocab-parallel paths share it, so a one-rank decomposition matches the fused op bitwise.
float sum_exp_f(const float* x, int n, float m) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int v = 0;
  for (; v + 8 <= n; v += 8)
    for (int j = 0; j < 8; ++j) acc[j] += exp_fast(x[v + j] - m);
  float tail = 0.0f;
  for (; v < n; ++v) tail += exp_fast(x[v] - m);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// max and sum(exp(x - max)) over x[0..V).
void softmax_stats(const float* x, int V, float* max_out, float* sum_out) {
  const float m = max_f(x, V);
  *max_out = m;
  *sum_out = sum_exp_f(x, V, m);
}

bool parallel_rows(int N, int Vp) {
  return static_cast<long>(N) * Vp >= static_cast<long>(kParallelMinElems);
}

// Number of this rank's columns that are real (global id < V): 0 when the whole slice is
// padding.
int local_real_columns(int Vp_local, int vocab_begin, int V) {
  return std::clamp(V - vocab_begin, 0, Vp_local);
}

void check_local_args(int N, int Vp_local, int vocab_begin, int V) {
  TRIDENT_CHECK_MSG(N >= 0 && Vp_local >= 0 && vocab_begin >= 0 && V > 0,
                    "xent_local: N " + std::to_string(N) + " Vp_local " +
                        std::to_string(Vp_local) + " vocab_begin " +
                        std::to_string(vocab_begin) + " V " + std::to_string(V));
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

void xent_local_max(float* row_max, const float* logits, int N, int Vp_local, int vocab_begin,
                    int V) {
  check_local_args(N, Vp_local, vocab_begin, V);
  const int real = local_real_columns(Vp_local, vocab_begin, V);
#pragma omp parallel for schedule(static) if (parallel_rows(N, Vp_local))
  for (int n = 0; n < N; ++n)
    row_max[n] = real > 0 ? max_f(logits + static_cast<long>(n) * Vp_local, real) : -FLT_MAX;
}

void xent_local_sums(float* sum_exp, float* target_logit, const float* logits,
                     const float* row_max, const int32_t* targets, int N, int Vp_local,
                     int vocab_begin, int V) {
  check_local_args(N, Vp_local, vocab_begin, V);
  const int real = local_real_columns(Vp_local, vocab_begin, V);
#pragma omp parallel for schedule(static) if (parallel_rows(N, Vp_local))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<long>(n) * Vp_local;
    const int t = targets[n];
    TRIDENT_CHECK_MSG(t >= 0 && t < V, "xent_local_sums target " + std::to_string(t));
    const int local_t = t - vocab_begin;  // in [0, real) only on the owning rank
    sum_exp[n] = sum_exp_f(x, real, row_max[n]);
    target_logit[n] = local_t >= 0 && local_t < real ? x[local_t] : 0.0f;
  }
}

void xent_local_backward(float* dlogits, const float* logits, const float* row_max,
                         const float* sum_exp, const int32_t* targets, float dloss, int N,
                         int Vp_local, int vocab_begin, int V) {
  check_local_args(N, Vp_local, vocab_begin, V);
  const int real = local_real_columns(Vp_local, vocab_begin, V);
#pragma omp parallel for schedule(static) if (parallel_rows(N, Vp_local))
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<long>(n) * Vp_local;
    float* d = dlogits + static_cast<long>(n) * Vp_local;  // may alias x: x[t] is read first
    const int t = targets[n];
    TRIDENT_CHECK_MSG(t >= 0 && t < V, "xent_local_backward target " + std::to_string(t));
    const int local_t = t - vocab_begin;
    const bool owns_target = local_t >= 0 && local_t < real;
    const float m = row_max[n];
    const float inv = 1.0f / sum_exp[n];
    const float xt = owns_target ? x[local_t] : 0.0f;
    for (int v = 0; v < real; ++v) d[v] = dloss * (exp_fast(x[v] - m) * inv);
    if (owns_target) d[local_t] = dloss * (exp_fast(xt - m) * inv - 1.0f);
    for (int v = real; v < Vp_local; ++v) d[v] = 0.0f;
  }
}

void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                 const float* target_logit, int N) {
  TRIDENT_CHECK_MSG(N >= 0, "xent_finish N " + std::to_string(N));
  // Rows are independent: the result does not depend on the thread count.
#pragma omp parallel for schedule(static) if (N >= 4096)
  for (int n = 0; n < N; ++n) losses[n] = std::log(sum_exp[n]) + row_max[n] - target_logit[n];
}

void loss_accumulate(double* acc, const float* losses, int N) {
  TRIDENT_CHECK_MSG(N >= 1, "loss_accumulate N " + std::to_string(N));
  // Serial on purpose: one fixed order (N = B*T is small next to the logits).
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += losses[n];
  *acc += static_cast<float>(sum / N);
}

}  // namespace trident::cpu
