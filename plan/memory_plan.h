// The memory plan of a training run: how many bytes each rank will hold, computed from
// the Config and the rank's partition alone (closed-form counts, nothing allocated, no
// table built whose size grows with the model), and the start-up check that the ranks
// sharing a machine fit in its memory.
//
// The figures follow the allocations of the trainer exactly where the trainer's own
// accounting exists (tests/plan/memory_plan_test.cpp and, over several ranks,
// tests/plan/memory_plan_mpi_test.cpp compare them):
//   params, master, grads,    = DataParallel::memory() params_peak, master, grads_peak,
//   optimizer                   optimizer
//                               (parallel/data_parallel.h; ZeRO stage aware: stage 3
//                               counts the shard plus the pool of the groups gathered at
//                               once, stages 2-3 the gradient shard plus the pool of the
//                               group gradients held in backward, stage 1 the full
//                               gradients plus the reduced shard; all allocated at start)
//   activations               = Transformer::activation_bytes() with
//                               PipelineExecutor::required_slots() slots, the largest
//                               chunk's slot bytes under interleaving (the attention
//                               state is sized by the backend: Ops::attention_state_bytes)
//   other.comm_buffers        = DataParallel::memory().comm_scratch
//                               (bucketed parameter all-gather, stages 1-2, plus the ZeRO-2/3
//                               store's collective scratch)
// The rest of `other` is an estimate of what the trainer holds besides: the model's
// backward scratch (exact), the largest transient buffer (the host staging of one tensor
// at initialisation) and tables (parameter
// layout, pipeline schedule, token buffers). `checkpoint` is the host snapshot every
// save takes (checkpoint/writer.h): the parameters and both moments of the rows this
// rank saves; a run that fits only without it would die at its first save.
//
// The check (check_memory_fits) compares, for every machine, the sum over the ranks on
// it with the memory available to them: physical memory capped by the cgroup limit
// (v2 memory.max, v1 memory.limit_in_bytes), or TRIDENT_MEMORY_LIMIT_BYTES when set (a
// test and override hook). On a backend with its own device memory (Ops::device_memory:
// CUDA) the device-resident kinds (parameters, masters, gradients, optimizer state,
// activations, scratch, comm buffers, workspaces) are compared with each rank's free
// device memory instead, and only the host-resident ones (checkpoint snapshot, transient
// host copies, tables, pinned staging) count against the machine's memory. Every rank decides from the same all-gathered reports, so
// every rank returns the same Status (no rank trains while another gives up).
// Thread-compatible; plan_and_check_memory is collective over the world.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"
#include "config/config.h"

namespace trident {

class Communicator;

// Bytes one rank holds at its peak, by kind (doubles: huge configs must not wrap).
struct RankMemory {
  double params = 0;        // compute weights (fp32, or bf16 under training.precision bf16)
  double master = 0;        // fp32 master weights (bf16 only; fp32 trains the masters)
  double grads = 0;         // gradients
  double optimizer = 0;     // AdamW first and second moments
  double activations = 0;   // saved activations of every pipeline slot
  double checkpoint = 0;    // host snapshot of a checkpoint (saved rows: param, 2 moments)
  double other = 0;         // = scratch + comm_buffers + transient + tables
  double scratch = 0;       // the model's backward scratch and recomputed layer tensors
                            // (shared by all slots: Transformer::scratch_bytes)
  double comm_buffers = 0;  // persistent buffers of the dp collectives
  double transient = 0;     // the largest short-lived buffer
  double tables = 0;        // parameter tables, pipeline schedule, token buffers
  double workspace = 0;     // the backend's attention scratch and library workspaces
                            // (Ops::attention_workspace_bytes; device-resident)
  double pinned = 0;        // pinned host staging of transfers (Ops::device_memory)
  double total = 0;  // params + master + grads + optimizer + activations + checkpoint + other
  // The parts that live on the device when the backend has one (else in host memory too),
  // and those that live in host memory whatever the backend; they add up to total.
  double device_resident() const {
    return params + master + grads + optimizer + activations + scratch + comm_buffers +
           workspace;
  }
  double host_resident() const { return checkpoint + transient + tables + pinned; }
};

// The bytes of one layer's attention state for a micro-batch (Ops::attention_state_bytes
// of the backend that will run): lets a plan be made without constructing that backend.
// `dtype` is the compute dtype (training.precision).
using AttentionStateBytes =
    std::function<size_t(int B, int T, int NH, int NKV, int HD, DType dtype)>;

// What training.recompute selective reruns in backward, per layer: Trident's own policy
// (the attention core), or torchtitan's op-level one, for planning a run of that trainer
// (plan/plan.h describes both; `trident plan --selective-reruns`).
enum class SelectiveReruns { kAttentionCore, kTorchtitanOp };

// One matmul of a dense block under torchtitan's op-level selective checkpointing
// (SelectiveReruns::kTorchtitanOp): the block's matmuls in the order its forward runs
// them (attention q, k, v, o; the MLP's first, SwiGLU's up, the down projection), each
// saved when odd-numbered and rerun when even (torchtitan/parallelisms/
// parallelize_llama.py, April 2024: "saves output of all compute ops, except every
// second mm"). Sizes are this rank's tensor-parallel part.
struct OpPolicyMatmul {
  double weight_elements = 0;  // of the local weight
  double out_width = 0;        // local output elements per token row
  bool row_parallel = false;   // its output is reduced over tp (attention o, MLP down)
  bool saved = false;          // the policy keeps its output; else backward reruns it
};
std::vector<OpPolicyMatmul> torchtitan_op_matmuls(const TransformerConfig& model, int tp);

// The plan of the rank with this partition and data-parallel rank (its rank in the
// dp x cp group, Topology::dp_cp_rank: the dp rank at cp 1) (with
// parallel.virtual_stages > 1, `part` names the rank by its tp and pp rank and the plan
// counts every chunk of plan/partition.h: each chunk's model holds its own slots and
// backward scratch). `config` is
// validated (validate_config) and its model finalized. `ops` is the backend the run
// uses; only its size queries are called (Ops::attention_state_bytes,
// attention_workspace_bytes, device_memory's pinned staging).
RankMemory estimate_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                                const Ops& ops);
// The same with the attention state size given directly (trident plan, for a GPU).
// `selective_reruns` kTorchtitanOp (with training.recompute selective, dense models
// only): the activations are those torchtitan's op-level policy keeps, a model of that
// trainer's allocations, not Trident's (memory_plan.cpp says what it counts).
RankMemory estimate_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                                const AttentionStateBytes& attention_state_bytes,
                                SelectiveReruns selective_reruns = SelectiveReruns::kAttentionCore);

// Activation slots the pipeline schedule keeps live on `stage`, in the one pool its model
// chunks share: the closed form of PipelineExecutor::required_slots (parallel/pipeline.h
// pipeline_stage_slots; the executor walks the whole schedule).
int pipeline_slots(PipeSchedule schedule, int pp, int stage, int num_micro,
                   int virtual_stages = 1);

// The memory this process may use, and where the figure comes from ("physical memory",
// "cgroup limit", "TRIDENT_MEMORY_LIMIT_BYTES").
struct HostMemory {
  double bytes = 0;
  std::string source;
};
// TRIDENT_MEMORY_LIMIT_BYTES (a positive integer) if set, else min(physical, cgroup).
// An unparsable override is an error naming the variable.
Result<HostMemory> available_host_memory();

// One rank's entry in the check: its machine (a hash of the host name), the memory
// available there, its device's free and total memory (0: no device memory of its own,
// everything counts against the host), and its plan. Trivially copyable (it is
// all-gathered as bytes).
struct RankMemoryReport {
  uint64_t host = 0;
  double available = 0;
  double device_free = 0, device_total = 0;
  RankMemory need;
};
static_assert(std::is_trivially_copyable_v<RankMemoryReport>);

// OK when every rank with a device fits its device-resident parts into its free device
// memory, and, on every machine, the ranks' host parts (their totals for ranks without
// a device) sum to at most its available memory. Otherwise kInvalidConfig (exit 2)
// naming the figures of the most over-committed device or machine, its biggest consumer
// and the keys to change. `source` says where the host figure came from,
// `device_source` the device figure (for the message). Pure: tests call it directly.
Status check_memory_fits(const Config& config, std::span<const RankMemoryReport> reports,
                         const std::string& source,
                         const std::string& device_source = "cudaMemGetInfo");

// "<total> per rank (parameters ..., ...)" of `m`, for logs and messages.
std::string describe_rank_memory(const RankMemory& m);

// Collective over `world`: estimates this rank's plan, all-gathers the reports, logs one
// info line on world rank 0 (unless quiet) and returns check_memory_fits.
Status plan_and_check_memory(const Config& config, const ModelPartition& part, int dp_rank,
                             const Ops& ops, Communicator& world, bool quiet);

}  // namespace trident
