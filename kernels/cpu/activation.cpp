// Pointwise ops: GELU (tanh form, GPT-2), SwiGLU, add / accumulate / scale.
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// 1 / (1 + exp(-z)) through exp_fast, which inlines and vectorises (libm's tanhf and expf
// do neither: they made GELU a quarter of a GPT-2 step, docs/PERFORMANCE.md). With
// e = exp(-|z|) in (0, 1] (never out of exp_fast's range, no cancellation):
// sigmoid(|z|) = 1 / (1 + e) and sigmoid(-|z|) = e / (1 + e), picked by the sign through a
// bit mask (GCC will not if-convert a float select, which would stop the vectoriser).
// A NaN z gives 0; callers multiply by z or x, so NaN still propagates.
inline float sigmoid(float z) {
  const float e = exp_fast(-std::fabs(z));
  const float s = 1.0f / (1.0f + e);
  const float neg = e * s;
  const int32_t pos = -static_cast<int32_t>(z >= 0.0f);
  return std::bit_cast<float>((std::bit_cast<int32_t>(s) & pos) |
                              (std::bit_cast<int32_t>(neg) & ~pos));
}

}  // namespace

// GELU's tanh form through the identity 0.5 (1 + tanh u) = sigmoid(2u):
// out = x sigmoid(2u), u = s (x + c x^3).
void gelu_forward(float* out, const float* inp, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float x = inp[i];
      out[i] = x * sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
    }
  });
}

// d/dx = sg + 2 x sg (1 - sg) du/dx, sg = sigmoid(2u), du/dx = s (1 + 3 c x^2)
// (= 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx).
void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float x = inp[i];
      const float sg = sigmoid(2.0f * kGeluScale * (x + kGeluCube * x * x * x));
      const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
      dinp[i] += dout[i] * (sg + 2.0f * x * sg * (1.0f - sg) * du);
    }
  });
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float g = gate[i];
      out[i] = g * sigmoid(g) * up[i];
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float g = gate[i];
      const float sig = sigmoid(g);
      if (dgate != nullptr) dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
      if (dup != nullptr) dup[i] += dout[i] * g * sig;
    }
  });
}

void add(float* out, const float* a, const float* b, size_t n) {
  parallel_blocks(n, [&](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

void accumulate(float* dst, const float* src, size_t n) {
  parallel_blocks(n, [&](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) dst[i] += src[i];
  });
}

void scale(float* x, float s, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) x[i] *= s;
  });
}

}  // namespace trident::cpu
