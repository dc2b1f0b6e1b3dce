// AdamW update and the double-precision sum of squares used for the gradient norm.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

// Fixed chunk for sum_squares partials: the summation tree depends only on n.
constexpr size_t kSumChunk = 16384;

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWParams& p) {
  // Bias corrections in double, rounded once, so every backend agrees on them.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), p.step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), p.step));
  const float b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay;
  // Captured by value: pointers captured by reference are reloaded in the loop (they might
  // alias the data), which keeps GCC from vectorising it.
  parallel_blocks(n, [=](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) {
      const float g = grad[i];
      const float mi = b1 * m[i] + (1.0f - b1) * g;
      const float vi = b2 * v[i] + (1.0f - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float mhat = mi / bc1, vhat = vi / bc2;
      param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
    }
  });
}

double sum_squares(const float* x, size_t n) {
  const size_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (long c = 0; c < static_cast<long>(chunks); ++c) {
    const size_t b = static_cast<size_t>(c) * kSumChunk;
    const size_t e = std::min(n, b + kSumChunk);
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = b;
    for (; i + 8 <= e; i += 8)
      for (int j = 0; j < 8; ++j) {
        const double xv = x[i + j];
        acc[j] += xv * xv;
      }
    double tail = 0.0;
    for (; i < e; ++i) tail += static_cast<double>(x[i]) * x[i];
    partial[c] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) +
                 tail;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace trident::cpu
