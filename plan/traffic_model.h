// The analytic communication volume of one training step on one rank, per process
// group, in the payload convention of comm/communicator.h (all_reduce: the buffer;
// reduce_scatter: the input; all_gather: the output; send: the message). Benchmarks
// print it next to the measured counters, and tests require the two to agree.
//
// Per micro-batch of N = micro_batch_size * seq_len tokens and width C (floats); the
// per-layer counts are the model description's (model/model_description.h
// describe_collectives: 2 column-parallel inputs and 2 row-parallel outputs per layer;
// 1 and 1 per MoE layer, whose router and experts are replicated over tp):
// - tp (tp > 1): forward 2 all-reduces of N*C per layer, the vocab-parallel embedding
//   (N*C, first stage), the cross-entropy's row max (N) and sums (2N, last stage);
//   backward 2 all-reduces of N*C per layer and the head's input gradient (N*C); with
//   training.recompute full, backward reruns the forward's 2 per layer.
// - tp with parallel.sequence_parallel: per layer, forward 2 all-gathers and 2
//   reduce-scatters of N*C (one all-reduce's bytes each pair), backward 4 all-gathers
//   (the row output gradients, and the column inputs gathered again for the weight
//   gradients) and 2 reduce-scatters of N*C, and the norm-weight gradients all-reduced
//   (fp32; 4C gpt2, 2C llama: the block's norm tensors); the embedding reduce-scatters N*C forward and gathers it
//   backward (first stage); the head gathers its input and reduce-scatters its input
//   gradient (N*C each), all-reduces lnf's gradients (2C gpt2, C llama) and the
//   cross-entropy statistics (last stage); full recomputation adds the forward's
//   gathers and reduce-scatters per layer. A MoE layer (its router and experts replicated
//   over tp) adds 2 all-gathers of N*C backward (its input again, its output gradient)
//   and 1 forward (its input, counted per pass); its output needs no reduce-scatter.
// - pp: one activation (N*C; N/tp*C with sequence parallelism) sent forward per
//   micro-batch by every stage but the last, one gradient of the same size sent back by
//   every stage but the first; with parallel.virtual_stages, the same per model chunk
//   (the model's first and last chunks excepted).
// - dp, per step: ZeRO 0 all-reduces every gradient once; ZeRO 1 reduce-scatters every
//   gradient once (into the owned rows) and all-gathers the parameters; ZeRO 2 reduce-scatters each group's gradients after its backward, per
//   micro-batch, and all-gathers the parameters; ZeRO 3 all-gathers each group before
//   its forward and again before its backward and reduce-scatters its gradients, per
//   micro-batch (a tied one-stage head uses group 0 a second time, under ZeRO 2 and 3).
// - embedding (tied, pp > 1): one all-reduce of this rank's reduced wte gradient.
// - cp (parallel.cp > 1; parallel/context_parallel.h): a rank holds N/cp of a micro-batch's
//   tokens, so every per-token volume above (tp, pp, the cross-entropy statistics) uses
//   N/cp, and the data-parallel group is dp x cp (the volumes above with dp*cp for dp).
//   The ring sends, per layer and micro-batch, with K = (N/cp) * (n_kv_heads/tp) *
//   head_dim elements of one rank's keys (and as many of its values): forward (cp - 1)
//   hops of k and v, 2 (cp - 1) K compute-dtype elements; backward the same again plus cp
//   hops of the dK/dV accumulators, 2 cp K fp32; full recomputation reruns the forward's
//   hops (selective does not: the ring keeps its log-sum-exp per layer). Point-to-point,
//   so `send` only.
// - ep (parallel.ep > 1; model/transformer.cpp's moe_forward / moe_backward): per MoE
//   layer (the leading moe_first_dense_layers have none) and micro-batch an ep rank sends
//   by all-to-all the expert counts (E i32), its N*K dispatched rows and back the rows its
//   experts received; backward the N*K rows' output gradients and back the received rows'
//   input gradients (rows of C compute-dtype elements); full recomputation reruns the
//   forward's three. ep_all_to_all_bytes with the rows received; analytic_traffic takes
//   them balanced (N*K per rank and layer: over an ep group the received rows sum to the
//   dispatched ones, so the group's total is exact whatever the routing).
// - expert_dp (ep > 1): the routed experts' parameter groups (model/model_description.h
//   is_expert_group) are reduced over the dp / ep ranks holding the same experts with the
//   ZeRO stage's collectives as dp's above; dp then counts the other groups only.
// Element sizes (training.precision): activations, pipeline boundary tensors and the
// parameter all-gathers move compute-dtype elements (4 bytes in fp32, 2 in bf16); the
// cross-entropy statistics and every gradient reduction stay fp32 (4 bytes).
// The dp volumes here are exact only when every tensor's rows divide by dp and every
// tensor is a multiple of 16 floats (no shard padding, no alignment gaps); otherwise
// the measured volume is larger by the padding.
#pragma once

#include "core/param_layout.h"
#include "model/transformer.h"
#include "config/config.h"

namespace trident {

struct GroupTraffic {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0, send = 0;  // bytes per step
  double all_to_all = 0;  // the bytes this rank sends (expert parallelism's exchanges)
  double total() const { return all_reduce + reduce_scatter + all_gather + send + all_to_all; }
};

struct RankTraffic {
  GroupTraffic tp, dp, pp, embedding;
  GroupTraffic cp;  // the ring of ring attention (parallel.cp > 1)
  GroupTraffic ep, expert_dp;  // expert parallelism's all-to-all and experts' reduction
  double total() const {
    return tp.total() + dp.total() + pp.total() + embedding.total() + cp.total() + ep.total() +
           expert_dp.total();
  }
};

// `part`: the rank's (first) model chunk; with parallel.virtual_stages > 1 its chunks
// come from plan/partition.h. `layout`: the rank's parameter table (all its chunks).
RankTraffic analytic_traffic(const Config& config, const ModelPartition& part,
                             const ParamLayout& layout);

// The cp ring's bytes sent per layer and micro-batch by one rank (the cp part above;
// 0 at cp 1): forward and backward, with training.recompute's reruns.
double cp_ring_bytes_per_layer(const Config& config);
// What one rank sends in one hop of that ring: its k and v block (the compute dtype) and,
// backward, its dK/dV accumulator (f32); 0 when cp = 1. cp_ring_bytes_per_layer is
// forward_passes x (cp-1) kv hops, (cp-1) more kv hops and cp dkv hops.
struct CpRingHop {
  double kv = 0, dkv = 0;
};
CpRingHop cp_ring_hop_bytes(const Config& config);

// The all-to-all bytes one ep rank sends in a step (the ep part above; 0 at ep 1) over
// `moe_layers` local MoE layers, its experts having received `received_rows` rows over
// the step's micro-batches and those layers (one forward's worth).
double ep_all_to_all_bytes(const Config& config, double moe_layers, double received_rows);
// The MoE layers (TransformerConfig::moe_layer) of the rank holding `part` (all its
// chunks under parallel.virtual_stages > 1).
double moe_local_layers(const Config& config, const ModelPartition& part);
// The floats of one data-parallel bucket: parallel.bucket_mb of f32 gradients, at least
// one (as DataParallel cuts its buckets).
double dp_bucket_floats(const ParallelConfig& par);

// The collectives of each kind the data-parallel group's engine issues per step (the dp
// part above: the layout's groups, the routed experts' excepted), as the trainer issues
// them (parallel/data_parallel.h, parallel/sharded_param_store.h): ZeRO 0 one all-reduce
// per bucket (parallel.bucket_mb; a bucket never spans groups), ZeRO 1 a reduce-scatter
// and an all-gather per bucket; ZeRO 2 one reduce-scatter per group and micro-batch and
// the buckets' all-gathers; ZeRO 3 two all-gathers and one reduce-scatter per group and
// micro-batch. `tied_one_stage`: a tied head in a one-stage model, whose use of group 0
// adds one of each per micro-batch under ZeRO 2 and 3. `experts`: instead the routed
// experts' groups (is_expert_group, ep > 1), which the expert_dp group's engine (dp / ep
// ranks) runs the same way. 0 when the group has one rank.
struct DpCalls {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  double total() const { return all_reduce + reduce_scatter + all_gather; }
};
DpCalls dp_collective_calls(const Config& config, const ParamLayout& layout, bool tied_one_stage,
                            bool experts = false);
// The all-to-all calls of one micro-batch per MoE layer: the counts, the dispatch and the
// combine per forward (twice under full recomputation), two in backward.
double ep_all_to_all_calls_per_layer(const Config& config);

}  // namespace trident
