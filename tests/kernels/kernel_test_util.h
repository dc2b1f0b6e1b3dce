// Helpers for the CPU kernel tests: device copies of host vectors for one Ops call, seeded
// random data, float <-> double conversion, tolerance checks against float64 references,
// and central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace trident::testing {

// A device copy of a host vector: uploaded on construction and, for a non-const vector,
// downloaded back into it on destruction. As a temporary argument it lives until the end
// of the full expression, so one Ops call reads and writes host vectors:
//   ops->gelu_forward(dev(*ops, out), dev(*ops, inp), n);
// Two dev() of one vector are two buffers: a test of aliasing names one DevVec and
// passes it twice.
template <class T>
class DevVec {
 public:
  DevVec(Ops& ops, std::vector<T>& host) : DevVec(ops, host.data(), host.size()) {
    writeback_ = host.data();
  }
  DevVec(Ops& ops, const std::vector<T>& host) : DevVec(ops, host.data(), host.size()) {}
  DevVec(Ops& ops, const T* host, size_t n) : ops_(ops), buf_(ops, n * sizeof(T)), n_(n) {
    if (n > 0) ops_.upload(buf_.get(), host, n * sizeof(T));
  }
  ~DevVec() {
    if (writeback_ != nullptr && n_ > 0) ops_.download(writeback_, buf_.get(), n_ * sizeof(T));
  }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  DevPtr ptr() const { return buf_.as(dtype_of<T>()); }
  operator DevPtr() const { return ptr(); }
  // The same buffer seen as another dtype (an opaque attention state as u8).
  DevPtr as(DType dtype) const { return buf_.as(dtype); }

 private:
  Ops& ops_;
  DeviceBuffer buf_;
  size_t n_;
  T* writeback_ = nullptr;
};

template <class T>
DevVec<T> dev(Ops& ops, std::vector<T>& host) {
  return DevVec<T>(ops, host);
}
template <class T>
DevVec<T> dev(Ops& ops, const std::vector<T>& host) {
  return DevVec<T>(ops, host);
}

using VecF = std::vector<float>;
using VecD = std::vector<double>;

inline VecF random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  VecF v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline VecD to_d(const VecF& v) { return VecD(v.begin(), v.end()); }

// Every |a - e| <= tol * (|e| + rms(e)): relative, with an absolute floor at the scale of
// the data so near-zero entries produced by cancellation do not dominate.
inline void expect_close_d(const VecD& actual, const VecD& expected, double tol,
                           const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double ss = 0;
  for (double e : expected) ss += e * e;
  const double rms = expected.empty() ? 0.0 : std::sqrt(ss / expected.size());
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(actual[i] - expected[i]);
    if (!(err <= tol * (std::abs(expected[i]) + rms))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << " want " << expected[i]
                      << " (tol " << tol << ", rms " << rms << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << expected.size() << " out of tolerance";
}

// The same check for fp32 results.
inline void expect_close(const VecF& actual, const VecD& expected, double tol,
                         const std::string& what) {
  expect_close_d(to_d(actual), expected, tol, what);
}

// Gradient of loss(x) by central differences in double.
inline VecD numeric_grad(const std::function<double(const VecD&)>& loss, VecD x,
                         double h = 1e-5) {
  VecD g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

inline double weighted_sum(const VecD& out, const VecD& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// A backward call on grads pre-filled with `before` must give before + (what the same
// call gives on zeroed grads), up to the rounding of that one addition.
inline void expect_accumulated(const VecF& after, const VecF& before, const VecF& fresh,
                               const std::string& what) {
  ASSERT_EQ(after.size(), before.size()) << what;
  ASSERT_EQ(after.size(), fresh.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    const double want = static_cast<double>(before[i]) + fresh[i];
    const double tol = 1e-6 * (std::abs(before[i]) + std::abs(fresh[i])) + 1e-30;
    if (!(std::abs(after[i] - want) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << after[i] << " want " << want;
  }
  EXPECT_EQ(bad, 0) << what << " does not accumulate (+=)";
}

// Tolerances: float64 reference vs fp32 op, and finite differences vs the reference's
// analytic backward (both in double).
inline constexpr double kTolF32 = 2e-5;
inline constexpr double kTolFd = 1e-6;

}  // namespace trident::testing
