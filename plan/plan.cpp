// The plan: enumeration, evaluation with the shared formulas, ranking, output.
#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <thread>
#include <tuple>

#include "comm/communicator.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "plan/overlap.h"
#include "plan/partition.h"
#include "plan/traffic_model.h"

namespace trident {
namespace {

constexpr double kGiB = 1073741824.0;

bool gpu_attention_fused(int T, int HD, DType dtype);  // below

// The divisors of n >= 1 in ascending order, in O(sqrt n): the counter is 64-bit, so
// n up to 2^31 - 1 neither overflows nor takes billions of steps.
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(static_cast<int>(d));
    if (d * d != n) high.push_back(static_cast<int>(n / d));
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}
// GiB; below 0.1 GiB in MiB or KiB, so that a small (CPU) model's misfit shows its figures.
std::string gib(double bytes) {
  if (bytes == 0 || bytes >= 0.1 * kGiB) return fmt("%.1f GiB", bytes / kGiB);
  return bytes >= 1024.0 * 1024 ? fmt("%.1f MiB", bytes / (1024.0 * 1024)) : fmt("%.1f KiB", bytes / 1024.0);
}

// A ring collective of `payload` bytes over `link` with `ranks` members, in `calls` calls,
// added to `terms` (its bytes term at the kind's bandwidth, its latency term); returns
// its seconds.
double add_collective(CollectiveKind kind, double payload, int ranks, const LinkSpec& link,
                      double calls, CollectiveTerms* terms) {
  if (ranks <= 1 || payload <= 0) return 0;
  const size_t k = static_cast<size_t>(kind);
  const double bytes_s = payload * bus_factor(kind, ranks) / link.kind_bytes_per_s(kind);
  const double latency_s = calls * link.latency_s;
  terms->bytes_s[k] += bytes_s;
  terms->latency_s[k] += latency_s;
  return bytes_s + latency_s;
}

// Seconds of each collective kind of a group's traffic, with each kind's count of calls
// (dp: dp_collective_calls), or a total shared out equally over the kinds present (tp,
// whose all-gathers and reduce-scatters come in pairs); `terms` splits each into its
// bytes and latency terms.
struct KindSeconds {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  CollectiveTerms terms;
  double total() const { return all_reduce + reduce_scatter + all_gather; }
};
// With each kind's own count of calls.
KindSeconds kind_s(const GroupTraffic& g, int ranks, const LinkSpec& link, const DpCalls& calls) {
  KindSeconds k;
  k.all_reduce = add_collective(CollectiveKind::kAllReduce, g.all_reduce, ranks, link, calls.all_reduce, &k.terms);
  k.reduce_scatter = add_collective(CollectiveKind::kReduceScatter, g.reduce_scatter, ranks, link,
                                    calls.reduce_scatter, &k.terms);
  k.all_gather = add_collective(CollectiveKind::kAllGather, g.all_gather, ranks, link, calls.all_gather, &k.terms);
  return k;
}
KindSeconds kind_s(const GroupTraffic& g, int ranks, const LinkSpec& link, double calls) {
  const int kinds = (g.all_reduce > 0) + (g.reduce_scatter > 0) + (g.all_gather > 0);
  const double per_kind = kinds > 0 ? calls / kinds : 0;
  return kind_s(g, ranks, link, DpCalls{per_kind, per_kind, per_kind});
}

struct StageTime {
  double compute = 0, recompute = 0, tp = 0, pp = 0;  // seconds per micro-batch (compute
                                                     // includes recompute)
  double cp = 0;  // the cp ring's exposed seconds per micro-batch (cp_ring_seconds)
  double ep = 0;  // the ep all-to-all's exposed seconds per micro-batch (ep_all_to_all_seconds)
  double cp_comm = 0;  // and its whole time (nothing hidden)
  double dp = 0, dp_comm = 0, optimizer = 0;          // seconds per step (dp: exposed)
  // Seconds per step the compute lost to dp collectives beside it on shared cores (CPU
  // ranks; the rest of the exposed dp time, dp, is the compute thread's waits).
  double dp_slowdown = 0;
  // Of tp (per micro-batch) and dp (per step): the ranks' arrival skew where they wait for
  // the group's collectives (arrival_skew_seconds; 0 unless the table states one).
  double tp_skew = 0, dp_skew = 0;
  CollectiveTerms tp_terms;  // per micro-batch, of tp
  CollectiveTerms dp_terms;  // per step, of dp_comm (the experts' reduction excepted)
  RankTraffic traffic;
};

// The link each dimension's groups run over: a group crosses nodes when the ranks it
// spans in the rank order (comm/parallel_layout.h) are more than a node holds.
struct Links {
  PerDim<const LinkSpec*> link;
  PerDim<bool> cross;
  // What a group's collectives reach on its link: `link` itself inside a node; across
  // nodes the network bandwidth times the group's members per node (rails), at most the
  // NVLink figure (below).
  PerDim<LinkSpec> spec;
  // Expert parallelism: the ep groups and the expert-data-parallel groups (dp / ep ranks
  // holding the same experts) are the expert generator's (comm/parallel_layout.h): ep
  // inside dp, so the index kEp above is the ep group's and these are expert_dp's.
  const LinkSpec* expert_dp_link = nullptr;
  bool expert_dp_cross = false;
  LinkSpec expert_dp_spec;
  int ep_per_node = 1;  // an ep group's members in one node
};

// The link of dimension d's groups in `ranks` (see Links).
void group_link(const RankGenerator& ranks, ParallelDim d, const PlanOptions& o, bool* cross,
                const LinkSpec** link, LinkSpec* spec) {
  *cross = ranks.span(d) > o.gpus_per_node;
  *link = *cross ? &o.hardware.inter_node : &o.hardware.intra_node;
  *spec = **link;
  if (!*cross) return;
  // A group with r members in each node (stride s < gpus per node: r = gpus per node /
  // s) runs NCCL's rings on r rails at once: each member's own NIC carries the ring
  // that leaves the node through it, 1/r of the data, and NVLink the hops inside the
  // node. Its bus bandwidth is r NICs' (DGX A100 / H100: 8 x 25 / 8 x 50 GB/s for a
  // dp group of 8 per node), bounded by NVLink's; with one member per node (tp 8
  // inside the node) it is one NIC's. (pp's sends are one GPU's to one GPU, over one
  // NIC: stage_time uses `link` for them.)
  const int rails = std::max(1, std::min(ranks.degree(d), o.gpus_per_node / ranks.stride(d)));
  const LinkSpec& nvlink = o.hardware.intra_node;
  spec->bytes_per_s = std::min(spec->bytes_per_s * rails,
                               nvlink.bytes_per_s * nvlink.efficiency / spec->efficiency);
}

Links links_for(const PlanCandidate& l, const PlanOptions& o) {
  const RankGenerator ranks(world_generator_layout(l));  // ep folds into dp: no stride
  Links k;
  for (const DimensionInfo& d : kDimensions) {
    group_link(ranks, d.dim, o, &k.cross[d.dim], &k.link[d.dim], &k.spec[d.dim]);
  }
  const RankGenerator experts(expert_generator_layout(l));
  group_link(experts, ParallelDim::kEp, o, &k.cross[ParallelDim::kEp], &k.link[ParallelDim::kEp],
             &k.spec[ParallelDim::kEp]);
  group_link(experts, ParallelDim::kDp, o, &k.expert_dp_cross, &k.expert_dp_link, &k.expert_dp_spec);
  k.ep_per_node = std::max(1, std::min(l.ep, o.gpus_per_node / experts.stride(ParallelDim::kEp)));
  return k;
}

// One group's compute on the stage, seconds per micro-batch.
struct GroupWork {
  double floats = 0;              // its parameters (ParamGroup::num_floats)
  double forward = 0, backward = 0;  // backward includes the recomputed forward
};

// The exposed dp seconds of one step on the stage (plan/overlap.h): the stage's groups in
// the order the trainer runs them, forward in id order and backward in reverse, per
// micro-batch, with the collectives of its ZeRO stage and overlap switches. `k`: each
// collective kind's seconds per step (the all-exposed figure), shared out over its
// collectives by their groups' floats. `tp_busy`: the tp collectives use the dp link (their time hides
// nothing). ZeRO-0/1 communicate in the last micro-batch only, so one is simulated;
// ZeRO-2/3 every micro-batch: up to 4 are, and the rest extrapolated from the last one's
// increment (every micro-batch after the first is the same). Returns the compute
// thread's waits; `*slowdown` gets the compute lost to collectives in flight (CPU ranks),
// `*segments` the step's compute between the waits (arrival_skew_seconds).
double exposed_dp(const Config& config, const std::vector<GroupWork>& groups, double head_extra,
                  const KindSeconds& k, double tp_per_compute, bool tp_busy,
                  double compute_rate_in_flight, double comm_rate_in_compute, double* slowdown,
                  WaitSegments* segments) {
  const ParallelConfig& par = config.parallel;
  const int zero = par.zero_stage;
  const int m = config.grad_accum_steps();
  OverlapPolicy policy;
  policy.prefetch = zero == 3 && par.overlap_param_gather;
  policy.async_reduce = par.overlap_grad_reduce;
  policy.queue_depth = zero >= 1 ? kReduceQueueDepth : 0;  // ZeRO-0 all-reduces in place
  policy.compute_rate_in_flight = compute_rate_in_flight;
  policy.comm_rate_in_compute = comm_rate_in_compute;
  policy.reduce_at_end = zero <= 1;  // without overlap, in reduce_gradients
  const bool every_micro = zero >= 2;
  // The bytes each collective kind moves per step, in floats: the reductions' and
  // ZeRO-3's gathers' (head_extra: a tied one-stage head's second use of group 0).
  double floats = 0;
  for (const GroupWork& g : groups) floats += g.floats;
  floats += head_extra;
  const double reduce_s =
      (zero == 0 ? k.all_reduce : k.reduce_scatter) / (floats * (every_micro ? m : 1));
  const double gather_s = zero == 3 ? k.all_gather / (2 * floats * m) : 0;  // fwd and bwd
  const double bucket_floats = dp_bucket_floats(par);
  auto op = [&](const GroupWork& g, double extra, bool backward, bool reduces) {
    OverlapOp o;
    const double compute = backward ? g.backward : g.forward;
    const double tp = compute * tp_per_compute;
    o.compute = compute + (tp_busy ? 0 : tp);
    o.busy = tp_busy ? tp : 0;
    o.gather = (g.floats + extra) * gather_s;
    if (backward && reduces) {
      o.reduce = (g.floats + extra) * reduce_s;
      // ZeRO-0/1: the group's buckets (at most kMaxPieces: past a few the queue's waits
      // make the rest behave alike, and the simulation stays small); ZeRO-2/3: one
      // reduce-scatter per group.
      constexpr double kMaxPieces = 256;
      const double buckets = std::min(kMaxPieces, std::ceil(g.floats / bucket_floats));
      o.pieces = zero <= 1 ? static_cast<int>(buckets) : 1;
    }
    return o;
  };
  auto simulate = [&](int micro, double* lost, WaitSegments* seg) {
    std::vector<OverlapOp> ops;
    for (int i = 0; i < micro; ++i) {
      const bool reduces = every_micro || i == micro - 1;
      for (size_t g = 0; g < groups.size(); ++g) {
        ops.push_back(op(groups[g], g + 1 == groups.size() ? head_extra : 0, false, false));
      }
      for (size_t g = groups.size(); g-- > 0;) {
        ops.push_back(op(groups[g], g + 1 == groups.size() ? head_extra : 0, true, reduces));
      }
    }
    if (!every_micro) {  // the m - 1 micro-batches before the one simulated: no waits
      for (const OverlapOp& o : ops) seg->open += (m - 1) * o.compute;
    }
    return exposed_dp_seconds(ops, policy, lost, seg);
  };
  // The waits: the whole exposed time less the compute's slowdown, both returned apart.
  auto split = [&](double e, double lost) {
    *slowdown = std::min(e, lost);
    return e - *slowdown;
  };
  double lost = 0;
  if (!every_micro) {
    const double e = simulate(1, &lost, segments);
    return split(e, lost);
  }
  const int n = std::min(m, 4);
  WaitSegments seg;
  const double e = simulate(n, &lost, &seg);
  if (m == n) {
    *segments = seg;
    return split(e, lost);
  }
  double lost_before = 0;
  WaitSegments seg_before;
  const double before = simulate(n - 1, &lost_before, &seg_before);
  // Each micro-batch after the first adds the same segments: the last one's increment.
  segments->sum = seg.sum + (m - n) * std::max(0.0, seg.sum - seg_before.sum);
  segments->squares = seg.squares + (m - n) * std::max(0.0, seg.squares - seg_before.squares);
  return split(e + (m - n) * std::max(0.0, e - before),
               lost + (m - n) * std::max(0.0, lost - lost_before));
}

// The cp ring's exposed seconds per micro-batch on the stage. A hop (each rank sends one
// block and receives one, both directions at once) takes its bytes (cp_ring_hop_bytes) over
// the cp group's link plus one latency. RingAttention overlaps (kOverlapsCompute;
// parallel/context_parallel.h "Communication"), so per layer only what outlasts the block
// attention it hides behind is exposed (f: one block's forward attention, cp steps of
// equal work; b = kBackwardPerForward f):
//   forward (twice under full recomputation): cp-1 k/v hops, each behind a block,
//     (cp-1) max(0, kv - f); the last block computes with nothing in flight;
//   backward: step 0 hides the next k/v, steps 1..cp-2 the next k/v and the previous
//     step's dK/dV (one after the other on the communication stream/thread), step cp-1
//     the last dK/dV; the final dK/dV hop home hides behind nothing:
//     max(0, kv - b) + (cp-2) max(0, kv + dkv - b) + max(0, dkv - b) + dkv.
// With no attention to hide behind this is the whole ring's time. `rate`: the share of
// its speed a block's compute keeps while an exchange is in flight (a CPU rank's
// communication thread polls beside it: cpu_compute_rate_in_flight; a GPU: 1): a step
// then takes max(comm, compute + (1 - rate) comm), of which compute counts as compute.
double cp_ring_seconds(const Config& config, double layers, double block_attention_s,
                       double rate, const LinkSpec& link) {
  const int cp = config.parallel.cp;
  if (cp <= 1 || layers <= 0) return 0;
  static_assert(RingAttention::kOverlapsCompute, "the ring is blocking: count all of it");
  const CpRingHop hop = cp_ring_hop_bytes(config);
  const double bw = link.bytes_per_s * link.efficiency;
  const double kv = hop.kv / bw + link.latency_s, dkv = hop.dkv / bw + link.latency_s;
  const double f = block_attention_s, b = kBackwardPerForward * f;
  auto over = [rate](double comm, double compute) {
    return std::max(comm - compute, (1 - rate) * comm);
  };
  const double forward = (cp - 1) * over(kv, f);
  const double backward = over(kv, b) + (cp - 2) * over(kv + dkv, b) + over(dkv, b) + dkv;
  return layers * (forward_passes(config.training.recompute) * forward + backward);
}

// The ep all-to-all's seconds per micro-batch on the stage: of the bytes a rank sends
// (analytic_traffic's ep, balanced routing) 1/ep goes to each member of its group; those
// in its node over NVLink, the others through its own NIC, both at once; plus one latency
// per call (3 per forward, 2 in backward, per MoE layer). All exposed: the trainer's
// exchanges block between the router and the experts (model/transformer.cpp moe_forward,
// moe_backward), with no compute to hide them behind.
double ep_all_to_all_seconds(const Config& config, const GroupTraffic& ep, double moe_layers,
                             const Links& links, const PlanOptions& o) {
  const int e = config.parallel.ep;
  if (e <= 1 || ep.all_to_all <= 0) return 0;
  const double bytes = ep.all_to_all / config.grad_accum_steps();
  const double r = links.ep_per_node;
  const LinkSpec& nvlink = o.hardware.intra_node;
  const LinkSpec& nic = o.hardware.inter_node;
  const double inside = bytes * (r - 1) / e / (nvlink.bytes_per_s * nvlink.efficiency);
  const double outside = bytes * (e - r) / e / (nic.bytes_per_s * nic.efficiency);
  return std::max(inside, outside) + moe_layers * ep_all_to_all_calls_per_layer(config) *
                                         links.link[ParallelDim::kEp]->latency_s;
}

// Expert parallelism: the experts' engine's exposed seconds per step (added to dp's): its
// collectives (analytic_traffic's expert_dp) over the dp / ep ranks holding the same
// experts, on their link, simulated like dp's (exposed_dp) over the expert groups, each
// reduced after its layer's backward; ZeRO-1/2's all-gather after the update exposed.
// Adds the collectives' whole time to *comm.
double expert_dp_seconds(const Config& config, const ParamLayout& layout, const GroupTraffic& e,
                         const Links& links, const PlanOptions& o, double layer_forward,
                         double layer_recompute, double* comm, double* slowdown);

// CPU ranks: the cores of this machine, the ranks on it and their compute threads.
struct CpuThreads {
  double cores = 1, ranks = 1, threads = 1;  // threads: the compute threads of all ranks
};
CpuThreads cpu_threads(const Config& config, const PlanOptions& o) {
  const double cores =
      o.cpu_cores > 0 ? o.cpu_cores : std::max(1u, std::thread::hardware_concurrency());
  const int ranks = std::max(1, std::min(o.devices, o.gpus_per_node));
  const double threads =
      ranks * (config.runtime.threads > 0 ? config.runtime.threads
                                          : std::max(1, static_cast<int>(cores) / ranks));
  return {cores, static_cast<double>(ranks), threads};
}

// CPU ranks: the share of its speed a rank's compute keeps while its communication
// thread runs a collective (comm/communicator.h "Progress (MPI)": a blocking MPI call that
// polls shared memory, one more thread per rank). The ranks on this machine run
// runtime.threads compute threads each (0: cores / ranks, kernels/backend.cpp); with one
// communication thread per rank on top, each thread gets min(1, cores / threads) of a
// core. 2 ranks of 1 thread on 2 cores: 0.5. Where the threads outnumber the cores, a
// calibrated table's overlap_compute_rate replaces that share (what a run with overlap on
// measured). A GPU: 1.
double cpu_compute_rate_in_flight(const Config& config, const PlanOptions& o) {
  if (!o.hardware.is_cpu) return 1.0;
  const CpuThreads c = cpu_threads(config, o);
  const double share =
      std::min(1.0, c.cores / (c.threads + c.ranks)) / std::min(1.0, c.cores / c.threads);
  return share < 1 && o.hardware.overlap_compute_rate > 0 ? o.hardware.overlap_compute_rate : share;
}

// CPU ranks: the share of its speed a collective keeps while the rank computes beside it.
// Alone (the compute thread waiting for it) the ranks' communication threads get
// min(1, cores / ranks) of a core each; beside the compute threads every thread gets
// min(1, cores / (threads + ranks)). 2 ranks of 1 thread on 2 cores: 0.5. Where the
// threads outnumber the cores, a calibrated table's overlap_comm_rate replaces that share:
// a communication thread that yields its core while it waits for its peer (Open MPI's
// mpi_yield_when_idle, set in comm/mpi/mpi_communicator.cpp) gets far less than a fair
// share beside busy compute threads (docs/PERFORMANCE.md). A GPU: 1.
double cpu_comm_rate_in_compute(const Config& config, const PlanOptions& o) {
  if (!o.hardware.is_cpu) return 1.0;
  const CpuThreads c = cpu_threads(config, o);
  const double share =
      std::min(1.0, c.cores / (c.threads + c.ranks)) / std::min(1.0, c.cores / c.ranks);
  return share < 1 && o.hardware.overlap_comm_rate > 0 ? o.hardware.overlap_comm_rate : share;
}

// The seconds per step a group's least waiting rank waits for the others where it waits
// for the group's collectives (Hardware::arrival_skew): skew x (sum of d_i - sqrt(sum of
// d_i^2)) over the segments d_i of compute between those waits (tp: every collective;
// dp: where the compute thread waits, exposed_dp's segments). For two ranks whose
// segment times differ by D_i, the one rank waits the D_i > 0, the other the D_i < 0, and
// the lesser of the two totals is (sum |D_i| - |sum D_i|) / 2; with independent normal
// D_i of spread proportional to d_i, its mean is proportional to sum d_i - sqrt(sum
// d_i^2). One segment (a step's compute, then the collectives) costs the last rank to
// arrive nothing; n equal ones cost (1 - 1/sqrt(n)) of the compute.
double arrival_skew_seconds(const WaitSegments& s, double skew) {
  return skew * std::max(0.0, s.sum - std::sqrt(s.squares));
}

StageTime stage_time(const Config& config, const ModelPartition& part, const ParamLayout& layout,
                     const PlanMemory& memory, const PlanOptions& o, const Links& links) {
  const Hardware& hw = o.hardware;
  const bool cpu = hw.is_cpu;
  const bool fp32 = config.training.precision == Precision::kFp32;
  const double peak = hw.peak_flops * (fp32 && !cpu ? 0.5 : 1.0);  // GPU fp32: TF32
  const double gemm_rate = peak * hw.gemm_efficiency;
  double attention_rate = peak * hw.attention_efficiency;
  const double mem_rate = hw.memory_bandwidth * hw.memory_efficiency;
  // The local FLOPs and elementwise bytes of one micro-batch on the stage: the model
  // description's (model/model_description.h describe_flops).
  StageFlops w =
      describe_flops(config.model, part, config.parallel.micro_batch_size,
                     fp32 ? DType::kF32 : DType::kBF16, config.parallel.sequence_parallel);
  // Context parallelism: a rank computes 1/cp of every micro-batch (N/cp tokens; with the
  // causal load balance, 1/cp of the attention pairs too).
  const double cp_share = 1.0 / config.parallel.cp;
  // A GPU attention core on the plain path (f32, a head dim cuDNN does not take, or
  // TRIDENT_ATTENTION=plain; kernels/cuda/attention_plain.cpp): two GEMMs over the whole
  // T x T scores (the causal mask applied after, so twice the causal FLOPs) at the GEMM
  // rate, and the scores through memory: written in f32, read by the softmax, which writes
  // the probabilities in the io dtype, read by the second GEMM (8 + 2 x io bytes per score
  // in the forward; backward twice it, as for all forward work). The fused path's flash
  // attention keeps none of it. (Megatron-LM's pre-flash runs had the same passes: fp16
  // scores, a fused scale-mask-softmax, dropout on the probabilities.)
  double core_bytes = 0;
  const TransformerConfig& mc = config.model;
  if (!cpu && w.layers > 0 &&
      (o.plain_attention ||
       !gpu_attention_fused(mc.seq_len, mc.head_dim, fp32 ? DType::kF32 : DType::kBF16))) {
    const double T = mc.seq_len;
    const double scores = static_cast<double>(config.parallel.micro_batch_size) *
                          (mc.n_heads / part.tp_size) * T * (std::ceil(T / 8.0) * 8.0);
    core_bytes = scores * (8.0 + 2.0 * (fp32 ? 4.0 : 2.0));
    w.layer.attention_flops *= 2;
    w.layer.elementwise_bytes += core_bytes;
    attention_rate = gemm_rate;
  }
  auto seconds = [&](const Work& work) {
    return cp_share * (work.gemm_flops / gemm_rate + work.attention_flops / attention_rate +
                       work.elementwise_bytes / mem_rate);
  };
  const double forward = seconds(w.forward());
  // Backward reruns what recomputation dropped, per layer (nothing without).
  // (Selective reruns the attention core, its passes over the scores included; under cp
  // it reruns nothing: ring attention keeps its state per layer.)
  const bool ring_keeps_state =
      config.parallel.cp > 1 && config.training.recompute == Recompute::kSelective;
  // (torchtitan's op-level policy saves the core: its rerun elementwise passes, the
  // layer's, leave the plain path's score passes out.)
  double core_rerun_bytes = 0;
  if (config.training.recompute == Recompute::kSelective) {
    core_rerun_bytes =
        o.selective_reruns == SelectiveReruns::kAttentionCore ? core_bytes : -core_bytes;
  }
  const double layer_recompute =
      ring_keeps_state
          ? 0.0
          : seconds(layer_reruns(config.model, part, w, config.parallel.micro_batch_size,
                                 config.training.recompute, o.selective_reruns)) +
                core_rerun_bytes / mem_rate;
  StageTime t;
  t.recompute = w.layers * layer_recompute;
  t.compute = (1 + kBackwardPerForward) * forward + t.recompute;
  t.traffic = analytic_traffic(config, part, layout);
  const double micro = config.grad_accum_steps();
  // dp: the data-parallel group's size, dp x cp (cp ranks reduce gradients together).
  const int tp = config.parallel.tp, dp = config.parallel.dp * config.parallel.cp;
  // tp: per layer the column inputs' and row outputs' collectives (the row outputs'
  // again with full recompute), the embedding's and the head's.
  const LayerCollectives block = describe_collectives(config.model);
  const double layers = w.layers;
  const double tp_calls =
      (block.column_inputs + block.row_outputs) * layers +
      (forward_passes(config.training.recompute) - 1) * block.row_outputs * layers + 2;
  const KindSeconds tp_kinds = kind_s(t.traffic.tp, tp, links.spec[ParallelDim::kTp], tp_calls * micro);
  t.tp = tp_kinds.total() / micro;
  t.tp_terms = tp_kinds.terms.scaled(1 / micro);
  if (t.traffic.pp.send > 0) {
    const double bw = links.link[ParallelDim::kPp]->bytes_per_s * links.link[ParallelDim::kPp]->efficiency;
    // One send each way per chunk boundary (the model's first and last excepted).
    const int v = config.parallel.virtual_stages;
    const double sends = 2.0 * v - (part.first_stage() ? 1 : 0) - (part.last_stage() ? 1 : 0);
    t.pp = t.traffic.pp.send / micro / bw + sends * links.link[ParallelDim::kPp]->latency_s;
  }
  t.ep = ep_all_to_all_seconds(config, t.traffic.ep, moe_local_layers(config, part), links, o);
  // One block of the ring: the rank's attention of a layer over cp equal steps.
  const double block_attention_s =
      cp_share * w.layer.attention_flops / attention_rate / config.parallel.cp;
  t.cp_comm = cp_ring_seconds(config, w.layers, 0, 1, *links.link[ParallelDim::kCp]);
  // A blocking ring (TRIDENT_RING_OVERLAP=0) hides nothing: all of it is exposed.
  t.cp = o.ring_overlap ? cp_ring_seconds(config, w.layers, block_attention_s,
                                          cpu_compute_rate_in_flight(config, o),
                                          *links.link[ParallelDim::kCp])
                        : t.cp_comm;
  // dp, all exposed: each kind's bytes and its share of one latency per bucket.
  const GroupTraffic& d = t.traffic.dp;
  const LinkSpec& dp_link = *links.link[ParallelDim::kDp];
  const LinkSpec& dp_rails = links.spec[ParallelDim::kDp];
  const KindSeconds k = kind_s(d, dp, dp_rails,
                               dp_collective_calls(config, layout, config.model.tied() &&
                                                                       part.first_stage() && part.last_stage()));
  t.dp_terms = k.terms;
  const double embedding_s = add_collective(CollectiveKind::kAllReduce, t.traffic.embedding.all_reduce,
                                            2, *links.link[ParallelDim::kPp], 1, &t.dp_terms);
  t.dp_comm = k.total() + embedding_s;
  if (dp > 1 && d.total() > 0) {
    // The stage's groups (embedding, layers, head: ParamLayout's ids) with their compute:
    // a layer's forward and backward; the embedding and head work on the head group (on
    // the embedding group when this stage has no head).
    std::vector<GroupWork> groups;
    const double layer_f = seconds(w.layer);
    const double head_f = seconds(w.head);
    // (At ep > 1 the groups after the head, L + 2 + i, are the experts': below.)
    const int n_groups = std::min(static_cast<int>(layout.groups.size()), config.model.n_layers + 2);
    for (int g = 0; g < n_groups; ++g) {
      if (layout.groups[static_cast<size_t>(g)].num_floats == 0) continue;
      GroupWork gw;
      gw.floats = static_cast<double>(layout.groups[static_cast<size_t>(g)].num_floats);
      if (g > 0 && g < n_groups - 1) {
        gw.forward = layer_f;
        gw.backward = kBackwardPerForward * layer_f + layer_recompute;
      }
      groups.push_back(gw);
    }
    GroupWork& head_group = part.last_stage() ? groups.back() : groups.front();
    head_group.forward += head_f;
    head_group.backward += kBackwardPerForward * head_f;
    // ZeRO-2/3 reduce (and ZeRO-3 gathers) a tied one-stage head's wte twice.
    const double head_extra = config.parallel.zero_stage >= 2 && config.model.tied() &&
                                      part.first_stage() && part.last_stage()
                                  ? static_cast<double>(layout.groups[0].num_floats)
                                  : 0.0;
    const bool tp_busy = tp > 1 && links.link[ParallelDim::kTp] == &dp_link;
    const double tp_per_compute = t.compute > 0 ? t.tp / t.compute : 0;
    // ZeRO-1/2's all-gather runs after the update: nothing left to hide it behind.
    const int zero = config.parallel.zero_stage;
    const double after_step = zero == 1 || zero == 2 ? k.all_gather : 0;
    WaitSegments waits;
    t.dp = exposed_dp(config, groups, head_extra, k, tp_per_compute, tp_busy,
                      cpu_compute_rate_in_flight(config, o), cpu_comm_rate_in_compute(config, o),
                      &t.dp_slowdown, &waits) +
           after_step + embedding_s;
    t.dp_skew = arrival_skew_seconds(waits, hw.arrival_skew);
    t.dp += t.dp_skew;
  } else {
    t.dp = embedding_s;
  }
  double expert_slowdown = 0;
  t.dp += expert_dp_seconds(config, layout, t.traffic.expert_dp, links, o, seconds(w.layer),
                            layer_recompute, &t.dp_comm, &expert_slowdown);
  t.dp_slowdown += expert_slowdown;
  // tp: every collective blocks, per micro-batch tp_calls of them between equal shares of
  // the compute (the step's m x tp_calls segments).
  if (tp > 1 && tp_calls > 0 && hw.arrival_skew > 0) {
    WaitSegments segments;
    segments.add(t.compute / tp_calls, micro * tp_calls);
    t.tp_skew = arrival_skew_seconds(segments, hw.arrival_skew) / micro;
    t.tp += t.tp_skew;
  }
  // AdamW over the local shard: read param (or master), grad, m, v; write them back
  // (and the bf16 compute copy); one more read of the gradients for the norm.
  const double local = memory.optimizer / (fp32 ? 8.0 : 12.0);
  t.optimizer = local * (fp32 ? 32.0 : 38.0) / mem_rate;
  return t;
}

double expert_dp_seconds(const Config& config, const ParamLayout& layout, const GroupTraffic& e,
                         const Links& links, const PlanOptions& o, double layer_forward,
                         double layer_recompute, double* comm, double* slowdown) {
  const int edp = config.parallel.dp / config.parallel.ep;
  if (edp <= 1 || e.total() <= 0) return 0;
  const KindSeconds k = kind_s(e, edp, links.expert_dp_spec,
                               dp_collective_calls(config, layout, false, /*experts=*/true));
  *comm += k.total();
  std::vector<GroupWork> groups;
  for (const ParamGroup& g : layout.groups) {
    if (!is_expert_group(config.model.n_layers, g.id) || g.num_floats == 0) continue;
    groups.push_back({static_cast<double>(g.num_floats), layer_forward,
                      kBackwardPerForward * layer_forward + layer_recompute});
  }
  const int zero = config.parallel.zero_stage;
  WaitSegments waits;  // (the experts' reduction adds no arrival skew: not modelled)
  return exposed_dp(config, groups, 0, k, 0, false, cpu_compute_rate_in_flight(config, o),
                    cpu_comm_rate_in_compute(config, o), slowdown, &waits) +
         (zero == 1 || zero == 2 ? k.all_gather : 0);
}

// describe_params per distinct stage shape (the layer range matters only by its length
// and, with leading dense layers, how many of them it holds; its experts by ep).
using LayoutKey = std::tuple<int, int, int, int, int, int>;  // tp, first, last, layers, dense, ep

std::string recompute_text(Recompute r) { return recompute_name(r); }

}  // namespace

const char* selective_reruns_name(SelectiveReruns s) {
  return s == SelectiveReruns::kTorchtitanOp ? "torchtitan-op" : "attention-core";
}

bool parse_selective_reruns(const std::string& name, SelectiveReruns* out) {
  for (SelectiveReruns s : {SelectiveReruns::kAttentionCore, SelectiveReruns::kTorchtitanOp}) {
    if (name == selective_reruns_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

Work layer_reruns(const TransformerConfig& model, const ModelPartition& part, const StageFlops& w,
                  int micro_batch_size, Recompute r, SelectiveReruns s) {
  if (r != Recompute::kSelective || s == SelectiveReruns::kAttentionCore) return w.recompute(r);
  // torchtitan's op-level policy: the block's matmuls in the order its forward runs them
  // (attention q, k, v, o; MLP gate, up, down), every second one rerun
  // (torchtitan_op_matmuls); the attention core saved; every elementwise pass rerun.
  double rerun_matrix = 0;
  for (const OpPolicyMatmul& mm : torchtitan_op_matmuls(model, part.tp_size)) {
    if (!mm.saved) rerun_matrix += mm.weight_elements;
  }
  const double tokens = static_cast<double>(micro_batch_size) * model.seq_len;
  return {2 * tokens * rerun_matrix, 0, w.layer.elementwise_bytes};
}

std::string layout_name(const PlanCandidate& l) {
  std::string s = "dp" + std::to_string(l.dp) + " tp" + std::to_string(l.tp) + " pp" +
                  std::to_string(l.pp);
  if (l.cp > 1) s += " cp" + std::to_string(l.cp);
  if (l.ep > 1) s += " ep" + std::to_string(l.ep);
  if (l.virtual_stages > 1) s += " v" + std::to_string(l.virtual_stages);
  s += " z" + std::to_string(l.zero_stage);
  if (l.sequence_parallel) s += " sp";
  s += std::string(" ") + recompute_name(l.recompute) + " mbs" + std::to_string(l.micro_batch_size);
  return s;
}

namespace {
// The CUDA backend's default choice (kernels/cuda/cuda_ops.cpp): bf16 with a head dim
// cuDNN's flash attention takes runs cuDNN; everything else runs the plain path.
bool gpu_attention_fused(int T, int HD, DType dtype) {
  return dtype == DType::kBF16 && HD % 8 == 0 && HD <= 256 && T > 1;
}

size_t attention_state_bytes(int B, int T, int NH, int HD, DType dtype, bool fused) {
  // Both states start with the backend's 64-byte tag.
  constexpr double kTag = 64;
  const double rows = static_cast<double>(B) * NH * T;
  const double ld = std::ceil(T / 8.0) * 8.0;  // plain: probabilities [B, NH, T, ld]
  const double bytes = kTag + (fused ? rows * sizeof(float) : rows * ld * dtype_size(dtype));
  return bytes >= static_cast<double>(SIZE_MAX) ? SIZE_MAX : static_cast<size_t>(bytes);
}
}  // namespace

size_t gpu_attention_state_bytes(int B, int T, int NH, int /*NKV*/, int HD, DType dtype) {
  return attention_state_bytes(B, T, NH, HD, dtype, gpu_attention_fused(T, HD, dtype));
}

size_t gpu_plain_attention_state_bytes(int B, int T, int NH, int /*NKV*/, int HD, DType dtype) {
  return attention_state_bytes(B, T, NH, HD, dtype, false);
}

double gpu_attention_workspace_bytes(int B, int T, int NH, int NKV, int HD, DType dtype,
                                     bool plain) {
  // kernels/cuda/cudnn_sdpa.cpp's and attention_plain.cpp's workspace_bytes, the path as
  // gpu_attention_state_bytes chooses it (plain: always the plain path).
  const double rows = static_cast<double>(B) * NH * T;
  const double q = rows * HD, kv = static_cast<double>(B) * NKV * T * HD;
  const bool fused = !plain && gpu_attention_fused(T, HD, dtype);
  if (fused) return rows * sizeof(float) + (q + 2 * kv) * 2;
  const double e = dtype_size(dtype);
  const double scores = rows * std::ceil(T / 8.0) * 8.0;
  return q * 2 * e + kv * 2 * e + scores * sizeof(float) + scores * e + q * 2 * sizeof(float);
}

double gpu_ring_attention_workspace_bytes(int B, int chunk, int NH) {
  // The largest block (Tq * Tk = 2 c^2: chunk c over both chunks, or both over one), and
  // backward's P and dS for it, f32.
  return 2.0 * B * NH * 2.0 * chunk * chunk * sizeof(float);
}

PlanMemory plan_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                            const PlanOptions& options) {
  const RankMemory m = estimate_rank_memory(config, part, dp_rank, options.attention_state_bytes,
                                            options.selective_reruns);
  PlanMemory p;
  p.params = m.params;
  p.grads = m.grads;
  p.optimizer = m.optimizer + m.master;
  p.activations = m.activations;
  // Plus the two f64 device accumulators RankMemory leaves out: the loss sum
  // (Ops::loss_accumulate) and the gradient norm's sum of squares.
  p.buffers = m.comm_buffers + m.scratch + 2 * sizeof(double);
  const Hardware& hw = options.hardware;
  if (!hw.is_cpu) {
    // The attention path's scratch, shared by every layer (none without one), and what
    // the process holds besides; the allocator's losses on top of the allocations.
    const TransformerConfig& c = config.model;
    const int cp = config.parallel.cp;
    const double attention =
        part.local_layers(c.n_layers) > 0 && cp > 1
            ? gpu_ring_attention_workspace_bytes(config.parallel.micro_batch_size,
                                                 c.seq_len / (2 * cp), c.n_heads / part.tp_size)
        : part.local_layers(c.n_layers) > 0
            ? gpu_attention_workspace_bytes(config.parallel.micro_batch_size, c.seq_len,
                                            c.n_heads / part.tp_size, c.n_kv_heads / part.tp_size,
                                            c.head_dim,
                                            config.training.precision == Precision::kBf16
                                                ? DType::kBF16
                                                : DType::kF32,
                                            options.plain_attention)
            : 0.0;
    p.fragmentation =
        hw.fragmentation * (p.params + p.grads + p.optimizer + p.activations + p.buffers + attention);
    p.workspace = hw.reserved_bytes + attention;
  }
  p.host = m.checkpoint + m.transient + m.tables;
  p.total = p.device() + (options.hardware.is_cpu ? p.host : 0.0);
  return p;
}

Config apply_layout(const Config& base, const PlanCandidate& l) {
  Config c = base;
  if (l.pp != base.parallel.pp || l.virtual_stages > 1) c.parallel.stage_layers.clear();
  static_cast<ParallelLayout&>(c.parallel) = l;
  c.parallel.micro_batch_size = l.micro_batch_size;
  c.training.recompute = l.recompute;
  return c;
}

PlanCandidate config_layout(const Config& config) {
  PlanCandidate l;
  static_cast<ParallelLayout&>(l) = config.parallel;
  l.recompute = config.training.recompute;
  l.micro_batch_size = config.parallel.micro_batch_size;
  return l;
}

std::vector<int> plan_ep_degrees(const Config& base, int dp) {
  std::vector<int> out;
  for (int ep : divisors(std::max(1, dp))) {
    if (ep == 1 || (base.model.moe() && base.model.moe_experts % ep == 0)) out.push_back(ep);
  }
  return out;
}

std::vector<int> plan_cp_degrees(const Config& base, int devices) {
  std::vector<int> out;
  for (int cp : divisors(std::max(1, devices))) {
    const int seq = base.model.seq_len;
    if (cp == 1 || (seq % (2 * cp) == 0 && seq / cp >= kMinCpTokensPerRank && !base.model.moe())) {
      out.push_back(cp);
    }
  }
  return out;
}

namespace {

// The (cp, pp) degrees of `devices` ranks (what tp leaves): cp from plan_cp_degrees, pp
// over the divisors of what cp leaves.
std::vector<std::pair<int, int>> cp_pp_degrees(const Config& base, int devices) {
  std::vector<std::pair<int, int>> out;
  for (int cp : plan_cp_degrees(base, devices)) {
    for (int pp : divisors(devices / cp)) out.emplace_back(cp, pp);
  }
  return out;
}

// enumerate_layouts, stopping after `limit` candidates (validate_config calls): returns
// false, out partial, when it had to stop. tp must divide model.n_heads and pp may not
// exceed model.n_layers (validate_config refuses the others), so those are skipped
// before their micro-batch sizes are tried.
bool enumerate_up_to(const Config& base, int devices, int64_t limit,
                     std::vector<PlanCandidate>* out) {
  if (devices < 1) return true;
  const int gbs = base.training.global_batch_size;
  int64_t tried = 0;
  for (int tp : divisors(devices)) {
    if (base.model.n_heads % tp != 0) continue;
    for (const auto& [cp, pp] : cp_pp_degrees(base, devices / tp)) {
      if (pp > base.model.n_layers) continue;
      const int dp = devices / tp / cp / pp;
      if (gbs % dp != 0) continue;
      for (int mbs : divisors(gbs / dp)) {
        // Interleaved 1F1B: v model chunks of equal size per stage, up to kMaxVirtualStages.
        std::vector<int> chunk_counts = {1};
        if (pp > 1 && base.model.n_layers % pp == 0) {
          for (int v = 2; v <= kMaxVirtualStages; ++v) {
            if (base.model.n_layers / pp % v == 0) chunk_counts.push_back(v);
          }
        }
        for (int v : chunk_counts) {
          for (int ep : plan_ep_degrees(base, dp)) {
            // ZeRO shards over dp x cp (the data-parallel group under cp).
            for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero) {
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                  if (++tried > limit) return false;
                  const PlanCandidate l{{.dp = dp,
                                         .tp = tp,
                                         .pp = pp,
                                         .cp = cp,
                                         .ep = ep,
                                         .virtual_stages = v,
                                         .zero_stage = zero,
                                         .sequence_parallel = sp},
                                        r,
                                        mbs};
                  if (validate_config(apply_layout(base, l)).is_ok()) out->push_back(l);
                }
              }
            }
          }
        }
      }
    }
  }
  return true;
}

}  // namespace

std::vector<PlanCandidate> enumerate_layouts(const Config& base, int devices) {
  std::vector<PlanCandidate> out;
  enumerate_up_to(base, devices, INT64_MAX, &out);
  return out;
}

namespace {

// evaluate_layout with a cache of describe_params tables shared over layouts.
PlanResult evaluate_cached(const Config& config, const PlanOptions& o,
                           std::map<LayoutKey, ParamLayout>* cache) {
  const PlanCandidate l = config_layout(config);
  PlanResult r;
  r.candidate = l;
  r.overlap_grad_reduce = config.parallel.overlap_grad_reduce;
  r.overlap_param_gather = config.parallel.overlap_param_gather;
  r.cp_ring_overlapped = o.ring_overlap;
  const Links links = links_for(l, o);
  r.crosses_nodes = links.cross;
  const int ranks_per_node = std::max(1, std::min(o.devices, o.gpus_per_node));
  r.capacity = o.hardware.is_cpu ? o.hardware.memory_bytes / ranks_per_node : o.hardware.memory_bytes;
  const int v = l.virtual_stages;
  r.micro_batches = config.grad_accum_steps();
  const int m = r.micro_batches;
  // Stage time: the slowest stage paces the pipeline; dp and the optimizer of the stage
  // spending the most on them follow the drain; memory: the fullest rank.
  StageTime slowest, slowest_tail;
  double slowest_micro = -1, slowest_step = -1;
  std::map<LayoutKey, StageTime> times;
  std::vector<double> stage_busy(static_cast<size_t>(l.pp));  // per micro-batch, less pp
  for (int s = 0; s < l.pp; ++s) {
    // The stage as one range of its layer count: with v > 1 chunks the memory plan and
    // the traffic model take the real chunks from the config (plan/partition.h); the
    // work and the parameter table depend only on the count and the first / last stage.
    const ModelPartition part = stage_partition(config, 0, s);
    const PlanMemory mem = plan_rank_memory(config, part, 0, o);
    if (s == 0 || mem.total > r.memory.total) {
      r.memory = mem;
      r.peak_stage = s;
    }
    const int stage_layers = part.layer_end - part.layer_begin;
    const LayoutKey key{l.tp, part.first_stage(), part.last_stage(), stage_layers,
                        stage_layers - static_cast<int>(moe_local_layers(config, part)), l.ep};
    auto t = times.find(key);
    if (t == times.end()) {
      auto layout = cache->find(key);
      if (layout == cache->end()) {
        layout = cache->emplace(key, describe_params(config.model, part)).first;
      }
      t = times.emplace(key, stage_time(config, part, layout->second, mem, o, links)).first;
    }
    const StageTime& st = t->second;
    stage_busy[static_cast<size_t>(s)] = st.compute + st.tp + st.cp + st.ep;
    if (st.compute + st.tp + st.pp + st.cp + st.ep > slowest_micro) {
      slowest_micro = st.compute + st.tp + st.pp + st.cp + st.ep;
      slowest = st;
    }
    if (st.dp + st.dp_slowdown + st.optimizer > slowest_step) {
      slowest_step = st.dp + st.dp_slowdown + st.optimizer;
      slowest_tail = st;
    }
    const std::pair<ParallelDim, double> moved[] = {
        {ParallelDim::kDp, st.traffic.dp.total() + st.traffic.embedding.total()},
        {ParallelDim::kTp, st.traffic.tp.total()},
        {ParallelDim::kPp, st.traffic.pp.total()},
        {ParallelDim::kCp, st.traffic.cp.total()},
        {ParallelDim::kEp, st.traffic.ep.total()}};
    for (const auto& [dim, bytes] : moved) r.comm[dim] = std::max(r.comm[dim], bytes);
    r.expert_dp_comm = std::max(r.expert_dp_comm, st.traffic.expert_dp.total());
  }
  r.fits = r.memory.total <= r.capacity;
  r.bubble = pipeline_bubble_fraction(l.pp, m, v);
  r.compute_s = m * (slowest.compute - slowest.recompute);
  r.recompute_s = m * slowest.recompute;
  r.tp_s = m * slowest.tp;
  r.tp_terms = slowest.tp_terms.scaled(m);
  r.dp_terms = slowest_tail.dp_terms;
  r.pp_s = m * slowest.pp;
  r.cp_s = m * slowest.cp;
  r.ep_s = m * slowest.ep;
  r.cp_comm_s = m * slowest.cp_comm;
  // The fill and drain: p - 1 chunk steps, each 1/v of a stage's micro-batch time.
  r.bubble_s = (l.pp - 1) * slowest_micro / v;
  // Each stage waits in its pipeline transfers for what the slowest stage paces beyond
  // its own work: the fill and drain, the slowest stage's surplus on every micro-batch,
  // and its own transfers.
  for (const double busy : stage_busy) {
    r.stage_pp_wait_s.push_back((m + static_cast<double>(l.pp - 1) / v) * slowest_micro - m * busy);
  }
  r.dp_s = slowest_tail.dp;
  r.dp_slowdown_s = slowest_tail.dp_slowdown;
  r.tp_skew_s = m * slowest.tp_skew;
  r.dp_skew_s = slowest_tail.dp_skew;
  r.dp_comm_s = slowest_tail.dp_comm;
  r.optimizer_s = slowest_tail.optimizer;
  r.step_time_s =
      r.compute_s + r.recompute_s + r.tp_s + r.pp_s + r.cp_s + r.ep_s + r.bubble_s + r.dp_s +
      r.dp_slowdown_s + r.optimizer_s;
  const double tokens = static_cast<double>(config.training.global_batch_size) * config.model.seq_len;
  r.tokens_per_s_per_gpu = tokens / r.step_time_s / o.devices;
  r.mfu = config.model.flops_per_token() * r.tokens_per_s_per_gpu / o.hardware.peak_flops;
  return r;
}

// The biggest memory kind, for "does not fit" reasons.
// Host copies count only where they share the device's memory (cpu).
std::string biggest_kind(const PlanMemory& m) {
  const bool host_counts = m.total > m.device();
  const std::pair<double, const char*> kinds[] = {
      {m.params, "parameters"}, {m.grads, "gradients"}, {m.optimizer, "optimizer state"},
      {m.activations, "activations"}, {m.buffers, "buffers"}, {m.workspace, "workspace"},
      {m.fragmentation, "fragmentation"},
      {host_counts ? m.host : 0.0, "host copies"}};
  const auto* top = std::max_element(std::begin(kinds), std::end(kinds),
                                     [](const auto& a, const auto& b) { return a.first < b.first; });
  return std::string(top->second) + " " + gib(top->first);
}

std::string misfit_text(const PlanResult& l) {
  return "does not fit: " + gib(l.memory.total) + " > " + gib(l.capacity) + " (biggest: " +
         biggest_kind(l.memory) + ")";
}

// What makes a's compute longer than best's.
std::string compute_cause(const PlanCandidate& a, const PlanCandidate& best) {
  if (!a.sequence_parallel && best.sequence_parallel) {
    return "compute: without sequence parallelism norms and residuals run on whole sequences";
  }
  if (a.tp < best.tp) return "compute: a larger share of each layer per rank";
  if (a.pp != best.pp) return "compute: the slowest pipeline stage carries more than its share";
  if (a.micro_batch_size < best.micro_batch_size) {
    return "compute: micro-batch " + std::to_string(a.micro_batch_size) + " (the head's share grows)";
  }
  return "compute";
}

// Why `l` is slower than `best`: the part of the step that grew the most.
std::string slower_text(const PlanResult& l, const PlanResult& best) {
  const double ratio = l.step_time_s / best.step_time_s;
  if (ratio < 1.0005) return "as fast (within 0.05%); ranked after by memory";
  struct Part {
    double delta;
    std::string what;
  };
  const PlanCandidate& a = l.candidate;
  std::vector<Part> parts = {
      {l.compute_s - best.compute_s, compute_cause(a, best.candidate)},
      {l.recompute_s - best.recompute_s,
       std::string("recompute ") + recompute_name(a.recompute) + " reruns forward work"},
      {l.bubble_s - best.bubble_s, "pipeline bubble " + fmt("%.1f%%", 100 * l.bubble) + " (pp " +
                                       std::to_string(a.pp) + ", " +
                                       std::to_string(l.micro_batches) + " micro-batches)"},
      {l.tp_s - best.tp_s, "tp " + std::to_string(a.tp) + " all-reduces" +
                               (l.crosses_nodes[ParallelDim::kTp] ? " cross nodes" : "")},
      {l.pp_s - best.pp_s,
       std::string("pp sends") + (l.crosses_nodes[ParallelDim::kPp] ? " across nodes" : "")},
      {l.dp_s - best.dp_s, "dp " + std::to_string(a.dp) + " exposed gradient reduction" +
                               (a.zero_stage == 3 ? " (ZeRO-3 gathers per micro-batch)" : "") +
                               (l.crosses_nodes[ParallelDim::kDp] ? " across nodes" : "")},
      {l.optimizer_s - best.optimizer_s, "optimizer step on a bigger shard"},
      {l.cp_s - best.cp_s, "cp " + std::to_string(a.cp) + " ring exchanges (the part the block attention does not hide)" +
                               (l.crosses_nodes[ParallelDim::kCp] ? " across nodes" : "")},
      {l.ep_s - best.ep_s, "ep " + std::to_string(a.ep) + " all-to-all (not overlapped)" +
                               (l.crosses_nodes[ParallelDim::kEp] ? " across nodes" : "")},
  };
  const Part* top = &parts[0];
  for (const Part& p : parts) {
    if (p.delta > top->delta) top = &p;
  }
  return fmt("%.2fx slower: ", ratio) + top->what + fmt(" +%.3g s/step", top->delta);
}

bool faster(const PlanResult& a, const PlanResult& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) {
    if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
    return a.memory.total < b.memory.total;
  }
  return a.memory.total / a.capacity < b.memory.total / b.capacity;
}

}  // namespace

PlanResult evaluate_layout(const Config& config, const PlanOptions& options) {
  std::map<LayoutKey, ParamLayout> cache;
  return evaluate_cached(config, options, &cache);
}

Result<Plan> make_plan(const Config& config, const PlanOptions& options) {
  const int n = options.devices;
  if (n < 1) return Status::invalid_input("--devices: must be >= 1, got " + std::to_string(n));
  if (options.gpus_per_node < 1) {
    return Status::invalid_input("--gpus-per-node: must be >= 1, got " +
                                 std::to_string(options.gpus_per_node));
  }
  // Each stage's parameter table (describe_params (model/model_description.h)) holds every layer's tensors:
  // bound the layer count so that the search stays small and fast.
  if (config.model.n_layers > kMaxPlanLayers) {
    return Status::invalid_config("model.n_layers: " + std::to_string(config.model.n_layers) +
                                  " layers; trident plan models at most " +
                                  std::to_string(kMaxPlanLayers));
  }
  Plan plan;
  plan.devices = n;
  plan.gpus_per_node = options.gpus_per_node;
  plan.gpu = options.hardware.name;
  plan.overlap_grad_reduce = config.parallel.overlap_grad_reduce;
  plan.overlap_param_gather = config.parallel.overlap_param_gather;
  plan.cp_ring_overlapped = options.ring_overlap;
  plan.selective_reruns = options.selective_reruns;
  plan.configured_only = options.configured_only;
  plan.parameters = config.model.num_parameters();
  plan.active_parameters = config.model.active_parameters();
  plan.flops_per_token = config.model.flops_per_token();
  // The configured layout on N devices: as written, or with dp rescaled.
  Config configured = config;
  const ParallelConfig& p = config.parallel;
  const int64_t world = p.world_size_wide();
  if (world != n) {
    const int64_t others = world / p.dp;  // the product of every degree but dp
    configured.parallel.dp = static_cast<int>(std::max<int64_t>(1, n / others));
    const Status st = validate_config(configured);
    if (n % others != 0) {
      const bool cp = p.cp > 1;  // named only when used
      plan.configured_error =
          std::string(cp ? "parallel.tp * parallel.cp * parallel.pp = "
                         : "parallel.tp * parallel.pp = ") +
          std::to_string(p.tp) + " * " + (cp ? std::to_string(p.cp) + " * " : std::string()) +
          std::to_string(p.pp) + " does not divide --devices " + std::to_string(n) +
          " (the config's layout, parallel.dp=" + std::to_string(p.dp) + ", is for " +
          std::to_string(world) + " devices)";
    } else if (!st.is_ok()) {
      plan.configured_error = "the config's layout (parallel.dp=" + std::to_string(p.dp) +
                              ", parallel.tp=" + std::to_string(p.tp) + ", parallel.pp=" +
                              std::to_string(p.pp) + ") with dp=" +
                              std::to_string(configured.parallel.dp) + " for --devices " +
                              std::to_string(n) + ": " + st.message();
    } else {
      plan.configured_note = "the config's layout is for " + std::to_string(world) +
                             (world == 1 ? " device" : " devices") + " (parallel.dp=" +
                             std::to_string(p.dp) + "); on " + std::to_string(n) +
                             " it is evaluated with dp=" + std::to_string(configured.parallel.dp);
    }
  }
  std::vector<PlanCandidate> layouts;
  if (!options.configured_only && !enumerate_up_to(config, n, kMaxPlanCandidates, &layouts)) {
    return Status::invalid_config(
        "--devices " + std::to_string(n) + " with training.global_batch_size=" +
        std::to_string(config.training.global_batch_size) + " gives more than " +
        std::to_string(kMaxPlanCandidates) +
        " layouts to try (parallel.micro_batch_size runs over every divisor of the batch per "
        "data-parallel rank); plan a batch size with fewer divisors or fewer devices");
  }
  // Evaluating a layout costs about one memory estimate per pipeline stage, and with v
  // model chunks per stage one pass over all pp * v chunks per stage.
  double work = configured.parallel.pp;
  for (const PlanCandidate& l : layouts) {
    work += static_cast<double>(l.pp) * (l.virtual_stages > 1 ? l.pp * l.virtual_stages : 1);
  }
  if (work > kMaxPlanStageWork) {
    return Status::invalid_config(
        "--devices " + std::to_string(n) + " with model.n_layers=" +
        std::to_string(config.model.n_layers) + " gives " + std::to_string(layouts.size()) +
        " layouts with up to " + std::to_string(std::min(n, config.model.n_layers)) +
        " pipeline stages each: " + fmt("%.3g", work) + " stage evaluations, more than the " +
        fmt("%.3g", kMaxPlanStageWork) + " trident plan does; plan fewer devices");
  }
  std::map<LayoutKey, ParamLayout> cache;
  if (plan.configured_error.empty()) plan.configured = evaluate_cached(configured, options, &cache);
  for (const PlanCandidate& l : layouts) {
    plan.layouts.push_back(evaluate_cached(apply_layout(config, l), options, &cache));
  }
  std::stable_sort(plan.layouts.begin(), plan.layouts.end(), faster);
  if (!plan.layouts.empty() && plan.layouts[0].fits) plan.recommended = 0;
  for (PlanResult& l : plan.layouts) {
    if (!l.fits) {
      l.reason = misfit_text(l);
    } else if (&l == &plan.layouts[0]) {
      l.reason = "recommended: the fastest layout that fits";
    } else {
      l.reason = slower_text(l, plan.layouts[0]);
    }
  }
  PlanResult& c = plan.configured;
  if (!plan.configured_error.empty()) {
    c.reason = plan.configured_error;
  } else if (!c.fits) {
    c.reason = misfit_text(c);
  } else if (plan.recommended >= 0 && plan.layouts[0].candidate == c.candidate) {
    c.reason = "recommended: the fastest layout that fits";
  } else if (plan.recommended >= 0) {
    c.reason = slower_text(c, plan.layouts[0]);
  }
  return plan;
}

std::string configured_misfit(const Plan& plan) {
  if (!plan.configured_error.empty()) return plan.configured_error;
  const PlanResult& c = plan.configured;
  if (c.fits) return "";
  const PlanCandidate& l = c.candidate;
  const PlanMemory& m = c.memory;
  std::string s = "the configured layout (parallel.dp=" + std::to_string(l.dp) +
                  ", parallel.tp=" + std::to_string(l.tp) + ", parallel.pp=" + std::to_string(l.pp) +
                  (l.cp > 1 ? ", parallel.cp=" + std::to_string(l.cp) : std::string()) +
                  (l.ep > 1 ? ", parallel.ep=" + std::to_string(l.ep) : std::string()) +
                  ", parallel.zero_stage=" + std::to_string(l.zero_stage) +
                  ", parallel.micro_batch_size=" + std::to_string(l.micro_batch_size) +
                  ", parallel.sequence_parallel=" + (l.sequence_parallel ? "true" : "false") +
                  ", training.recompute=" + recompute_text(l.recompute) + ") does not fit on " +
                  plan.gpu + ": pipeline stage " + std::to_string(c.peak_stage) + " needs " +
                  gib(m.total) + " per rank (parameters " + gib(m.params) + ", gradients " +
                  gib(m.grads) + ", optimizer " + gib(m.optimizer) + ", activations " +
                  gib(m.activations) + ", buffers " + gib(m.buffers) + ", workspace " +
                  gib(m.workspace) + ", fragmentation " + gib(m.fragmentation) + (m.host > 0 && plan.gpu == "cpu" ? ", host copies " + gib(m.host) : "") +
                  ") but a rank has " + gib(c.capacity) + "; biggest: " + biggest_kind(m);
  if (plan.recommended >= 0) s += "; plan recommends " + layout_name(plan.layouts[0].candidate);
  return s;
}

double cpu_thread_share_in_flight(const Config& config, const PlanOptions& o) {
  PlanOptions shares = o;
  shares.hardware.overlap_compute_rate = 0;
  return cpu_compute_rate_in_flight(config, shares);
}

}  // namespace trident
