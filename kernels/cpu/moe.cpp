// Mixture-of-experts routing and dispatch (kernels/ops.h, "Mixture-of-experts routing and
// dispatch"). Every output row is written by one iteration, and the sums over tokens
// (the router statistics) run serially in row order, so results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {

void moe_route_forward(float* weights, int32_t* experts, float* probs, float* lse, float* stats,
                       const float* logits, int N, int E, int K) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * E;
    float* p = probs + static_cast<size_t>(n) * E;
    float m = x[0];
    for (int e = 1; e < E; ++e) m = std::max(m, x[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      p[e] = exp_fast(x[e] - m);
      sum += p[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    lse[n] = m + std::log(sum);
    // Top K by selection: the largest remaining prob, the lowest index on a tie.
    int32_t* chosen = experts + static_cast<size_t>(n) * K;
    float* w = weights + static_cast<size_t>(n) * K;
    float kept = 0.0f;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= chosen[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      chosen[j] = best;
      w[j] = p[best];
      kept += p[best];
    }
    for (int j = 0; j < K; ++j) w[j] /= kept;
  }
  std::vector<double> sums(static_cast<size_t>(2 * E + 1), 0.0);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < K; ++j) sums[static_cast<size_t>(experts[static_cast<size_t>(n) * K + j])] += 1;
    for (int e = 0; e < E; ++e) sums[static_cast<size_t>(E + e)] += probs[static_cast<size_t>(n) * E + e];
    sums[static_cast<size_t>(2 * E)] += static_cast<double>(lse[n]) * lse[n];
  }
  for (size_t i = 0; i < sums.size(); ++i) stats[i] = static_cast<float>(sums[i]);
}

void moe_route_backward(float* dlogits, const float* dweights, const float* weights,
                        const float* probs, const float* lse, const int32_t* experts,
                        const float* prob_grad, float z_scale, int N, int E, int K) {
#pragma omp parallel
  {
    std::vector<float> dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* p = probs + static_cast<size_t>(n) * E;
      const float* w = weights + static_cast<size_t>(n) * K;
      const float* dw = dweights + static_cast<size_t>(n) * K;
      const int32_t* chosen = experts + static_cast<size_t>(n) * K;
      for (int e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = prob_grad ? prob_grad[e] : 0.0f;
      // w_j = p_j / S with S the sum of the chosen probs: dL/dp_j = (dw_j - sum_i dw_i w_i) / S.
      float kept = 0.0f, dot = 0.0f;
      for (int j = 0; j < K; ++j) {
        kept += p[chosen[j]];
        dot += dw[j] * w[j];
      }
      for (int j = 0; j < K; ++j) dp[static_cast<size_t>(chosen[j])] += (dw[j] - dot) / kept;
      float pdp = 0.0f;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[static_cast<size_t>(e)];
      const float z = 2.0f * z_scale * lse[n];
      float* dx = dlogits + static_cast<size_t>(n) * E;
      for (int e = 0; e < E; ++e) dx[e] += p[e] * (dp[static_cast<size_t>(e)] - pdp) + z * p[e];
    }
  }
}

void moe_dispatch(int32_t* order, int32_t* position, const int32_t* experts, int N, int K,
                  int E) {
  std::vector<int32_t> next(static_cast<size_t>(E) + 1, 0);
  const size_t A = static_cast<size_t>(N) * K;
  for (size_t a = 0; a < A; ++a) next[static_cast<size_t>(experts[a]) + 1]++;
  for (int e = 0; e < E; ++e) next[static_cast<size_t>(e) + 1] += next[static_cast<size_t>(e)];
  for (size_t a = 0; a < A; ++a) {
    const int32_t row = next[static_cast<size_t>(experts[a])]++;
    order[row] = static_cast<int32_t>(a);
    position[a] = row;
  }
}

void moe_gather_forward(float* out, const float* inp, const int32_t* order, int N, int K, int C) {
  const long rows = static_cast<long>(N) * K;
#pragma omp parallel for schedule(static)
  for (long p = 0; p < rows; ++p) {
    const float* src = inp + static_cast<size_t>(order[p] / K) * C;
    std::copy(src, src + C, out + static_cast<size_t>(p) * C);
  }
}

void moe_gather_backward(float* dinp, const float* dout, const int32_t* position, int N, int K,
                         int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* d = dinp + static_cast<size_t>(n) * C;
    for (int j = 0; j < K; ++j) {
      const float* src = dout + static_cast<size_t>(position[static_cast<size_t>(n) * K + j]) * C;
      for (int c = 0; c < C; ++c) d[c] += src[c];
    }
  }
}

void moe_combine_forward(float* out, const float* inp, const float* weights,
                         const int32_t* position, int N, int K, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    std::fill(o, o + C, 0.0f);
    for (int j = 0; j < K; ++j) {
      const size_t a = static_cast<size_t>(n) * K + j;
      const float* src = inp + static_cast<size_t>(position[a]) * C;
      const float w = weights[a];
      for (int c = 0; c < C; ++c) o[c] += w * src[c];
    }
  }
}

void moe_combine_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                          const float* weights, const int32_t* position, int N, int K, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * C;
    for (int j = 0; j < K; ++j) {
      const size_t a = static_cast<size_t>(n) * K + j;
      const size_t row = static_cast<size_t>(position[a]) * C;
      if (dweights) dweights[a] += dot_f(d, inp + row, C);
      if (dinp) {
        const float w = weights[a];
        for (int c = 0; c < C; ++c) dinp[row + c] += w * d[c];
      }
    }
  }
}

}  // namespace trident::cpu
