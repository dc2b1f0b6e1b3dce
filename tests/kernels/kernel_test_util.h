// Helpers for the tests that call Ops directly: device copies of host vectors for one Ops
// call, seeded random data, float <-> double conversion and a tolerance check. The ops
// themselves are checked against float64 references in the op table (op_table.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "tests/kernels/op_table.h"

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

// Every |a - e| <= tol * (|e| + rms(e)): the op table's comparison (op_table.h), relative
// with an absolute floor at the scale of the data, so near-zero entries produced by
// cancellation do not dominate.
inline void expect_close(const VecF& actual, const VecD& expected, double tol,
                         const std::string& what) {
  op_table::Report r;
  op_table::detail::compare(r, what, to_d(actual), expected, op_table::Tol{tol, 0.0});
  EXPECT_TRUE(r.ok()) << r.str();
}

// The tolerance of an fp32 result against a float64 reference.
inline constexpr double kTolF32 = 2e-5;

}  // namespace trident::testing
