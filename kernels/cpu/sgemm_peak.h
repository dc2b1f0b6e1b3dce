// Measured single-precision GEMM throughput of this machine (OpenBLAS, current OpenMP
// thread count): the "peak" that CPU MFU is reported against. Takes well under a second.
#pragma once

namespace trident {

// Best-of-a-few GFLOP/s of a 1024^3 cblas_sgemm (2 * n^3 flops per call).
double measure_sgemm_peak_gflops();

}  // namespace trident
