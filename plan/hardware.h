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
//                    optional: gemm_efficiency, attention_efficiency, memory_efficiency
//                    (defaults kGemmEfficiency, kAttentionEfficiency, kMemoryEfficiency)
//   interconnects: [{name, gbytes_per_s, latency_us}]   per GPU, per direction
//                    optional: efficiency (NCCL busbw / link bandwidth; default 0.8);
//                    all_reduce_share, reduce_scatter_share, all_gather_share (default 1)
//   cpu:           optional, for `--gpu cpu`: {peak_gflops, memory_gbps, link_gbytes_per_s,
//                    link_latency_us, gemm_efficiency, attention_efficiency} (all
//                    required when present; `trident plan --calibrate` writes it);
//                    optional: link_all_reduce_share, link_reduce_scatter_share,
//                    link_all_gather_share (default 1); overlap_comm_rate,
//                    overlap_compute_rate (Hardware's, in (0, 1]; default: the threads'
//                    shares of the cores); arrival_skew (Hardware's, in [0, 1); default 0)
// reserved_gib and fragmentation may be 0; the other numbers must be positive. The
// efficiencies are what `trident plan --calibrate` fits from a run's metrics
// (docs/PLAN.md "Calibration").
// Thread-compatible; nothing here touches a device.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace trident {

// The default shares of the datasheet figures a training step reaches (a table entry may
// set its own, and `trident plan --calibrate` fits them from a run).
inline constexpr double kGemmEfficiency = 0.75;       // cuBLASLt bf16 on large GEMMs (H100:
                                                      // ~700-750 of 989 TFLOP/s)
inline constexpr double kAttentionEfficiency = 0.5;   // flash / cuDNN fwd+bwd, causal
inline constexpr double kMemoryEfficiency = 0.8;      // of the datasheet HBM bandwidth
inline constexpr double kLinkEfficiency = 0.8;        // NCCL busbw / link bandwidth
// --gpu cpu: the CPU training step's share of its sgemm peak for GEMMs and attention
// (docs/PERFORMANCE.md: 53-56% on the medium GPT-2, AMD EPYC, 2 threads).
inline constexpr double kCpuEfficiency = 0.55;

// The collective kinds whose bandwidth a link states apart (CollectiveKind's first three:
// kAllReduce, kReduceScatter, kAllGather index LinkSpec::share).
inline constexpr int kRingKinds = 3;
static_assert(static_cast<int>(CollectiveKind::kAllReduce) == 0 &&
              static_cast<int>(CollectiveKind::kReduceScatter) == 1 &&
              static_cast<int>(CollectiveKind::kAllGather) == 2);

// One link class: the per-GPU, per-direction bandwidth a ring collective is bounded by,
// and one call's fixed cost.
struct LinkSpec {
  std::string name;
  double bytes_per_s = 0;
  double latency_s = 0;
  double efficiency = kLinkEfficiency;  // the busbw a ring collective reaches, as a share of bytes_per_s
  // Per collective kind (all-reduce, reduce-scatter, all-gather), the share of the
  // effective bandwidth (bytes_per_s x efficiency) its bus bytes reach. 1 for all three on
  // NCCL's rings, where each moves its bytes at the link's busbw; MPI between CPU ranks
  // reduces through memory in algorithms of its own, and there a reduce-scatter moves its
  // bytes several times slower than an all-gather (docs/PLAN.md "Calibration": fitted
  // from a run's comm_kind_least_ms). Point-to-point sends take the link's figure.
  std::array<double, kRingKinds> share = {1, 1, 1};
  // The bandwidth a collective of `kind` reaches (a send: the link's effective figure).
  double kind_bytes_per_s(CollectiveKind kind) const {
    const int k = static_cast<int>(kind);
    return bytes_per_s * efficiency * (k < kRingKinds ? share[static_cast<size_t>(k)] : 1.0);
  }
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
  // Shares of peak_flops (GEMMs, the attention core) and of memory_bandwidth (elementwise
  // passes, the optimizer) the step reaches: datasheet defaults, or fitted by calibration.
  double gemm_efficiency = kGemmEfficiency, attention_efficiency = kAttentionEfficiency;
  double memory_efficiency = kMemoryEfficiency;
  // CPU ranks whose threads (compute threads plus one communication thread per rank)
  // outnumber the cores, with overlap on: the share of its speed a dp collective keeps
  // while the rank computes beside it, and the share of its speed the compute keeps while
  // a collective is in flight (plan/overlap.h OverlapPolicy). 0: not calibrated, the
  // threads' shares of the cores instead (plan.cpp cpu_comm_rate_in_compute). Fitted by
  // `trident plan --calibrate` from a run with overlap on (docs/PLAN.md "Calibration").
  double overlap_comm_rate = 0, overlap_compute_rate = 0;
  // The ranks' arrival skew where they wait for a group's collectives: a rank waits there
  // for the others as long as their compute since the last such wait took longer than its
  // own. Per step, the least waiting rank of a group waits
  //   arrival_skew x (sum of d_i - sqrt(sum of d_i^2)),
  // d_i the compute between the group's consecutive waits (plan.cpp arrival_skew_seconds:
  // two ranks whose compute of d varies independently by a share proportional to d; one
  // long segment costs the last to arrive nothing, many short ones add up). 0: none (the GPU entries; an uncalibrated cpu). Fitted by `trident plan
  // --calibrate` from runs whose metrics give each collective's least time apart
  // (docs/PLAN.md "Calibration").
  double arrival_skew = 0;
  bool is_cpu = false;
};

struct HardwareTable {
  std::vector<Hardware> gpus;  // in file order
  std::vector<LinkSpec> links;  // in file order
  // The table's `cpu` entry (a calibrated one), else none: --gpu cpu then measures.
  bool has_cpu = false;
  Hardware cpu;
};

// The table as YAML that parse_hardware_table reads back to the same figures (to 6
// significant digits: the GPUs, the links and the cpu entry when present), after `header`
// as comment lines (calibration says there where each figure came from).
std::string hardware_table_yaml(const HardwareTable& table, const std::string& header);

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
