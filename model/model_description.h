// The model description: for a TransformerConfig and one rank's part of it, the one list
// of the model's parameter tensors (name, global and local shape, tensor-parallel split,
// group), its activation buffers (rows, width, dtype, whether recomputation moves them
// into the shared set), the buffers of a key/value cache for its cached forward, and its
// FLOPs per layer (forward, backward, recompute).
//
// The Transformer allocates from it (its parameter table, activation arenas and caches), and the
// planners only sum it: the memory plan (plan/memory_plan.h), the traffic model
// (plan/traffic_model.h) and `trident plan`'s compute time. A layer's rows come from
// its family's block builder (model/architecture.h): a family whose block has one more
// tensor or buffer is followed by all of them with no other edit.
//
// Sizes are doubles where they multiply token rows (a validated config may still
// describe more bytes than a size_t holds); shapes are int64. Pure functions of their
// arguments; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/param_layout.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace trident {

struct ModelPartition {
  int tp_rank = 0;
  int tp_size = 1;
  int pp_rank = 0;
  int pp_size = 1;
  int layer_begin = 0;
  int layer_end = -1;  // -1 = n_layers
  // Megatron sequence parallelism over the tp group (parallel.sequence_parallel; ignored
  // at tp 1): see "Sequence parallelism" in model/transformer.h.
  bool sequence_parallel = false;
  // Interleaved 1F1B (parallel.virtual_stages): this is model chunk `chunk` of the
  // num_chunks on its pipeline rank; the model's first stage is chunk 0 of rank 0, its
  // last the last chunk of the last rank.
  int chunk = 0;
  int num_chunks = 1;
  // Context parallelism (parallel.cp; parallel/context_parallel.h): this rank holds chunks
  // cp_rank and 2 cp - 1 - cp_rank of every sequence, seq_len / cp positions.
  int cp_rank = 0;
  int cp_size = 1;
  // Expert parallelism (parallel.ep): this rank holds routed experts
  // [ep_rank * E / ep, (ep_rank + 1) * E / ep) of every layer, in groups of their own
  // (moe_expert_group); the router and the shared experts stay in the layer's group.
  int ep_rank = 0;
  int ep_size = 1;
  bool first_stage() const { return pp_rank == 0 && chunk == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1 && chunk == num_chunks - 1; }
  int local_layers(int n_layers) const { return (layer_end < 0 ? n_layers : layer_end) - layer_begin; }
};

// ---- a layer's rows (what a block builder lists) -------------------------------------

// The model dimensions a row's sizes are made of: global ones for parameter shapes,
// this rank's tensor-parallel part for activation widths. Mixture of experts: kE experts,
// kK of them per token, kFe an expert's hidden width; kKC and kKF the widths per token
// of the dispatched rows (K rows of C or of Fe per token), kSF the shared experts' hidden
// widths together (S * Fe).
enum class Dim { kOne, kC, kQ, kKV, kF, kE, kK, kFe, kKC, kKF, kSF };

// What a layer tensor is to the Transformer's block (kNone: not read by it, e.g. a test
// family's extra tensor: allocated and counted, never used).
enum class ParamRole {
  kNorm1W, kNorm1B, kQW, kQB, kKW, kKB, kVW, kVB, kOW, kOB, kNorm2W, kNorm2B,
  kMlpInW, kMlpInB, kMlpUpW, kMlpOutW, kMlpOutB,
  // Mixture of experts: the router, and each expert's MLP (LayerTensor::expert says which).
  kRouterW, kExpertInW, kExpertInB, kExpertUpW, kExpertOutW, kExpertOutB, kNone
};
enum class BufferRole {
  kLn1, kLn1Mean, kLn1Rstd, kQ, kK, kV, kAttState, kAtty, kRes2, kLn2, kLn2Mean, kLn2Rstd,
  kH1, kH2, kHAct,
  // Mixture of experts: the router's probabilities and log-sum-exp, the chosen experts and
  // their weights, the dispatch order and its inverse, the dispatched rows (expert 0's
  // first), the experts' hidden tensors and their outputs, in dispatch order.
  kRouterProbs, kRouterLse, kMoeWeights, kMoeExperts, kMoeOrder, kMoePosition, kMoeX, kMoeH1,
  kMoeH2, kMoeHAct, kMoeY,
  // The shared experts' hidden tensors, [N, Fe] per shared expert one after the other.
  kSharedH1, kSharedH2, kSharedHAct, kNone
};
inline constexpr int kParamRoles = static_cast<int>(ParamRole::kNone);
inline constexpr int kBufferRoles = static_cast<int>(BufferRole::kNone);

// The initial values of a layer tensor of `role` (a row may declare another): norm weights
// ones, biases zeros, the projections into the residual stream (attn.o, the MLP's output)
// the residual-scaled normal, every other weight (kNone included) the plain normal.
constexpr InitKind init_for(ParamRole role) {
  switch (role) {
    case ParamRole::kNorm1W: case ParamRole::kNorm2W: return InitKind::kOnes;
    case ParamRole::kNorm1B: case ParamRole::kNorm2B: case ParamRole::kQB: case ParamRole::kKB:
    case ParamRole::kVB: case ParamRole::kOB: case ParamRole::kMlpInB: case ParamRole::kMlpOutB:
    case ParamRole::kExpertInB: case ParamRole::kExpertOutB:
      return InitKind::kZeros;
    case ParamRole::kOW: case ParamRole::kMlpOutW: case ParamRole::kExpertOutW:
      return InitKind::kResidualNormal;
    default: return InitKind::kNormal;
  }
}

// One parameter tensor of a layer, in parameter-layout order (offsets, shards and
// checkpoints follow it).
struct LayerTensor {
  std::string name;  // after "layers.{i}."
  ParamRole role;
  Dim rows, cols;    // global shape; cols kOne: a vector
  int split_dim;     // over tp, as the tensor-parallel layer using it splits it; -1 replicated
  // Column-parallel weights (split_dim 0, 2-D): the buffer their GEMM reads, gathered
  // over tp under sequence parallelism (weights reading the same input share one gather).
  BufferRole input = BufferRole::kNone;
  InitKind init = init_for(role);  // Transformer::initial_value's rule
  // The expert whose MLP it belongs to: 0 .. E-1 the routed ones, E + s shared expert s;
  // -1 none.
  int expert = -1;
};

// What an activation buffer's elements are.
enum class BufferKind {
  kCompute,         // compute dtype (training.precision)
  kStatistic,       // f32 (norm statistics, the router's probabilities and weights)
  kIndex,           // i32 (the chosen experts, the dispatch order)
  kAttentionState,  // opaque bytes sized by the backend (Ops::attention_state_bytes)
};

// One activation buffer of a layer, kept per micro-batch slot for backward.
struct LayerBuffer {
  std::string name;
  BufferRole role;
  Dim width;        // elements per token row (local); unused for the attention state
  BufferKind kind;
  bool sharded;     // on this rank's token rows under sequence parallelism (else all N)
  // Recomputed under training.recompute selective (the attention state): one set for
  // every layer and slot. Under full recomputation every layer buffer is.
  bool selective = false;
};

struct BlockDescription {
  std::vector<LayerTensor> tensors;
  std::vector<LayerBuffer> buffers;
};

// The standard decoder block of the architecture fields (model/architecture.h): pre-norm
// attention (q, k, v, o; biases per the row) and MLP (GELU fc/proj or SwiGLU
// gate/up/down).
void standard_block(const TransformerConfig& config, BlockDescription* block);
// The block of config.arch's family (its builder, or standard_block): a MoE layer's in a
// mixture-of-experts model. Built once per thread and (family, moe_experts,
// moe_shared_experts), which is all a builder may read (sizes are Dim symbols); the
// reference stays valid for the thread's life.
const BlockDescription& describe_block(const TransformerConfig& config);
// The block of layer `layer`: the dense block for the leading moe_first_dense_layers of a
// mixture-of-experts model (TransformerConfig::moe_layer), else describe_block.
const BlockDescription& describe_layer_block(const TransformerConfig& config, int layer);

// ---- parameters ------------------------------------------------------------------------

// A parameter group's tensors: 0 the embeddings, 1 + i layer i, L + 1 the head; under
// expert parallelism (ep_size > 1) also L + 2 + i, the local routed experts of layer i
// (reduced and sharded over the expert-data-parallel group, not over dp).
enum class GroupKind { kEmbedding, kLayer, kHead };
// The group holding layer `layer`'s routed experts: 1 + layer, or L + 2 + layer at ep > 1.
inline int moe_expert_group(int n_layers, int ep_size, int layer) {
  return ep_size > 1 ? n_layers + 2 + layer : 1 + layer;
}
// Whether parameter group `group` of a model of n_layers holds routed experts only.
inline bool is_expert_group(int n_layers, int group) { return group >= n_layers + 2; }
struct TensorDesc {
  std::string name;  // full name for kEmbedding / kHead, after "layers.{i}." for kLayer
  ParamRole role = ParamRole::kNone;
  Shape shape, local_shape;  // global, and this rank's tensor-parallel part
  int split_dim = -1;
  bool tied_copy = false;  // the head's copy of wte (tied, pp > 1)
  bool lookup = false;     // read as a table (wte on the first stage, wpe), not a GEMM
  InitKind init = InitKind::kNormal;  // Transformer::initial_value's rule
  int expert = -1;  // LayerTensor::expert
};
// The tensors of one group of a rank with tp size `tp`: the embedding group of the first
// stage, any layer's group, the head group of the last stage (`first`: this chunk also
// holds the embeddings, so a tied head reads wte there and needs no copy).
// kLayer: layer `layer`'s tensors (-1: a MoE layer's, describe_block).
std::vector<TensorDesc> describe_group(const TransformerConfig& config, GroupKind kind, int tp,
                                       bool first, int layer = -1);

// The parameter table and groups of one rank's part (core/param_layout.h), for one
// chunk or several (interleaved 1F1B, in layer order: one table of every chunk's groups;
// within each group the offsets are those of the chunk's own table). `config` finalized.
ParamLayout describe_params(const TransformerConfig& config, const ModelPartition& part);
ParamLayout describe_params(const TransformerConfig& config, std::span<const ModelPartition> chunks);

// ---- activations -----------------------------------------------------------------------

// One buffer: rows x width elements of dtype, or `bytes` given (the attention state).
struct BufferDesc {
  std::string name;
  DType dtype = DType::kF32;
  double elements = 0;  // 0: absent (not reserved)
  double bytes = 0;     // elements * dtype size, or the backend's size
  bool kept = true;     // kept per slot for backward (false: backward scratch)
  bool shared = false;  // recomputed: one set for every layer and slot, not per slot
  BufferRole role = BufferRole::kNone;
};

namespace buffers {
// Per-slot globals of a stage, in this order (the Transformer indexes them).
enum SlotGlobal {
  kTokens, kTargets, kLnf, kLnfMean, kLnfRstd, kLogits, kLosses, kXentMax, kXentSums,
  kSlotGlobals
};
// Backward scratch shared by all slots. Sequence parallelism only: kGather, the [N, C]
// workspace of the gathers and reduce-scatters; kDlnLocal, this rank's rows of a reduced
// column input gradient; kNormGrads, one block's norm-weight gradients (f32, 4 x C).
// Mixture of experts: kRouterLogits, the router's logits (f32) in forward and their gradient in
// backward; the gradients of the dispatched rows, of the experts' hidden tensors and
// outputs and of the weights; kMoeProbGrad, the load-balancing loss's gradient per expert
// (uploaded); kMoeStats, the router's statistics (downloaded: Ops::moe_route_forward);
// kMoeEpCounts, expert parallelism's exchanged row counts (i32, 2 E: sent, received).
// Context parallelism with learned positions: kPositions, the rows of wpe at this rank's
// positions (compute dtype, the embedding's table), kDPositions their gradient (f32).
// kQkv: cache mode's fused q/k/v projection rows [N, (NH + 2 NKV) HD] of a RoPE family
// (describe_kv_cache); empty for the training step, whose fused rows use dq | dk | dv in
// forward and the layer's q | k | v in backward (Transformer::block_forward).
enum Scratch {
  kDx, kDln, kDq, kDk, kDv, kDatty, kDh1, kDh2, kDhAct, kGather, kDlnLocal, kNormGrads,
  kRouterLogits, kDMoeX, kDMoeH1, kDMoeH2, kDMoeHAct, kDMoeY, kDMoeWeights, kMoeProbGrad,
  kMoeStats, kPositions, kDPositions, kMoeEpCounts, kQkv, kScratchCount
};
}  // namespace buffers

struct ActivationShape {
  int micro_batch_size = 1;
  int tp_size = 1;
  bool sequence_parallel = false;  // honoured at tp > 1 only
  bool last_stage = true;
  DType compute = DType::kF32;
  Recompute recompute = Recompute::kNone;
  // Context parallelism: a micro-batch has seq_len / cp_size positions per sequence, and
  // the attention state is ring attention's row log-sum-exp (f32, B x NH/tp x those),
  // kept per layer under selective recomputation too (a rerun would need the ring again).
  int cp_size = 1;
  // Expert parallelism: the experts' rows a rank receives are up to ep_size * N * K (the
  // dispatched rows of every rank of its ep group), so the expert-side buffers (moe_x,
  // moe_h1, moe_h2, moe_h_act and their gradients' scratch) hold that many rows.
  int ep_size = 1;
  double attention_state_bytes = 0;  // one layer's (Ops::attention_state_bytes, or the lse)
};

struct ActivationDescription {
  std::vector<BufferDesc> globals;  // buffers::SlotGlobal order, per slot
  BufferDesc residual;              // each of x_0 .. x_layers, per slot
  std::vector<BufferDesc> layer;    // describe_block's buffers, per slot and layer unless shared
  std::vector<BufferDesc> scratch;  // buffers::Scratch order, shared by all slots
};
ActivationDescription describe_activations(const TransformerConfig& config,
                                           const ActivationShape& shape);

// ---- the key/value cache (Transformer::forward_cached) ------------------------------------

struct KvCacheShape {
  int batch = 1;     // sequences
  int capacity = 0;  // positions per sequence
  int max_new = 0;   // new tokens per sequence one cached forward takes at most (a prefill)
  int tp_size = 1;
  DType compute = DType::kF32;
  bool all_logits = false;  // the head on every new token, else on each sequence's last
};

struct KvCacheDescription {
  // Per local layer: the keys and the values of this rank's kv heads,
  // [batch][capacity][kv_dim local], compute dtype.
  BufferDesc keys, values;
  // The buffers of one cached forward of batch x max_new tokens: describe_activations'
  // globals and layer buffers, the layer ones one set for every layer (shared: nothing is
  // kept for a backward), no attention state (the cached attention keeps none), the
  // residual stream in two buffers (the layers alternate between them), of the scratch
  // only the forward's (the mixture-of-experts layer's, the fused q/k/v rows;
  // buffers::Scratch order, the rest empty). The
  // head's buffers (lnf, its statistics, logits) have batch rows unless all_logits; the
  // loss's (targets, losses, cross-entropy statistics) none.
  ActivationDescription forward;
  // What a cache of a stage with `local_layers` layers allocates.
  double bytes(int local_layers) const;
};
KvCacheDescription describe_kv_cache(const TransformerConfig& config, const KvCacheShape& shape);

// ---- FLOPs -----------------------------------------------------------------------------

// The local work of one micro-batch's forward.
struct Work {
  double gemm_flops = 0, attention_flops = 0, elementwise_bytes = 0;
};
// Backward costs twice the forward's work (the input and the weight gradients).
inline constexpr double kBackwardPerForward = 2;
struct StageFlops {
  Work layer;  // one layer's forward (the mean of the part's: leading dense layers differ)
  Work head;   // the embedding and head (the head's GEMM, softmax, cross-entropy)
  double layers = 0;
  // The stage's forward (backward: kBackwardPerForward times it).
  Work forward() const;
  // What backward reruns per micro-batch (training.recompute): full the layers'
  // forward, selective the attention core.
  Work recompute(Recompute r) const;
};
// `part`'s tp size, stages and layer count; sequence_parallel as in the config (the
// elementwise passes of the [N, C] stream run on a shard).
StageFlops describe_flops(const TransformerConfig& config, const ModelPartition& part,
                          int micro_batch_size, DType compute, bool sequence_parallel);

// The tp collectives of one layer: the column-parallel inputs gathered (or their
// gradients all-reduced) and the row-parallel outputs reduced, each of N x C; and the
// norm tensors' elements (under sequence parallelism their gradients come from this
// rank's rows only and are summed over tp).
struct LayerCollectives {
  double column_inputs = 0, row_outputs = 0;
  double norm_floats = 0;       // per layer
  double head_norm_floats = 0;  // the head group's (the final norm)
};
// `layer`: that layer's block (describe_layer_block: a MoE model's leading dense layer has
// the dense MLP's collectives, a MoE layer only attention's, its experts being replicated
// over tp); -1: describe_block's.
LayerCollectives describe_collectives(const TransformerConfig& config, int layer = -1);
// The forwards of each layer per micro-batch: 2 under full recomputation (backward reruns
// it, its tp collectives included), else 1.
inline double forward_passes(Recompute r) { return r == Recompute::kFull ? 2 : 1; }

}  // namespace trident
