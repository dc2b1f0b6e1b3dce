// Rotary position embedding, "rotate half" pairing. The cos / sin table is computed in
// double and rounded once, so forward and backward use the very same rotation.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

// table[t * half + i] = (cos, sin) of (t + pos_offset) * theta^(-2i/HD).
void rope_table(std::vector<float>& cos_t, std::vector<float>& sin_t, int T, int HD,
                float theta, int pos_offset) {
  const int half = HD / 2;
  cos_t.resize(static_cast<size_t>(T) * half);
  sin_t.resize(static_cast<size_t>(T) * half);
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / HD);
    for (int t = 0; t < T; ++t) {
      const double angle = static_cast<double>(t + pos_offset) * inv_freq;
      cos_t[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
      sin_t[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

// sign = +1: forward rotation; -1: its transpose.
void rope_apply(float* x, int B, int T, int H, int HD, float theta, int pos_offset, float sign) {
  std::vector<float> cos_t, sin_t;
  rope_table(cos_t, sin_t, T, HD, theta, pos_offset);
  const int half = HD / 2;
  const long rows = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static) if (rows * H * HD >= static_cast<long>(kParallelMinElems))
  for (long r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T);
    const float* c = cos_t.data() + static_cast<size_t>(t) * half;
    const float* s = sin_t.data() + static_cast<size_t>(t) * half;
    for (int h = 0; h < H; ++h) {
      float* v = x + (r * H + h) * HD;
      for (int i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[i + half], sn = sign * s[i];
        v[i] = x1 * c[i] - x2 * sn;
        v[i + half] = x2 * c[i] + x1 * sn;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, int B, int T, int H, int HD, float theta, int pos_offset) {
  rope_apply(x, B, T, H, HD, theta, pos_offset, 1.0f);
}

void rope_backward(float* dx, int B, int T, int H, int HD, float theta, int pos_offset) {
  rope_apply(dx, B, T, H, HD, theta, pos_offset, -1.0f);
}

}  // namespace trident::cpu
