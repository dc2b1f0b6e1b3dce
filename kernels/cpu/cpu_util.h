// Small inline helpers shared by the CPU kernels: fixed-order vectorisable reductions
// and a thread-count-independent blocked parallel loop. Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace trident::cpu {

// Element counts below this run serially: an OpenMP fork/join costs a few microseconds.
inline constexpr size_t kParallelMinElems = size_t{1} << 15;
// Fixed block for pointwise loops. Block boundaries never depend on the thread count,
// so the vector-body / scalar-tail split of every element is the same for any count.
inline constexpr size_t kPointwiseBlock = 8192;
// Column block for reductions over rows that are parallelised over columns.
inline constexpr int kColumnBlock = 64;

// Calls fn(begin, end) over [0, n) in fixed blocks, in parallel when n is large.
template <typename Fn>
inline void parallel_blocks(size_t n, Fn&& fn) {
  if (n < kParallelMinElems) {
    for (size_t b = 0; b < n; b += kPointwiseBlock) fn(b, std::min(n, b + kPointwiseBlock));
    return;
  }
  const long blocks = static_cast<long>((n + kPointwiseBlock - 1) / kPointwiseBlock);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < blocks; ++i) {
    size_t b = static_cast<size_t>(i) * kPointwiseBlock;
    fn(b, std::min(n, b + kPointwiseBlock));
  }
}

// Sum with 8 independent lanes combined in a fixed order: vectorises without
// -ffast-math and gives the same bits every time.
inline float sum_f(const float* x, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

inline float dot_f(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// exp(x) for x <= 88.7, within ~2 ulp of expf (Cephes polynomial). Unlike glibc expf
// it inlines and vectorises (8 lanes with AVX2), which matters for the softmaxes over
// 50k-column logits. Explicit fma everywhere, so scalar and vector code agree bitwise.
// x below -87.3 (where expf would go subnormal) returns 0.
inline float exp_fast(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = std::max(x, -87.3f);
  const float t = std::fma(xc, 1.44269504088896341f, kRound);
  const float n = t - kRound;  // round(x / ln 2)
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  // The low mantissa bits of t hold n: build 2^n directly in the exponent field.
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  // Zero through a bit mask: GCC will not if-convert a float select (-ftrapping-math).
  const int32_t keep = -static_cast<int32_t>(x >= -87.3f);
  return std::bit_cast<float>(std::bit_cast<int32_t>(y * scale) & keep);
}

// Max of x[0..n), n >= 1 (8 lanes, like sum_f; max is exact so order does not matter).
inline float max_f(const float* x, int n) {
  float acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = x[0];
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  float m = x[0];
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (int j = 0; j < 8; ++j) m = std::max(m, acc[j]);
  return m;
}

}  // namespace trident::cpu
