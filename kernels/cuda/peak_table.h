// Dense bf16 tensor-core peaks of the GPUs Trident knows, the denominator of MFU on the
// CUDA backend (Ops::peak_flops). Host only, no device needed; `runtime.peak_tflops`
// overrides it for a GPU that is missing or differs (clocks, power caps).
#pragma once

#include <string_view>

namespace trident::cuda {

// FLOP/s for a device name as cudaGetDeviceProperties reports it ("NVIDIA H100 80GB
// HBM3", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB", ...): H100 / H200 SXM 989e12,
// H100 NVL and H200 NVL 835e12, H100 PCIe 756e12, A100 312e12, L40S 362e12,
// RTX 4090 165e12 (dense, without sparsity). 0 for an unknown name.
double peak_bf16_flops_for(std::string_view device_name);

}  // namespace trident::cuda
