// Mixture-of-experts kernels (kernels/cuda/moe_kernels.h).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/moe_kernels.h"

namespace trident::cuda {
namespace {

// One thread per token: softmax (the CPU's exp_fast, so both backends agree), top K by
// selection (the lowest index on a tie), the renormalised weights.
__global__ void route_forward_kernel(float* weights, int32_t* experts, float* probs, float* lse,
                                     FArg logits, int N, int E, int K) {
  for (size_t n = global_thread(); n < static_cast<size_t>(N); n += grid_threads()) {
    const size_t row = n * E;
    float m = load(logits, row);
    for (int e = 1; e < E; ++e) m = fmaxf(m, load(logits, row + e));
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      probs[row + e] = exp_fast(load(logits, row + e) - m);
      sum += probs[row + e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) probs[row + e] *= inv;
    lse[n] = m + logf(sum);
    int32_t* chosen = experts + n * K;
    float* w = weights + n * K;
    float kept = 0.0f;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= chosen[i] == e;
        if (!taken && (best < 0 || probs[row + e] > probs[row + best])) best = e;
      }
      chosen[j] = best;
      w[j] = probs[row + best];
      kept += w[j];
    }
    for (int j = 0; j < K; ++j) w[j] /= kept;
  }
}

// One thread per statistic, summing over tokens in row order in double.
__global__ void route_stats_kernel(float* stats, const int32_t* experts, const float* probs,
                                   const float* lse, int N, int E, int K) {
  const size_t i = global_thread();
  if (i >= static_cast<size_t>(2 * E + 1)) return;
  double sum = 0.0;
  for (int n = 0; n < N; ++n) {
    if (i < static_cast<size_t>(E)) {
      for (int j = 0; j < K; ++j) sum += experts[static_cast<size_t>(n) * K + j] == int32_t(i);
    } else if (i < static_cast<size_t>(2 * E)) {
      sum += probs[static_cast<size_t>(n) * E + (i - E)];
    } else {
      sum += static_cast<double>(lse[n]) * lse[n];
    }
  }
  stats[i] = static_cast<float>(sum);
}

__global__ void route_backward_kernel(FArg dlogits, const float* dweights, const float* weights,
                                      const float* probs, const float* lse, const int32_t* experts,
                                      const float* prob_grad, float z_scale, int N, int E, int K) {
  for (size_t n = global_thread(); n < static_cast<size_t>(N); n += grid_threads()) {
    const float* p = probs + n * E;
    const float* w = weights + n * K;
    const float* dw = dweights + n * K;
    const int32_t* chosen = experts + n * K;
    float kept = 0.0f, dot = 0.0f;
    for (int j = 0; j < K; ++j) {
      kept += p[chosen[j]];
      dot += dw[j] * w[j];
    }
    // dL/dprobs[e], computed where it is needed (no per-thread array of E).
    auto dprob = [&](int e) {
      float d = prob_grad != nullptr ? prob_grad[e] : 0.0f;
      for (int j = 0; j < K; ++j) {
        if (chosen[j] == e) d += (dw[j] - dot) / kept;
      }
      return d;
    };
    float pdp = 0.0f;
    for (int e = 0; e < E; ++e) pdp += p[e] * dprob(e);
    const float z = 2.0f * z_scale * lse[n];
    for (int e = 0; e < E; ++e) {
      const size_t i = n * E + e;
      store(dlogits, i, load(dlogits, i) + (p[e] * (dprob(e) - pdp) + z * p[e]));
    }
  }
}

// The stable counting sort, serially in one thread: the order is the CPU's by construction.
__global__ void dispatch_kernel(int32_t* order, int32_t* position, const int32_t* experts, int N,
                                int K, int E) {
  if (global_thread() != 0) return;
  const size_t A = static_cast<size_t>(N) * K;
  // position[] holds the running start of each expert's rows before its final values.
  int32_t start = 0;
  for (int e = 0; e < E; ++e) {
    for (size_t a = 0; a < A; ++a) {
      if (experts[a] == e) {
        order[start] = static_cast<int32_t>(a);
        position[a] = start++;
      }
    }
  }
}

__global__ void gather_forward_kernel(FArg out, FArg inp, const int32_t* order, size_t total, int K,
                                      int C) {
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t p = i / C, c = i % C;
    store(out, i, load(inp, static_cast<size_t>(order[p] / K) * C + c));
  }
}

__global__ void gather_backward_kernel(FArg dinp, FArg dout, const int32_t* position, size_t total,
                                       int K, int C) {
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t n = i / C, c = i % C;
    float d = 0.0f;
    for (int j = 0; j < K; ++j) d += load(dout, static_cast<size_t>(position[n * K + j]) * C + c);
    store(dinp, i, load(dinp, i) + d);
  }
}

__global__ void combine_forward_kernel(FArg out, FArg inp, const float* weights,
                                       const int32_t* position, size_t total, int K, int C) {
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t n = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < K; ++j) {
      const size_t a = n * K + j;
      o += weights[a] * load(inp, static_cast<size_t>(position[a]) * C + c);
    }
    store(out, i, o);
  }
}

__global__ void combine_backward_input_kernel(FArg dinp, FArg dout, const float* weights,
                                              const int32_t* position, size_t total, int K,
                                              int C) {
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t a = i / C, c = i % C, n = a / K;
    const size_t at = static_cast<size_t>(position[a]) * C + c;
    store(dinp, at, load(dinp, at) + weights[a] * load(dout, n * C + c));
  }
}

__global__ void combine_backward_weights_kernel(float* dweights, FArg dout, FArg inp,
                                                const int32_t* position, size_t total, int K,
                                                int C) {
  for (size_t a = global_thread(); a < total; a += grid_threads()) {
    const size_t n = a / K, row = static_cast<size_t>(position[a]) * C;
    float dot = 0.0f;
    for (int c = 0; c < C; ++c) dot += load(dout, n * C + c) * load(inp, row + c);
    dweights[a] += dot;
  }
}

}  // namespace

#define TRIDENT_MOE_LAUNCH(kernel, n, ...)                \
  do {                                                    \
    const Launch l = elementwise_launch(n);               \
    if (!l.empty()) {                                     \
      kernel<<<l.grid_x, l.block, 0, s>>>(__VA_ARGS__);   \
      TRIDENT_CUDA_CHECK_LAUNCH();                        \
    }                                                     \
  } while (0)

void moe_route_forward(float* weights, int32_t* experts, float* probs, float* lse, float* stats,
                       FArg logits, int N, int E, int K, Stream s) {
  TRIDENT_MOE_LAUNCH(route_forward_kernel, static_cast<size_t>(N), weights, experts, probs, lse,
                     logits, N, E, K);
  TRIDENT_MOE_LAUNCH(route_stats_kernel, static_cast<size_t>(2 * E + 1), stats, experts, probs,
                     lse, N, E, K);
}

void moe_route_backward(FArg dlogits, const float* dweights, const float* weights,
                        const float* probs, const float* lse, const int32_t* experts,
                        const float* prob_grad, float z_scale, int N, int E, int K, Stream s) {
  TRIDENT_MOE_LAUNCH(route_backward_kernel, static_cast<size_t>(N), dlogits, dweights, weights,
                     probs, lse, experts, prob_grad, z_scale, N, E, K);
}

void moe_dispatch(int32_t* order, int32_t* position, const int32_t* experts, int N, int K, int E,
                  Stream s) {
  if (N == 0) return;
  dispatch_kernel<<<1, 1, 0, s>>>(order, position, experts, N, K, E);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void moe_gather_forward(FArg out, FArg inp, const int32_t* order, int N, int K, int C, Stream s) {
  const size_t total = static_cast<size_t>(N) * K * C;
  TRIDENT_MOE_LAUNCH(gather_forward_kernel, total, out, inp, order, total, K, C);
}

void moe_gather_backward(FArg dinp, FArg dout, const int32_t* position, int N, int K, int C,
                         Stream s) {
  if (dinp.p == nullptr) return;
  const size_t total = static_cast<size_t>(N) * C;
  TRIDENT_MOE_LAUNCH(gather_backward_kernel, total, dinp, dout, position, total, K, C);
}

void moe_combine_forward(FArg out, FArg inp, const float* weights, const int32_t* position, int N,
                         int K, int C, Stream s) {
  const size_t total = static_cast<size_t>(N) * C;
  TRIDENT_MOE_LAUNCH(combine_forward_kernel, total, out, inp, weights, position, total, K, C);
}

void moe_combine_backward(FArg dinp, float* dweights, FArg dout, FArg inp, const float* weights,
                          const int32_t* position, int N, int K, int C, Stream s) {
  if (dinp.p != nullptr) {
    const size_t total = static_cast<size_t>(N) * K * C;
    TRIDENT_MOE_LAUNCH(combine_backward_input_kernel, total, dinp, dout, weights, position, total,
                       K, C);
  }
  if (dweights != nullptr) {
    const size_t total = static_cast<size_t>(N) * K;
    TRIDENT_MOE_LAUNCH(combine_backward_weights_kernel, total, dweights, dout, inp, position,
                       total, K, C);
  }
}

}  // namespace trident::cuda
