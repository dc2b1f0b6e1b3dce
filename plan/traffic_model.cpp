#include "plan/traffic_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "plan/partition.h"

namespace trident {
namespace {

// A data-parallel engine's bytes per step over `ranks` ranks for `floats` of parameters
// (group0_extra: a tied one-stage head's second use of group 0), by ZeRO stage.
GroupTraffic zero_traffic(int zero_stage, double ranks, double floats, double group0_extra,
                          double micro, double kA) {
  constexpr double kF = 4.0;
  GroupTraffic t;
  switch (ranks > 1 ? zero_stage : -1) {
    case -1:  // one data-parallel rank: nothing crosses ranks
      break;
    case 0:
      t.all_reduce = floats * kF;
      break;
    case 1:
      t.reduce_scatter = floats * kF;
      t.all_gather = floats * kA;
      break;
    case 2:
      t.reduce_scatter = (floats + group0_extra) * micro * kF;
      t.all_gather = floats * kA;
      break;
    default:
      t.all_gather = (2 * floats + 2 * group0_extra) * micro * kA;
      t.reduce_scatter = (floats + group0_extra) * micro * kF;
      break;
  }
  return t;
}

}  // namespace

RankTraffic analytic_traffic(const Config& config, const ModelPartition& part,
                             const ParamLayout& layout) {
  const auto& par = config.parallel;
  // This rank's tokens of a micro-batch: its 2 chunks of every sequence under cp.
  const double N = static_cast<double>(par.micro_batch_size) * config.model.seq_len / par.cp;
  const double C = config.model.d_model;
  const double micro = config.grad_accum_steps();
  // This rank's model chunks (more than one under interleaved 1F1B): their layers, and
  // whether it holds the embedding (the model's first stage) and the head (its last).
  const std::vector<ModelPartition> chunks =
      par.virtual_stages > 1 ? rank_chunks(config, part.tp_rank, part.pp_rank)
                             : std::vector<ModelPartition>{part};
  // Per micro-batch, of N*C each, summed over this rank's layers: the row-parallel outputs
  // reduced in forward, the column-parallel inputs gathered in forward and their
  // gradients reduced in backward (the model description's blocks: 2 and 2 for gpt2 and
  // llama; 1 and 1 for a MoE layer, whose experts are replicated over tp).
  double layers = 0, col = 0, row = 0, moe_layers = 0;
  bool first = false, last = false;
  for (const ModelPartition& chunk : chunks) {
    const int end = chunk.layer_end < 0 ? config.model.n_layers : chunk.layer_end;
    layers += end - chunk.layer_begin;
    for (int l = chunk.layer_begin; l < end; ++l) {
      const LayerCollectives layer = describe_collectives(config.model, l);
      col += layer.column_inputs;
      row += layer.row_outputs;
      moe_layers += config.model.moe_layer(l) ? 1 : 0;
    }
    first = first || chunk.first_stage();
    last = last || chunk.last_stage();
  }
  constexpr double kF = 4.0;  // bytes per float: gradients and statistics are fp32
  // Bytes per element of the compute weights and activations (training.precision): the
  // TP all-reduces of activations, the pipeline boundary tensors and the parameter
  // all-gathers move these; gradient reductions stay fp32.
  const double kA = config.training.precision == Precision::kBf16 ? 2.0 : 4.0;
  RankTraffic t;

  // Token rows of the activations outside the linears on this rank: all, or this rank's
  // N/tp under sequence parallelism (the pipeline boundary too).
  const bool sp = par.sequence_parallel && par.tp > 1;
  const double rows = sp ? N / par.tp : N;
  const LayerCollectives block = describe_collectives(config.model);  // its norm floats
  if (par.tp > 1 && !sp) {
    // Forward all-reduces the row outputs, backward the column input gradients.
    double per_micro = (row + col) * N * C;
    // Full recomputation reruns each layer's forward, all-reduces included, in backward.
    const double reruns = forward_passes(config.training.recompute) - 1;
    if (reruns > 0) per_micro += reruns * row * N * C;
    if (first) per_micro += N * C;
    double xent_stats = 0;  // row max, sum of exponentials, target logit: fp32
    if (last) {
      per_micro += N * C;
      xent_stats = 3 * N;
    }
    t.tp.all_reduce = (per_micro * kA + xent_stats * kF) * micro;
  }
  if (sp) {
    // Per layer, forward: the column inputs gathered, the row outputs reduce-scattered;
    // backward: the row output gradients gathered, the column inputs gathered again (for
    // the weight gradients), the column input gradients reduce-scattered, and the
    // norm-weight gradients (fp32) all-reduced. Full recomputation adds the forward's
    // gathers and reduce-scatters.
    const double passes = forward_passes(config.training.recompute);
    // A MoE layer's block runs on all N rows: its input gathered in forward (and in a
    // rerun) and again in backward, and its output gradient gathered (no reduce-scatter:
    // each rank keeps its rows of the full output).
    double gather = N * C * (col * passes + row + col + moe_layers * (passes + 2));
    double scatter = N * C * (row * passes + col);
    double norm_grads = layers * block.norm_floats;
    double xent_stats = 0;
    if (first) {  // the embedding: reduce-scattered, its gradient gathered
      scatter += N * C;
      gather += N * C;
    }
    if (last) {  // the head input gathered, its gradient reduce-scattered
      gather += N * C;
      scatter += N * C;
      norm_grads += block.head_norm_floats;
      xent_stats = 3 * N;
    }
    t.tp.all_gather = gather * kA * micro;
    t.tp.reduce_scatter = scatter * kA * micro;
    t.tp.all_reduce = (norm_grads + xent_stats) * kF * micro;
  }
  if (par.pp > 1) {
    double per_micro = 0;
    for (const ModelPartition& chunk : chunks) {  // each chunk sends on, and back
      if (!chunk.last_stage()) per_micro += rows * C;
      if (!chunk.first_stage()) per_micro += rows * C;
    }
    t.pp.send = per_micro * micro * kA;
  }

  if (par.cp > 1) t.cp.send = cp_ring_bytes_per_layer(config) * layers * micro;

  // Expert parallelism: the routed experts' groups are reduced over expert_dp, the rest
  // over dp.
  double expert_floats = 0;
  for (const ParamGroup& g : layout.groups) {
    if (is_expert_group(config.model.n_layers, g.id)) expert_floats += static_cast<double>(g.num_floats);
  }
  const double total = static_cast<double>(layout.total_floats()) - expert_floats;
  // The data-parallel machinery's group: dp x cp (cp ranks hold the same parameters).
  const double dp = static_cast<double>(par.dp) * par.cp;
  // A tied head in a one-stage model uses group 0 (wte) a second time: ZeRO-3 gathers
  // it again, and ZeRO-2/3 reduce-scatter its gradient once for the head and once for
  // the embedding.
  double group0_extra = 0;
  if (config.model.tied() && first && last) {
    group0_extra = static_cast<double>(layout.groups[0].num_floats);
  }
  t.dp = zero_traffic(par.zero_stage, dp, total, group0_extra, micro, kA);
  if (par.ep > 1) {
    t.expert_dp = zero_traffic(par.zero_stage, static_cast<double>(par.dp) / par.ep, expert_floats,
                               0, micro, kA);
    const double moe_layers = moe_local_layers(config, part);
    // Balanced: the N*K rows of every rank of the group, spread over its ranks.
    const double received = micro * moe_layers * N * config.model.moe_top_k;
    t.ep.all_to_all = ep_all_to_all_bytes(config, moe_layers, received);
  }
  if (config.model.tied() && par.pp > 1 && (first || last)) {
    const ParamInfo* wte = layout.find("wte");
    const double floats = static_cast<double>(wte->numel());
    // The reduced gradient each rank holds: the whole wte (ZeRO 0), its owned rows (1-3).
    t.embedding.all_reduce = (par.zero_stage >= 1 ? floats / dp : floats) * kF;
  }
  return t;
}

double dp_bucket_floats(const ParallelConfig& par) {
  return std::max(1.0, std::floor(static_cast<double>(par.bucket_mb) * 1048576.0 / sizeof(float)));
}

DpCalls dp_collective_calls(const Config& config, const ParamLayout& layout, bool tied_one_stage,
                            bool experts) {
  const ParallelConfig& par = config.parallel;
  if ((experts ? par.dp / std::max(1, par.ep) : par.dp * par.cp) <= 1) return {};
  const double bucket_floats = dp_bucket_floats(par);
  double groups = 0, buckets = 0;
  for (const ParamGroup& g : layout.groups) {
    if (g.num_floats == 0 || is_expert_group(config.model.n_layers, g.id) != experts) continue;
    groups += 1;
    buckets += std::ceil(static_cast<double>(g.num_floats) / bucket_floats);
  }
  const double micro = config.grad_accum_steps();
  const bool tied = !experts && tied_one_stage && !layout.groups.empty() &&
                    layout.groups[0].num_floats > 0;
  const double used = groups + (tied ? 1 : 0);
  DpCalls c;
  switch (par.zero_stage) {
    case 0: c.all_reduce = buckets; break;
    case 1: c.reduce_scatter = c.all_gather = buckets; break;
    case 2: c.reduce_scatter = used * micro; c.all_gather = buckets; break;
    default: c.reduce_scatter = used * micro; c.all_gather = 2 * used * micro; break;
  }
  return c;
}

CpRingHop cp_ring_hop_bytes(const Config& config) {
  const auto& par = config.parallel;
  if (par.cp <= 1) return {};
  const auto& m = config.model;
  const double cp = par.cp;
  const int kv_heads = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
  const int head_dim = m.head_dim > 0 ? m.head_dim : m.d_model / m.n_heads;
  // One rank's keys (RingAttention::kv_elems): its N/cp rows, its tp share of kv heads.
  const double K = static_cast<double>(par.micro_batch_size) * m.seq_len / cp *
                   (static_cast<double>(kv_heads) / par.tp) * head_dim;
  const double kA = config.training.precision == Precision::kBf16 ? 2.0 : 4.0;
  return {2 * K * kA, 2 * K * 4.0};  // k and v; the f32 dK and dV accumulators
}

double cp_ring_bytes_per_layer(const Config& config) {
  const double cp = config.parallel.cp;
  if (cp <= 1) return 0;
  const CpRingHop hop = cp_ring_hop_bytes(config);
  const double kv_hops = (cp - 1) * hop.kv;  // k and v to the next rank, cp - 1 times
  const double dkv_hops = cp * hop.dkv;      // the dK/dV accumulators, cp hops
  return forward_passes(config.training.recompute) * kv_hops + kv_hops + dkv_hops;
}


double moe_local_layers(const Config& config, const ModelPartition& part) {
  const std::vector<ModelPartition> chunks =
      config.parallel.virtual_stages > 1 ? rank_chunks(config, part.tp_rank, part.pp_rank)
                                         : std::vector<ModelPartition>{part};
  double layers = 0;
  for (const ModelPartition& chunk : chunks) {
    const int end = chunk.layer_end < 0 ? config.model.n_layers : chunk.layer_end;
    for (int l = chunk.layer_begin; l < end; ++l) layers += config.model.moe_layer(l);
  }
  return layers;
}

double ep_all_to_all_calls_per_layer(const Config& config) {
  return config.parallel.ep > 1 ? 3 * forward_passes(config.training.recompute) + 2 : 0;
}

double ep_all_to_all_bytes(const Config& config, double moe_layers, double received_rows) {
  const auto& par = config.parallel;
  if (par.ep <= 1) return 0;
  const auto& m = config.model;
  const double kA = config.training.precision == Precision::kBf16 ? 2.0 : 4.0;
  const double N = static_cast<double>(par.micro_batch_size) * m.seq_len / par.cp;
  const double row = static_cast<double>(m.d_model) * kA;
  const double passes = forward_passes(config.training.recompute);
  // Per forward: the counts and the dispatched rows out, the received rows back; backward:
  // the dispatched rows' gradients out, the received rows' back.
  const double dispatched = config.grad_accum_steps() * moe_layers * N * m.moe_top_k;
  return passes * (config.grad_accum_steps() * moe_layers * m.moe_experts * 4.0 +
                   dispatched * row + received_rows * row) +
         dispatched * row + received_rows * row;
}

}  // namespace trident
