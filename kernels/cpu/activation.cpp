// Pointwise ops: GELU (tanh form, GPT-2), SwiGLU, add / accumulate / scale.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x)));
    }
  });
}

// d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, u = s (x + c x^3).
void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float x = inp[i];
      const float t = std::tanh(kGeluScale * (x + kGeluCube * x * x * x));
      const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
      dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
  });
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t n) {
  parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float g = gate[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
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
