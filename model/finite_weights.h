// The finiteness check of the weight loaders (model/llmc_checkpoint.h, model/safetensors.h):
// a NaN or Inf in a model.init_from file is a corrupt or diverged file, refused when it is
// read, not found by the loss guard at step 1.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

namespace trident {

// The first NaN or Inf in data[0, n), as "element i of n is NaN (...)" (or +Inf, -Inf);
// "" when every value is finite.
inline std::string non_finite_problem(const float* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(data[i])) continue;
    const char* what = std::isnan(data[i]) ? "NaN" : data[i] > 0 ? "+Inf" : "-Inf";
    return "element " + std::to_string(i) + " of " + std::to_string(n) + " is " + what +
           " (weights must be finite: a corrupt file or one saved from a diverged run)";
  }
  return "";
}

}  // namespace trident
