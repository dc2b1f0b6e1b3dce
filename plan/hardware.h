// The hardware `trident plan` plans for (docs/PLAN.md): a GPU's peak bf16 FLOP/s,
// memory and memory bandwidth, and the links between GPUs (NVLink inside a node, the
// network across nodes), read from a small YAML table (configs/hardware.yaml), or this
// machine for `--gpu cpu` (the CPU backend's measured sgemm peak, the memory this
// process may use).
//
// The table (strict: an unknown key, a missing one or a non-positive number is an
// error naming the file, the entry and the key):
//   gpus:          [{name, peak_bf16_tflops, memory_gib, memory_tbps, interconnect, network,
//                    reserved_gib, fragmentation}]
//   interconnects: [{name, gbytes_per_s, latency_us}]   per GPU, per direction
// reserved_gib and fragmentation may be 0; the other numbers must be positive.
// Thread-compatible; nothing here touches a device.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

// One link class: the per-GPU, per-direction bandwidth a ring collective is bounded by,
// and one call's fixed cost.
struct LinkSpec {
  std::string name;
  double bytes_per_s = 0;
  double latency_s = 0;
};

// The device a plan is for, with its links.
struct Hardware {
  std::string name;              // "h100", ..., "cpu"
  double peak_flops = 0;         // dense bf16 (GPU) or the measured sgemm rate (cpu)
  double memory_bytes = 0;       // per device (cpu: what this process may use, all ranks)
  double memory_bandwidth = 0;   // bytes/s
  LinkSpec intra_node, inter_node;
  // What a training process holds on the device besides Trident's own allocations (CUDA
  // context, cuBLASLt and cuDNN plan workspaces, NCCL's channel buffers), bytes; and the
  // share of Trident's device allocations the allocator loses to rounding and
  // fragmentation. Both 0 on the cpu, whose plan is exact.
  double reserved_bytes = 0;
  double fragmentation = 0;
  bool is_cpu = false;
};

struct HardwareTable {
  std::vector<Hardware> gpus;  // in file order
};

// Parses the table; errors name `source`, the entry and the key.
Result<HardwareTable> parse_hardware_table(const std::string& yaml_text, const std::string& source);
// Reads and parses a table file (a missing file is invalid_input naming it).
Result<HardwareTable> load_hardware_table(const std::string& path);
// The table next to the executable (<exe dir>/../configs/hardware.yaml, then
// <exe dir>/configs/...: build/trident finds the checkout's), else configs/hardware.yaml
// in the working directory.
std::string default_hardware_path();

// The GPU called `name` (case-insensitive). Unknown: invalid_input "--gpu: unknown GPU
// 'x'; known: h100, h200, a100, b200, cpu".
Result<Hardware> find_gpu(const HardwareTable& table, const std::string& name);

// This machine as one plan device: `peak_flops` measured (Ops::peak_flops of the CPU
// backend), `memory_bytes` the memory the ranks share (available_host_memory). Its
// memory bandwidth and its "links" (MPI over shared memory) are rough fixed figures
// (kCpu* in hardware.cpp), stated in docs/PLAN.md.
Hardware cpu_hardware(double peak_flops, double memory_bytes);

}  // namespace trident
