#include "kernels/cuda/peak_table.h"

namespace trident::cuda {
namespace {

bool has(std::string_view name, std::string_view part) {
  return name.find(part) != std::string_view::npos;
}

}  // namespace

double peak_bf16_flops_for(std::string_view name) {
  // Variants before the family: "H100 NVL" and "H100 PCIe" also contain "H100".
  if (has(name, "H100") || has(name, "H200")) {
    if (has(name, "NVL")) return 835e12;
    if (has(name, "PCIe")) return 756e12;
    return 989e12;  // SXM (the names carry no "SXM": "NVIDIA H100 80GB HBM3", "NVIDIA H200")
  }
  if (has(name, "A100")) return 312e12;
  if (has(name, "L40S")) return 362e12;
  if (has(name, "RTX 4090")) return 165e12;
  return 0.0;
}

}  // namespace trident::cuda
