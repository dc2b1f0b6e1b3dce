#include "kernels/cpu/sgemm_peak.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "core/timer.h"

namespace trident {

double measure_sgemm_peak_gflops() {
  constexpr int kN = 1024;
  constexpr int kReps = 4;
  std::vector<float> a(static_cast<size_t>(kN) * kN), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {  // arbitrary bounded values, no denormals
    a[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
    b[i] = static_cast<float>(i % 13) * 0.01f - 0.06f;
  }
  double best = 1e30;
  for (int rep = 0; rep < kReps + 1; ++rep) {  // rep 0 warms up threads and caches
    const Timer timer;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kN, kN, kN, 1.0f, a.data(), kN,
                b.data(), kN, 0.0f, c.data(), kN);
    const double s = timer.elapsed_s();
    if (rep > 0) best = std::min(best, s);
  }
  return 2.0 * kN * kN * static_cast<double>(kN) / best * 1e-9;
}

}  // namespace trident
