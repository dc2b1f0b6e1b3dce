#include "plan/traffic_model.h"

#include <vector>

#include "plan/partition.h"

namespace trident {

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
  double layers = 0;
  bool first = false, last = false;
  for (const ModelPartition& chunk : chunks) {
    layers += (chunk.layer_end < 0 ? config.model.n_layers : chunk.layer_end) - chunk.layer_begin;
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
  // Per layer, of N*C each: the row-parallel outputs reduced in forward, the
  // column-parallel inputs gathered in forward and their gradients reduced in backward
  // (the model description's block: 2 and 2 for gpt2 and llama).
  const LayerCollectives block = describe_collectives(config.model);
  const double col = block.column_inputs, row = block.row_outputs;
  if (par.tp > 1 && !sp) {
    // Forward all-reduces the row outputs, backward the column input gradients.
    double per_micro = (row + col) * layers * N * C;
    // Full recomputation reruns each layer's forward, all-reduces included, in backward.
    const double reruns = forward_passes(config.training.recompute) - 1;
    if (reruns > 0) per_micro += reruns * row * layers * N * C;
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
    double gather = layers * N * C * (col * passes + row + col);
    double scatter = layers * N * C * (row * passes + col);
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

  const double total = static_cast<double>(layout.total_floats());
  // The data-parallel machinery's group: dp x cp (cp ranks hold the same parameters).
  const double dp = static_cast<double>(par.dp) * par.cp;
  // A tied head in a one-stage model uses group 0 (wte) a second time: ZeRO-3 gathers
  // it again, and ZeRO-2/3 reduce-scatter its gradient once for the head and once for
  // the embedding.
  double group0_extra = 0;
  if (config.model.tied() && first && last) {
    group0_extra = static_cast<double>(layout.groups[0].num_floats);
  }
  switch (dp > 1 ? par.zero_stage : -1) {
    case -1:  // one data-parallel rank: nothing crosses ranks
      break;
    case 0:
      t.dp.all_reduce = total * kF;
      break;
    case 1:
      t.dp.reduce_scatter = total * kF;
      t.dp.all_gather = total * kA;
      break;
    case 2:
      t.dp.reduce_scatter = (total + group0_extra) * micro * kF;
      t.dp.all_gather = total * kA;
      break;
    default:
      t.dp.all_gather = (2 * total + 2 * group0_extra) * micro * kA;
      t.dp.reduce_scatter = (total + group0_extra) * micro * kF;
      break;
  }
  if (config.model.tied() && par.pp > 1 && (first || last)) {
    const ParamInfo* wte = layout.find("wte");
    const double floats = static_cast<double>(wte->numel());
    // The reduced gradient each rank holds: the whole wte (ZeRO 0), its owned rows (1-3).
    t.embedding.all_reduce = (par.zero_stage >= 1 ? floats / dp : floats) * kF;
  }
  return t;
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

}  // namespace trident
