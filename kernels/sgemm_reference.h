// A float64 reference for one element of a row-major sgemm (C = op(A) op(B) + beta C0,
// alpha 1), shared by tests/kernels/sgemm_grid_test.cpp and bench/bench_gemm.cpp.
#pragma once

#include <cmath>
#include <cstddef>

namespace trident::testing {

struct SgemmReference {
  double value;      // the element in float64
  double magnitude;  // |beta c0| + sum |a b|: the scale its rounding error goes with
};

// C[i, j] of C[M, N] = op(A) op(B) + beta C0 with inner dimension K; op transposes when
// asked (A is lda-strided [M, K] or, transposed, [K, M]; B [K, N] or [N, K]).
inline SgemmReference sgemm_reference(bool trans_a, bool trans_b, int K, const float* A,
                                      int lda, const float* B, int ldb, float beta, float c0,
                                      int i, int j) {
  double s = static_cast<double>(beta) * c0, mag = std::fabs(s);
  for (int k = 0; k < K; ++k) {
    const double a = trans_a ? A[static_cast<size_t>(k) * lda + i]
                             : A[static_cast<size_t>(i) * lda + k];
    const double b = trans_b ? B[static_cast<size_t>(j) * ldb + k]
                             : B[static_cast<size_t>(k) * ldb + j];
    s += a * b;
    mag += std::fabs(a * b);
  }
  return {s, mag};
}

}  // namespace trident::testing
