// Rotary position embedding, "rotate half" pairing. The cos / sin table is computed in
// double and rounded once, so forward and backward use the very same rotation.
#include <algorithm>
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

// One row's H heads of HD from src to dst (which may be src: in place), rotated by the
// position's cos / sin (sign = +1: forward rotation; -1: its transpose).
inline void rotate_row(float* dst, const float* src, const float* c, const float* s, int H,
                       int HD, float sign) {
  const int half = HD / 2;
  for (int h = 0; h < H; ++h) {
    const float* u = src + static_cast<size_t>(h) * HD;
    float* v = dst + static_cast<size_t>(h) * HD;
    for (int i = 0; i < half; ++i) {
      const float x1 = u[i], x2 = u[i + half], sn = sign * s[i];
      v[i] = x1 * c[i] - x2 * sn;
      v[i + half] = x2 * c[i] + x1 * sn;
    }
  }
}

void rope_apply(float* x, int B, int T, int H, int HD, float theta, int pos_offset, float sign) {
  std::vector<float> cos_t, sin_t;
  rope_table(cos_t, sin_t, T, HD, theta, pos_offset);
  const int half = HD / 2;
  const long rows = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static) if (rows * H * HD >= static_cast<long>(kParallelMinElems))
  for (long r = 0; r < rows; ++r) {
    const size_t t = static_cast<size_t>(r % T) * half;
    float* v = x + r * H * HD;
    rotate_row(v, v, cos_t.data() + t, sin_t.data() + t, H, HD, sign);
  }
}

// The fused q/k/v row layout q | k | v and the separate tensors, either way: split (to_parts)
// copies each row's three parts out, merge copies them in; q and k rotated by `sign` when
// `rotate` (the rotation of rope_apply, so a split equals copies then rope_forward bit for
// bit, and a merge rope_backward then copies).
void qkv_permute(float* q, float* k, float* v, float* qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset, float sign, bool to_parts) {
  std::vector<float> cos_t, sin_t;
  if (rotate) rope_table(cos_t, sin_t, T, HD, theta, pos_offset);
  const int half = HD / 2;
  const size_t qd = static_cast<size_t>(NH) * HD, kvd = static_cast<size_t>(NKV) * HD;
  const size_t W = qd + 2 * kvd;
  const long rows = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static) if (rows * static_cast<long>(W) >= static_cast<long>(kParallelMinElems))
  for (long r = 0; r < rows; ++r) {
    float* fused = qkv + static_cast<size_t>(r) * W;
    float* parts[3] = {q + r * qd, k + r * kvd, v + r * kvd};
    float* fused_parts[3] = {fused, fused + qd, fused + qd + kvd};
    const int heads[3] = {NH, NKV, NKV};
    const size_t t = static_cast<size_t>(r % T) * half;
    for (int j = 0; j < 3; ++j) {
      float* dst = to_parts ? parts[j] : fused_parts[j];
      const float* src = to_parts ? fused_parts[j] : parts[j];
      if (rotate && j < 2) {
        rotate_row(dst, src, cos_t.data() + t, sin_t.data() + t, heads[j], HD, sign);
      } else {
        std::copy(src, src + static_cast<size_t>(heads[j]) * HD, dst);
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

void qkv_split(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int NKV,
               int HD, bool rotate, float theta, int pos_offset) {
  qkv_permute(q, k, v, const_cast<float*>(qkv), B, T, NH, NKV, HD, rotate, theta, pos_offset,
              1.0f, true);
}

void qkv_merge(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T,
               int NH, int NKV, int HD, bool rotate, float theta, int pos_offset) {
  qkv_permute(const_cast<float*>(dq), const_cast<float*>(dk), const_cast<float*>(dv), dqkv, B,
              T, NH, NKV, HD, rotate, theta, pos_offset, -1.0f, false);
}

}  // namespace trident::cpu
