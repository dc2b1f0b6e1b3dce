// `trident plan` (docs/PLAN.md): for every valid
// layout of a config's model and batch on N devices, the memory per rank by kind, the
// bytes and time per process group, the pipeline bubble, the predicted step time,
// tokens/s and MFU; a ranking and the recommended layout.
//
// One source of truth: memory is plan/memory_plan.h's estimate_rank_memory, traffic
// plan/traffic_model.h's analytic_traffic on describe_params (model/model_description.h), validity
// validate_config, the bubble parallel/pipeline.h's pipeline_bubble_fraction, model
// FLOPs TransformerConfig::flops_per_token. What is new here is only the mapping of
// those figures to a device and a time.
//
// Memory on the device (what the backend's Ops allocates; PlanMemory):
//   params      compute weights (RankMemory::params)
//   grads       gradients (RankMemory::grads)
//   optimizer   AdamW moments plus, under bf16, the fp32 masters (RankMemory::optimizer
//               + master: Megatron's distributed optimizer counts them alike)
//   activations every live pipeline slot (RankMemory::activations: the pipeline's peak)
//   buffers     the dp collectives' persistent buffers + the model's backward scratch and
//               recompute set (RankMemory::comm_buffers + scratch), and the loss and
//               gradient-norm f64 accumulators (16 bytes RankMemory leaves out)
//   workspace   GPU: the hardware table's reserved_gib (CUDA context, cuBLASLt/cuDNN plan
//               workspaces, NCCL buffers; not allocated through Ops) plus the attention
//               path's own scratch (gpu_attention_workspace_bytes); cpu: 0
//   fragmentation GPU: the table's fragmentation share of the allocations above; cpu: 0
// Host memory (RankMemory::checkpoint + transient + tables) is not on a GPU; on the CPU
// device and host are one memory, so a cpu plan counts both against it.
// GPU attention state (gpu_attention_state_bytes): what the CUDA backend's default path
// keeps per layer: in bf16 the fused (cuDNN) path's log-sum-exp, B*NH*T*4 bytes; in fp32
// the plain path's probabilities, B*NH*T*T*4 bytes (cuDNN's flash attention is bf16 only).
// That the runtime's cuDNN has a plan for the shape is an assumption here. Its scratch
// (gpu_attention_workspace_bytes), shared by the layers: fused, the softmax sum [B, NH, T]
// f32 and cuDNN's bf16 dq, dk, dv; plain, the scores and probabilities [B, NH, T, T].
//
// Time (per optimizer step, the most loaded pipeline stage):
//   per micro-batch compute c = GEMM FLOPs / (peak * gemm_efficiency)
//                             + attention-core FLOPs (causal) / (peak * attention_efficiency)
//                             + elementwise bytes / (memory bandwidth * memory_efficiency)
//     (the Hardware's efficiencies: plan/hardware.h's defaults, or calibrated)
//     forward once, backward twice, plus the forward recompute reruns (full: the layer,
//     selective: the attention core, or what PlanOptions::selective_reruns says). GPU
//     fp32 runs at TF32 = half the bf16 peak. On the cpu GEMMs and attention run at
//     kCpuEfficiency of the measured sgemm rate by default.
//   per micro-batch tp = tp payload * bus_factor / (link bandwidth * link efficiency)
//     + calls * latency, on
//     NVLink when the tp group sits in one node (tp <= gpus_per_node), else the network;
//     pp likewise for one boundary send each way per model chunk (NVLink only when a
//     whole pipeline fits in a node). Both on the critical path (Trident does not overlap
//     them with compute).
//   dp: its payload * bus_factor / bandwidth + one latency per collective the trainer
//     issues (plan/traffic_model.h dp_collective_calls) (dp_comm_s), of
//     which the part no compute covers is exposed (plan/overlap.h): the trainer's
//     collectives as it issues them, per parameter group (ZeRO-0/1 the buckets at the
//     last micro-batch's backward; ZeRO-2/3 a reduce-scatter after every backward of a
//     group; ZeRO-3 a gather before every forward and backward of a group), hidden behind
//     the compute that follows them when parallel.overlap_grad_reduce /
//     overlap_param_gather are on, all exposed when off. ZeRO-1/2's parameter all-gather
//     after the update and the tied-embedding all-reduce are always exposed. On CPU
//     ranks whose threads outnumber the cores, collectives and compute beside each other
//     run at the overlap rates (Hardware::overlap_comm_rate, overlap_compute_rate); the
//     compute so lost is dp_slowdown_s, apart from the waits (dp_s).
//   per micro-batch cp (parallel.cp > 1) = the exposed part of the ring: each hop's
//     bytes (plan/traffic_model.h) / (link bandwidth * link efficiency) + one latency, on
//     NVLink when the cp group (with the tp inside it) sits in one node, else the
//     network, less the block attention it overlaps (RingAttention::kOverlapsCompute):
//     per layer max(0, hop - block compute) for the hops in flight during a block, and
//     the last dK/dV hop whole (plan.cpp cp_ring_seconds). Under cp a rank computes 1/cp of each
//     micro-batch (c above divided by cp), selective recomputation reruns nothing (the
//     ring keeps its state), and dp is the dp x cp group.
//   per micro-batch ep (parallel.ep > 1) = the all-to-all's bytes (plan/traffic_model.h:
//     counts, dispatch and combine per forward, twice under full recomputation, and their
//     gradients in backward, per MoE layer; routing taken balanced), 1/ep of them to each
//     member of the ep group: those in the node over NVLink, the rest through the rank's
//     NIC, at once; plus one latency per call; all exposed (the trainer blocks on them).
//     The experts' gradients are reduced over the dp / ep ranks holding the same experts
//     (expert_dp, their link) like dp's (its exposed part added to dp), the rest over dp.
//   optimizer = the AdamW pass over the local shard, memory bound.
//   step = (m + (p - 1) / v) * (c + tp + pp + cp + ep) + exposed dp + optimizer
//     (m micro-batches, p stages, v model chunks per stage: the bubble (p-1)/(v*m+p-1));
//     its parts compute, recompute, bubble, tp, pp, cp, ep, dp, optimizer add up to it.
// tokens/s per GPU = global_batch_size * seq_len / step / N; MFU = flops_per_token (a
// mixture of experts: the active parameters', leading dense layers dense) *
// tokens/s per GPU / peak (model FLOPs only, the bf16 peak; docs/CONFIG.md "FLOPs per token
// and MFU").
//
// Thread-compatible; plans allocate nothing on a device.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/model_description.h"
#include "model/transformer.h"
#include "config/config.h"
#include "plan/hardware.h"
#include "plan/memory_plan.h"

namespace trident {

// Reductions a ReduceScatterQueue keeps in flight (parallel/reduce_scatter_queue.h: the
// DataParallel's queue has 2 slots; plan/memory_plan.cpp counts the same two).
inline constexpr int kReduceQueueDepth = 2;
// Interleaved 1F1B: the most model chunks per stage plan tries (Megatron runs use 2-8).
inline constexpr int kMaxVirtualStages = 8;
// Bounds of the search, so that any config is answered in about a second and a few
// hundred MB (make_plan refuses beyond them, exit 2 naming the key or flag): the model's
// layers (every stage's parameter table lists its layers; the largest published models
// have under 200), the candidate layouts tried (micro-batch sizes run over the divisors
// of the batch per dp rank), and the stage evaluations of the valid ones (one memory
// estimate per pipeline stage; with v chunks per stage each one walks all pp * v chunks).
inline constexpr int kMaxPlanLayers = 1024;
inline constexpr int64_t kMaxPlanCandidates = 50000;
inline constexpr double kMaxPlanStageWork = 3e7;

// The dimensions plan varies and reports (comm_bytes_per_step, the table's columns); ep
// (expert parallelism, folded into dp) is 1 but for mixtures of experts.
inline constexpr ParallelDim kPlannedDims[] = {ParallelDim::kDp, ParallelDim::kTp,
                                               ParallelDim::kPp, ParallelDim::kCp,
                                               ParallelDim::kEp};
// Context parallelism is tried only where every cp rank keeps at least this many tokens
// of a sequence (so cp > 1 only for sequences of 2 x 8192 tokens and more): below it the
// ring's blocks are small next to its hops, long-context training runs it at 32K-128K, and
// the search stays as small as before for ordinary lengths.
inline constexpr int kMinCpTokensPerRank = 8192;

// A candidate: the parallel layout plus the recompute and micro-batch choices plan varies.
struct PlanCandidate : ParallelLayout {
  Recompute recompute = Recompute::kNone;
  int micro_batch_size = 1;
  bool operator==(const PlanCandidate&) const = default;
};
std::string layout_name(const PlanCandidate& l);  // "dp4 tp8 pp8 z1 sp full mbs1"

// Bytes of one rank (the kinds above). total: what counts against the device's memory
// (GPU: the device kinds; cpu: device + host).
struct PlanMemory {
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0, workspace = 0;
  double fragmentation = 0;
  double host = 0;
  double device() const {
    return params + grads + optimizer + activations + buffers + workspace + fragmentation;
  }
  double total = 0;
};

// What training.recompute selective reruns in backward, per layer (PlanOptions::
// selective_reruns; `trident plan --selective-reruns`):
//   kAttentionCore  Trident's (Megatron-LM's, Korthikanti et al. 2022): the attention core,
//                   its passes over the scores included; every other layer buffer is kept.
//   kTorchtitanOp   torchtitan's op-level policy (selective_ac_option "op",
//                   torchtitan/parallelisms/parallelize_llama.py): per checkpointed block it
//                   saves the outputs of the attention (SDPA) and of every odd-numbered
//                   matmul in forward order (q, v and the MLP's first, and SwiGLU's down
//                   projection) and reruns the rest: the even-numbered matmuls (k, o, and
//                   SwiGLU's up or GELU's down projection) and every elementwise pass.
//                   For planning a run of that trainer on a dense model (the CLI refuses
//                   a mixture of experts); Trident has no such setting. Its memory is
//                   that policy's too: per layer the block input and the saved outputs,
//                   plus one block's rerun working set (estimate_rank_memory).
// (The enum is plan/memory_plan.h's.)
const char* selective_reruns_name(SelectiveReruns s);  // "attention-core", "torchtitan-op"
bool parse_selective_reruns(const std::string& name, SelectiveReruns* out);  // false: unknown
// One layer's forward work that backward reruns under training.recompute `r` (StageFlops::
// recompute, but for kSelective as `s` says). `w`: describe_flops of the same config, part
// and micro-batch (its layer's work, sequence parallelism included).
Work layer_reruns(const TransformerConfig& model, const ModelPartition& part, const StageFlops& w,
                  int micro_batch_size, Recompute r, SelectiveReruns s);

struct PlanOptions {
  int devices = 1;
  int gpus_per_node = 8;
  Hardware hardware;
  AttentionStateBytes attention_state_bytes;  // per layer and micro-batch
  // Evaluate the configured layout only (no search, so none of its bounds): `trident plan
  // --configured-only`, for checking a published layout of any size.
  bool configured_only = false;
  // The run's attention core takes the CUDA backend's plain path for every shape
  // (TRIDENT_ATTENTION=plain, kernels/cuda/cuda_ops.cpp; `trident plan` reads the same
  // variable): its memory (attention_state_bytes should then be
  // gpu_plain_attention_state_bytes) and its time, the whole T x T scores at the GEMM
  // rate and their passes through memory. Without it the path is the dtype's (bf16:
  // fused where cuDNN takes the head dim; f32: plain).
  bool plain_attention = false;
  // What selective recomputation reruns (SelectiveReruns).
  SelectiveReruns selective_reruns = SelectiveReruns::kAttentionCore;
  // The cp ring overlaps its exchanges with the block attention (RingAttention's
  // default); false: the ring runs blocking (TRIDENT_RING_OVERLAP=0,
  // parallel/context_parallel.h; `trident plan` reads the same variable) and all of its
  // exchanges are exposed (cp_s == cp_comm_s).
  bool ring_overlap = true;
  // --gpu cpu: the cores the ranks share (`trident plan --cores N`), which set the compute
  // threads' share of a core while a collective is in flight; 0: this machine's
  // (std::thread::hardware_concurrency()).
  int cpu_cores = 0;
};

// The CUDA backend's attention state for a compute dtype: bf16 (with a head dim cuDNN
// takes) runs the fused path, whose state is the log-sum-exp [B, NH, T] in f32; f32 runs
// the plain path, which keeps the probabilities [B, NH, T, T rounded up to 8] in f32.
size_t gpu_attention_state_bytes(int B, int T, int NH, int NKV, int HD, DType dtype);
// The plain path's state for any dtype (TRIDENT_ATTENTION=plain).
size_t gpu_plain_attention_state_bytes(int B, int T, int NH, int NKV, int HD, DType dtype);
// The same path's scratch, one per rank (the CUDA backend's attention_workspace_bytes
// without cuDNN's own plan workspace, which reserved_gib covers): fused, the softmax sum
// B*NH*T*4 and the bf16 dq, dk, dv B*T*(NH + 2*NKV)*HD*2; plain, q, k, v copies, the f32
// scores, the probabilities and the f32 dq staging.
double gpu_attention_workspace_bytes(int B, int T, int NH, int NKV, int HD, DType dtype,
                                     bool plain = false);

// Under context parallelism (parallel.cp > 1) the CUDA backend's block attention
// (Ops::attention_block_*, ring attention's kernels) instead: grow-only scratch for the
// largest block's P and dS in backward, 2 * B * NH * (2 c^2) * 4 bytes for chunks of c
// positions (parallel/context_parallel.h) and NH heads per tp rank.
double gpu_ring_attention_workspace_bytes(int B, int chunk, int NH);

// One rank's memory by kind (the PlanMemory mapping of estimate_rank_memory).
PlanMemory plan_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                            const PlanOptions& options);

// What one candidate costs.
// A group's ring collectives by kind (indexed like LinkSpec::share: all-reduce,
// reduce-scatter, all-gather), seconds per step: the bytes term (the kind's bus bytes over
// its bandwidth on the group's link) and the latency term (its calls x the per-call
// latency). What calibration fits each kind's bandwidth from (plan/calibrate.h).
struct CollectiveTerms {
  std::array<double, kRingKinds> bytes_s{}, latency_s{};
  double of(size_t kind) const { return bytes_s[kind] + latency_s[kind]; }  // one kind's seconds
  double bytes() const { return bytes_s[0] + bytes_s[1] + bytes_s[2]; }
  double latency() const { return latency_s[0] + latency_s[1] + latency_s[2]; }
  double total() const { return bytes() + latency(); }
  // Both terms of every kind times f (per micro-batch to per step, and back).
  CollectiveTerms scaled(double f) const {
    CollectiveTerms t = *this;
    for (size_t k = 0; k < kRingKinds; ++k) {
      t.bytes_s[k] *= f;
      t.latency_s[k] *= f;
    }
    return t;
  }
};

struct PlanResult {
  PlanCandidate candidate;
  bool fits = false;
  PlanMemory memory;           // the most loaded rank (largest total)
  int peak_stage = 0;          // its pipeline stage
  double capacity = 0;         // bytes one rank may hold
  // Bytes per step of each dimension's group, on the stage that moves the most in it (dp
  // includes the tied-embedding all-reduce).
  PerDim<double> comm;
  PerDim<bool> crosses_nodes;  // a group of the dimension spans more than one node
  double bubble = 0;           // (p-1)/(m+p-1)
  int micro_batches = 0;       // per dp rank per step
  // Seconds per step by part; step_time_s is their sum. compute_s leaves out the
  // recomputed forward work (recompute_s); dp_s is the exposed dp communication (the
  // compute thread's waits), of dp_comm_s in all; dp_slowdown_s the compute lost to dp
  // collectives running beside it on the same cores (CPU ranks with overlap; 0 on a GPU).
  double compute_s = 0, recompute_s = 0, bubble_s = 0, tp_s = 0, pp_s = 0, dp_s = 0;
  double dp_slowdown_s = 0;
  // Of tp_s and dp_s: the ranks' arrival skew at the group's blocking collectives, the
  // least waiting rank's (Hardware::arrival_skew; 0 unless the hardware table states one).
  double tp_skew_s = 0, dp_skew_s = 0;
  // The cp ring's exposed seconds (parallel.cp > 1): what its exchanges take beyond the
  // block attention they overlap (RingAttention::kOverlapsCompute), of cp_comm_s in all
  // (all of it when the ring is blocking: cp_ring_overlapped false).
  double cp_s = 0, cp_comm_s = 0;
  bool cp_ring_overlapped = true;  // PlanOptions::ring_overlap
  // The ep all-to-all's seconds (parallel.ep > 1), all exposed (the trainer's exchanges
  // block between the router and the experts).
  double ep_s = 0;
  // The experts' reduction over the dp / ep ranks holding them, bytes per step (its
  // exposed seconds are in dp_s, its whole time in dp_comm_s).
  double expert_dp_comm = 0;
  double optimizer_s = 0, dp_comm_s = 0;
  // tp_s and dp_comm_s by collective kind, on the same stages: the slowest stage's tp
  // (sum: tp_s), and the dp group's with the tied embedding's all-reduce (sum: dp_comm_s
  // less the experts' reduction, expert_dp_comm).
  CollectiveTerms tp_terms, dp_terms;
  // Per pipeline stage, the seconds per step its ranks wait in pipeline transfers: the
  // fill and drain (bubble_s), the slowest stage's surplus over this one on each
  // micro-batch, and its own transfers. The slowest stage's is bubble_s + pp_s; a stage
  // lighter than the slowest (the first, without the head and loss) waits longer. What a
  // stage's metrics file measures as its exposed pp time (comm_exposed_ms.pp).
  std::vector<double> stage_pp_wait_s;
  // The config's overlap switches the dp time assumed (parallel.overlap_grad_reduce,
  // parallel.overlap_param_gather; plan keeps them as configured).
  bool overlap_grad_reduce = true, overlap_param_gather = true;
  double step_time_s = 0, tokens_per_s_per_gpu = 0, mfu = 0;
  std::string reason;          // why it is recommended, or why it loses
};

// The config with `layout` in its parallel section and training.recompute (stage_layers
// kept when pp is unchanged, else balanced).
Config apply_layout(const Config& base, const PlanCandidate& layout);
// The layout a config describes.
PlanCandidate config_layout(const Config& config);

// Every layout of dp * cp * tp * pp == devices that validate_config accepts for base's
// model and batch: tp and pp over the divisors, cp over plan_cp_degrees, micro_batch_size over the divisors of
// global_batch_size / dp, virtual stages 1 and (pp > 1) the divisors of n_layers / pp up
// to kMaxVirtualStages, zero stages 0-3 (only 0 when dp * cp == 1: the others equal it),
// recompute none/selective/full, sequence parallelism off and (tp > 1) on, ep over
// plan_ep_degrees.
std::vector<PlanCandidate> enumerate_layouts(const Config& base, int devices);
// The cp degrees plan tries on `devices` ranks: 1, and each divisor cp > 1 with
// model.seq_len divisible by 2 cp and seq_len / cp >= kMinCpTokensPerRank (none for a
// mixture of experts, which validate_config refuses under cp).
std::vector<int> plan_cp_degrees(const Config& base, int devices);
// The ep degrees plan tries with `dp` data-parallel ranks: 1, and for a mixture of experts
// each divisor of dp that divides model.moe_experts (each ep rank holds moe_experts / ep).
std::vector<int> plan_ep_degrees(const Config& base, int dp);

// Memory, traffic and time of one layout (`config` has it applied and is valid). Leaves
// reason empty (make_plan ranks).
PlanResult evaluate_layout(const Config& config, const PlanOptions& options);

// CPU ranks: the share of its speed a rank's compute keeps while its communication thread
// runs a collective, from the threads' shares of the cores alone (a table's
// overlap_compute_rate aside; plan.cpp cpu_compute_rate_in_flight). 1 on a GPU and where a
// core is spare. The least compute rate calibration fits (plan/calibrate.h).
double cpu_thread_share_in_flight(const Config& config, const PlanOptions& options);

struct Plan {
  int devices = 0, gpus_per_node = 0;
  std::string gpu;
  PlanResult configured;
  std::string configured_note;      // how the config's layout was put on N devices, or ""
  // The config has parallel.dp: auto (set by the caller: make_plan sees the resolved dp),
  // so its layout follows the devices it is launched on.
  bool dp_auto = false;
  // Why the config's layout cannot be put on N devices (tp * pp does not divide N, or
  // the batch does not split over the resulting dp), naming the keys; then `configured`
  // is not evaluated (JSON null) and the command exits 2 after the table.
  std::string configured_error;
  std::vector<PlanResult> layouts;  // ranked: fitting by tokens/s, then the rest by memory
  int recommended = -1;             // index into layouts; -1 when nothing fits
  // The config's overlap switches, which every layout's dp time assumes.
  bool overlap_grad_reduce = true, overlap_param_gather = true;
  bool cp_ring_overlapped = true;  // PlanOptions::ring_overlap, which every cp time assumes
  // PlanOptions::selective_reruns, which every selective layout's recompute time assumes.
  SelectiveReruns selective_reruns = SelectiveReruns::kAttentionCore;
  bool configured_only = false;  // PlanOptions::configured_only: `layouts` is empty
  // The model: all its parameters, those a token runs through (fewer with experts), and
  // the FLOPs per token MFU counts (of the active parameters).
  int64_t parameters = 0, active_parameters = 0;
  double flops_per_token = 0;
};

// The plan of `config` (valid) on options.devices. Errors (exit 2): devices < 1,
// gpus_per_node < 1. The config's layout on N devices: as written when dp * tp * pp ==
// N, else with dp = N / (tp * pp) (configured_note), else configured_error.
Result<Plan> make_plan(const Config& config, const PlanOptions& options);

// Output (plan/plan_output.cpp). The fixed-width table: the first `rows` layouts, the
// configured one, the recommendation.
std::string plan_table(const Plan& plan, int rows);
// docs/PLAN.md's "JSON" object: {devices, gpu, gpus_per_node, configured, recommended,
// layouts}.
nlohmann::json plan_json(const Plan& plan);
nlohmann::json layout_json(const PlanResult& l);

// When the configured layout does not fit: "the configured layout (parallel.dp=4,
// parallel.tp=8, ...) does not fit on h100: ..." naming the keys, the figures and the
// biggest kind; configured_error when it could not be placed; "" when it fits.
std::string configured_misfit(const Plan& plan);

}  // namespace trident
