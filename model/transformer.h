// Transformer: a decoder-only language model with explicit forward and backward,
// for the families of model/architecture.h (gpt2, llama), on one rank's part of the
// model (a pipeline stage's layers, a tensor-parallel slice of each layer). Its
// parameter table and activation buffers are the model description's
// (model/model_description.h); the block branches on the architecture row's fields.
//
// Parameter names and global shapes are the contract with checkpoints, the llm.c
// loader and the PyTorch reference (tests/reference/make_fixtures.py):
//
//   wte                     (Vp, C)      token embedding; also the LM head when tied
//   wpe                     (maxT, C)    gpt2 only: learned positions
//   layers.{i}.ln1.weight   (C)          gpt2 LayerNorm / llama RMSNorm before attention
//   layers.{i}.ln1.bias     (C)          gpt2 only
//   layers.{i}.attn.q.weight (NH*HD, C)  layers.{i}.attn.q.bias (NH*HD)   [bias: gpt2]
//   layers.{i}.attn.k.weight (NKV*HD, C) layers.{i}.attn.k.bias (NKV*HD)  [bias: gpt2]
//   layers.{i}.attn.v.weight (NKV*HD, C) layers.{i}.attn.v.bias (NKV*HD)  [bias: gpt2]
//   layers.{i}.attn.o.weight (C, NH*HD)  layers.{i}.attn.o.bias (C)       [bias: gpt2]
//   layers.{i}.ln2.weight   (C)          layers.{i}.ln2.bias (C)           [bias: gpt2]
//   gpt2:  layers.{i}.mlp.fc.weight (F, C), mlp.fc.bias (F), mlp.proj.weight (C, F),
//          mlp.proj.bias (C)
//   llama: layers.{i}.mlp.gate.weight (F, C), mlp.up.weight (F, C), mlp.down.weight (C, F)
//   lnf.weight (C), lnf.bias (C, gpt2 only)   final norm
//   lm_head.weight          (Vp, C)      untied models only
//
// Tensor parallelism (Megatron), composed from parallel/tensor_parallel.h: q/k/v,
// fc/gate/up and the LM head are column-parallel linears (weights split along dim 0),
// attn.o and mlp.proj/down row-parallel (dim 1), the embedding and the cross-entropy
// vocab-parallel; everything else is replicated. The model makes no tp collective itself:
// the layers' mapping points do (forward: after attn.o, the MLP output and the
// embedding; backward: one all-reduce per column input: q/k/v, fc/gate/up, head).
//
// Sequence parallelism (ModelPartition::sequence_parallel, tp > 1;
// parallel/tensor_parallel.h): the residual stream x_l, the norms and their inputs and
// outputs (ln1, res2, ln2, the final norm's statistics), the stage boundary and the
// gradient dx live on this rank's N/tp token rows; q/k/v, attention, the MLP's hidden
// tensors, the head's input (lnf, gathered) and the logits stay on all N rows, split by
// heads or features. Each column-parallel block all-gathers its normed input into a
// workspace (and again in backward, for the weight gradient), each row-parallel one
// reduce-scatters its partial output; the norm weights' gradients (from this rank's rows
// only) are summed over tp per micro-batch before they join the parameter gradients.
//
// Pipeline parallelism: a rank holds layers [layer_begin, layer_end); the first stage
// also the embeddings, the last the final norm and head (and, when tied and pp > 1, a
// copy of wte). Activations of up to `num_slots` micro-batches are kept at once.
//
// Context parallelism (ModelPartition::cp_size > 1; parallel/context_parallel.h): every
// sequence of a micro-batch is seq_len / cp rows, this rank's chunks r and 2 cp - 1 - r
// side by side. RoPE and the learned positions (wpe's rows, copied into a local table;
// its gradient added back at those rows) are those of the chunks' global positions, and
// attention is RingAttention over the cp group (its state, the row log-sum-exp, kept per
// layer); everything else is per token and runs on the local rows unchanged.
//
// Activation recomputation (training.recompute; Korthikanti et al. 2022). kSelective:
// the attention state (the CPU's softmax probabilities, T^2 per head) is not kept per
// layer: one buffer serves every layer and slot, and backward reruns attention_forward
// into it before attention_backward. kFull: of each layer only its input x_l is kept per
// slot; the layer's other tensors live in one shared set, and backward reruns the layer's
// forward (tensor-parallel all-reduces included) before its backward. Both recompute
// exactly what forward computed, so results are bitwise those of kNone.
//
// Initialisation (initial_value, by the rule of each parameter's description row:
// model/model_description.h init_for): every matrix and embedding ~ N(0, init_std), the
// residual output projections (attn.o, mlp.proj, mlp.down) ~ N(0, init_std/sqrt(2L)),
// biases 0, norm weights 1, padded vocabulary rows 0. Element i of the GLOBAL tensor P
// is drawn from Philox keyed by (seed, hash(P)) at counter i: the same global weights
// for every layout. Weight decay applies to 2-D parameters only.
//
// Cache mode (inference): forward_cached runs the same layer code over new tokens at
// positions [p, p + T) of a KvCache: the embedding (gpt2: wpe rows p..p+T-1), per layer
// the norms, q/k/v, RoPE at positions p.., the new keys and values written into the
// cache at p.., Ops::attention_cached_forward over positions 0..p+T-1, attn.o, the MLP and
// the residuals, then the final norm and the head. A prompt is prefilled in one call and
// decoding feeds one token per call. One stage, no tensor parallelism (the cache mode is
// not built for collectives: forward_cached refuses pp > 1 and tp > 1, sequence
// parallelism included). A mixture-of-experts layer runs its training forward too (the
// router, the experts and their dispatch over the new tokens), with no statistics
// recorded. A model built with num_slots 0 has no training activations and
// runs forward_cached only (generation: model/kv_cache_decoder.h).
//
// Mixture of experts (TransformerConfig::moe_experts > 0): each layer's MLP (but the
// leading moe_first_dense_layers', which keep the dense MLP: TransformerConfig::moe_layer) is E experts
// (the family's MLP, hidden width moe_d_ff: layers.{i}.moe.experts.{e}.fc/proj or
// gate/up/down) and a router, layers.{i}.moe.router.weight (E, C). A token's router
// logits (ln2 @ router^T) go through a softmax in fp32; its top K experts (a tie to the
// lowest index) each process it, and their outputs are summed with the K probabilities
// renormalised to sum to 1 (Mixtral); model.moe_shared_experts more experts
// (layers.{i}.moe.shared_experts.{s}.*) process every token, added with weight 1
// (DeepSeekMoE). Dropless: no capacity, no token dropped. The
// assignments are sorted by expert, then by token (Ops::moe_dispatch), the tokens'
// rows gathered in that order, each expert runs its GEMMs over its slice of rows, and the
// results are combined per token in choice order: the same bits for any thread count.
// The experts' row counts come to the host once per layer and micro-batch (a download,
// on a GPU a synchronisation). The objective adds, per layer and micro-batch, scaled like
// the LM loss, training.moe_aux_loss_coef times Switch Transformer's load-balancing loss
// E * sum_e f_e * P_e (f_e: the fraction of the N * K assignments expert e received,
// P_e: its mean router probability; 1 when balanced) and training.moe_z_loss_coef times
// the router z-loss mean(logsumexp(logits)^2) (ST-MoE). The experts are ordinary
// replicated parameters (data parallelism, ZeRO and pipelines treat them as any other);
// tensor parallelism does not run them (refused).
//
// Expert parallelism (ModelPartition::ep_size > 1, the ep Communicator): this rank holds
// routed experts [ep_rank * E / ep, ...) (their own parameter groups, moe_expert_group);
// the router and shared experts are replicated. After the dispatch (rows sorted by expert,
// then token) the rows of each ep rank's experts are contiguous: one all_to_all of the
// counts (per expert) and one of the rows send them to their experts' ranks; the received
// rows are reordered expert-major (per local expert, source ranks in rank order, each
// source's rows in its token order), each local expert runs one GEMM over all of them,
// and the outputs go back the same way (all_to_all), to be combined as at ep 1. Backward
// sends the outputs' gradients to the experts and the inputs' gradients back. So the
// results are those of ep 1 up to the order of the expert weight-gradient sums (one GEMM
// over the ep group's rows instead of per-rank GEMMs summed by the dp reduction). The
// counts exchange costs one more upload and download per layer and micro-batch (the
// received counts size the local GEMMs); the experts' buffers hold up to ep * N * K rows
// (describe_activations, ActivationShape::ep_size).
//
// Threading: one Transformer per thread of control; all compute goes through the Ops,
// all communication through the tensor-parallel layers' tp Communicator (collectives in
// the same order on every tp rank, as comm/communicator.h requires).
#pragma once

#include <cstdint>
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "model/model_description.h"
#include "parallel/context_parallel.h"
#include "parallel/param_store.h"
#include "parallel/tensor_parallel.h"

namespace trident {

class Communicator;

// The key/value cache of Transformer::forward_cached: per local layer the keys (after
// RoPE) and values of this rank's kv heads at positions [0, capacity) of `batch`
// sequences, [batch][capacity][kv_dim] in the model's compute dtype, and the buffers of
// one cached forward of up to batch x max_new new tokens. Sizes: describe_kv_cache
// (model/model_description.h). Made by Transformer::make_kv_cache, used only with the
// model that made it. Move-only (it owns device buffers).
class KvCache {
 public:
  KvCache() = default;
  int batch() const { return batch_; }
  int capacity() const { return capacity_; }
  int max_new() const { return max_new_; }
  bool all_logits() const { return all_logits_; }
  // Positions filled: the next forward_cached starts here.
  int position() const { return position_; }
  // Forgets every position (the next forward_cached starts at 0); no device work.
  void reset() { position_ = 0; }
  size_t bytes() const { return keys_.bytes() + values_.bytes() + work_.bytes(); }

 private:
  friend class Transformer;
  int batch_ = 0, capacity_ = 0, max_new_ = 0;
  bool all_logits_ = false;
  int position_ = 0;
  int last_B_ = 0, last_T_ = 0;  // the last forward_cached's shape (whose logits are kept)
  size_t layer_elements_ = 0;    // of one layer's keys (or values)
  DeviceBuffer keys_, values_;   // local layers x [batch][capacity][kv_dim]
  DeviceBuffer work_;            // the forward's buffers, views below (null: absent)
  std::vector<DevPtr> globals_;  // buffers::SlotGlobal order
  std::array<DevPtr, 2> x_{};    // the residual stream, alternating between layers
  std::vector<DevPtr> layer_;    // describe_block's buffers, one set for every layer
  std::vector<BufferRole> roles_;
  std::vector<DevPtr> scratch_;  // buffers::Scratch order: the MoE forward's only
  std::vector<int> moe_counts_;  // the MoE forward's expert row counts, reused per layer
};

// Layers per stage: `stage_layers` if given, else contiguous and balanced (earlier
// stages take the remainder).
std::vector<int> stage_layer_counts(int n_layers, int pp, const std::vector<int>& stage_layers);

class Transformer {
 public:
  // The block's views of one layer's parameters and activation buffers (bound by the
  // roles of the model description's rows).
  struct LayerParams;
  struct ExpertParams;
  struct LayerActs;

  // The parameter table is describe_params (model/model_description.h).
  // The initial value of one parameter's local part (host, local_shape, row-major).
  static std::vector<float> initial_value(const TransformerConfig& config, const ParamInfo& param,
                                          uint64_t seed);

  // The whole model in one process with its own resident parameter store. `compute`:
  // the dtype of the compute weights and activations (f32, or bf16 for
  // training.precision bf16; gradients are f32 either way).
  Transformer(const TransformerConfig& config, Ops& ops, int micro_batch_size,
              DType compute = DType::kF32);
  // One rank's part. `tp` null means no tensor parallelism; `store` null means an own
  // resident store (else it must outlive the model, follow describe_params(config, part) and
  // have compute_dtype() == compute). num_slots 0: no activation slots nor backward
  // scratch (cache mode only: forward_cached's buffers are its KvCache's). `cp`: the cp
  // group when part.cp_size > 1 (its rank part.cp_rank), else ignored; the stage calls
  // then take micro_batch_size sequences of seq_len / cp rows, this rank's two chunks
  // (parallel/context_parallel.h), and attention runs as RingAttention over the group.
  Transformer(const TransformerConfig& config, Ops& ops, const ModelPartition& part,
              Communicator* tp, ParamStore* store, int micro_batch_size, int num_slots,
              DType compute = DType::kF32, Recompute recompute = Recompute::kNone,
              Communicator* cp = nullptr, Communicator* ep = nullptr,
              bool pooled_activations = false);
  ~Transformer();
  // The chunks of one pipeline stage (interleaved 1F1B) share one pool of activation
  // slots, the executor's slot ids being unique over the stage (parallel/pipeline.h).
  // Built with pooled_activations, a model lays out its slots but allocates none; this
  // allocates num_slots slots of the largest chunk's slot bytes in models[0] (its
  // activation_bytes(); the others report 0) and makes every model index that buffer with
  // that stride. Every model must have been built pooled with the same num_slots.
  static void share_activations(std::span<Transformer* const> models);
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const TransformerConfig& config() const { return config_; }
  const ModelPartition& partition() const { return part_; }
  const ParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  // Bytes of the per-slot activation arenas this model allocated (what the pipeline's live
  // micro-batches hold): num_slots slots, or with share_activations the pool (models[0]).
  size_t activation_bytes() const { return activations_.bytes(); }
  // Bytes shared by all slots: the backward scratch, with recomputation the one set of
  // recomputed layer tensors, and under context parallelism ring attention's buffers.
  size_t scratch_bytes() const {
    return scratch_.bytes() + shared_.bytes() + (ring_ ? ring_->bytes() : 0);
  }
  Recompute recompute() const { return recompute_; }
  // Elements (compute dtype) of one micro-batch's stage boundary: this rank's token rows
  // (all N, or N/tp with sequence parallelism) times d_model.
  size_t boundary_floats() const;
  ParamStore& store() { return *store_; }
  DType compute_dtype() const { return compute_dtype_; }

  // ---- the resident store only (single process, ZeRO 0-2) ----------------------------
  size_t num_param_floats() const { return layout_.total_floats(); }
  DevPtr param_data();  // device memory (compute dtype), flat layout
  // set_param/get_param/params_*: host f32 values (rounded to / widened from bf16 when the
  // compute dtype is bf16: Ops::upload_floats).
  DevPtr grad_data();
  void init_weights(uint64_t seed);
  void set_param(const ParamInfo& param, const float* host);
  void get_param(const ParamInfo& param, float* host) const;
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;
  void params_from_host(const std::vector<float>& host);
  void zero_grads();

  // ---- whole-model convenience (one stage, slot 0) ------------------------------------
  // Forward of B sequences of T tokens (host arrays of B*T ids; B <= micro-batch size,
  // T <= seq_len). With targets returns the mean token loss (one download; the loss
  // accumulator is reset before and taken after); without, 0 (logits only).
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Accumulates the gradient of loss_scale * mean(token losses) of the last forward.
  void backward(float loss_scale);
  // Logits of the last forward, [B, T, Vp_local] on the host.
  std::vector<float> logits_to_host() const;

  // ---- cache mode (inference: the whole model, no tensor parallelism) -------------------
  // A cache for `batch` sequences of `capacity` positions (<= max_seq_len) whose calls take
  // up to max_new new tokens per sequence; `all_logits`: keep the logits of every new
  // token, else of each sequence's last one only (the head then runs on B rows).
  KvCache make_kv_cache(int batch, int capacity, int max_new, bool all_logits = false);
  // Forward of T new tokens per sequence (tokens: host, [B][T]; B <= cache.batch(),
  // T <= cache.max_new()) at positions cache.position() .. +T-1 (see "Cache mode" above),
  // then cache.position() += T. CHECK-fails naming the limit when the cache would run past
  // its capacity ("KV cache full"), and for pipeline stages or tensor parallelism.
  void forward_cached(const int32_t* tokens, int B, int T, KvCache& cache);
  // The logits of the last forward_cached on `cache`, on the host (one download): [B, T, Vp]
  // with all_logits, else [B, Vp] (each sequence's last new token).
  std::vector<float> cached_logits_to_host(const KvCache& cache) const;

  // ---- one pipeline stage --------------------------------------------------------------
  // Forward of a micro-batch kept in activation slot `slot`. The first stage embeds
  // `tokens`; other stages read input_activation(slot). The last stage computes the loss
  // if `targets` is given and adds the micro-batch's mean token loss to the device loss
  // accumulator (Ops::loss_accumulate); nothing is read back to the host.
  void forward_stage(int slot, const int32_t* tokens, const int32_t* targets, int B, int T);
  // The loss accumulator: the sum, in double and in call order, of the mean losses of the
  // forward_stage calls with targets since the last take. download_loss_sum reads it back
  // (one device -> host read) and resets it; reset_loss_sum only resets it (no read).
  double download_loss_sum();
  void reset_loss_sum();
  // Backward of the micro-batch in `slot`: the last stage starts from its loss, scaled
  // by loss_scale; other stages from output_grad(). Afterwards input_grad() holds the
  // gradient of the stage's input (stages > 0).
  void backward_stage(int slot, float loss_scale);
  // Device buffers of f32.
  DevPtr input_activation(int slot);   // [B*T, C], stage > 0
  DevPtr output_activation(int slot);  // [B*T, C], stage < last
  DevPtr output_grad();                // [B*T, C], shared by all slots
  DevPtr input_grad();                 // [B*T, C], shared by all slots

  // ---- mixture of experts (see "Mixture of experts" above) ------------------------------
  // The coefficients of the load-balancing loss and the router z-loss in the objective
  // (training.moe_aux_loss_coef, training.moe_z_loss_coef; defaults 0.01 and 0).
  void set_moe_loss_coefs(float aux, float z);
  // What the forwards since the last take recorded (recomputation records nothing twice):
  // the sums over micro-batches of the load-balancing and z-losses summed over this
  // stage's layers (the values before their coefficients), the micro-batches, and per
  // local layer the assignments each expert received.
  struct MoeStats {
    double aux_loss = 0, z_loss = 0;
    int micro_batches = 0;
    std::vector<std::vector<int64_t>> counts;  // [local layer][expert]
  };
  MoeStats take_moe_stats();

  // TRIDENT_FUSED_QKV: unset or 1, one q/k/v GEMM for RoPE families (the default); 0,
  // three (comparisons); another value CHECK-fails naming the variable.
  static bool fused_qkv_from_env();

 private:
  void init_partition(ParamStore* store, int micro_batch_size, int num_slots);
  void check_slots(const char* call) const;  // CHECK-fails without activation slots
  void allocate_activations();
  // `base`: the layer group's buffer, `expert_base` the routed experts' group's (the same
  // buffer at ep 1).
  LayerParams layer_params(int layer, DevPtr base, DevPtr expert_base) const;
  // Acquire / release the groups of layer `layer`: its own and, at ep > 1, its experts'.
  void acquire_layer(int layer, Phase phase);
  void release_layer(int layer, Phase phase);
  // Expert parallelism (ep_ set): the host counts of one MoE layer, [0, E) this rank's
  // dispatched rows per expert, [E, 2 E) the rows it receives, source-major
  // ([source ep rank][local expert]); ep_row_counts: the elements (rows * width) sent to
  // and received from each ep rank.
  void ep_exchange_counts(std::vector<int>& counts);
  void ep_row_counts(const std::vector<int>& counts, size_t width, std::vector<size_t>* send,
                     std::vector<size_t>* recv) const;
  // The rows local expert `local_expert` (expert first_expert_ + local_expert) runs: its
  // dispatched rows without expert parallelism, else those it received from every source
  // rank together (counts after ep_exchange_counts).
  int local_expert_rows(const std::vector<int>& counts, int local_expert) const;
  // Reorders received rows between source-major (as all_to_all delivers them: per source
  // rank, its rows of each local expert) and expert-major (per local expert, its rows from
  // each source rank in rank order: what the expert's GEMM reads); `to_experts` picks the
  // direction. Rows of `width` elements.
  void ep_reorder(DevPtr dst, DevPtr src, const std::vector<int>& counts, size_t width,
                  bool to_experts);
  LayerActs layer_acts(int slot, int local_layer) const;
  // f32 views of the activation and scratch slices (null when absent); the integer and
  // opaque slices are re-typed at their use (.as(DType::kI32 / kU8)).
  DevPtr act(int slot, int index) const;
  DevPtr scratch(int index) const;
  void zero_elements(DevPtr p, size_t n);  // n elements of p's dtype
  // Where the norm backwards of one block put the weight gradients `params` (null:
  // absent): the parameter gradients themselves, or with sequence parallelism zeroed
  // scratch slices (this rank's rows only), which finish_norm_grads sums over tp and adds
  // to the parameter gradients.
  using NormGrads = std::array<DevPtr, 4>;
  NormGrads norm_grad_targets(const NormGrads& params);
  void finish_norm_grads(const NormGrads& params, const NormGrads& targets, const char* label);
  void layer_forward(int slot, int layer, DevPtr x_in, DevPtr x_out, int B, int T,
                     bool recomputing = false);
  // One MoE layer's forward: where its experts' row counts go (kept per slot for
  // backward), whether its statistics are recorded (not when recomputing, nor in cache
  // mode), and the scratch it works in (buffers::Scratch order; empty: the model's own,
  // cache mode: the cache's).
  struct MoeStep {
    std::vector<int>* counts = nullptr;
    int local_layer = 0;
    bool record = true;
    std::span<const DevPtr> scratch;
  };
  void moe_forward(const LayerParams& p, const LayerActs& a, DevPtr ln2, DevPtr x_out, int N,
                   const MoeStep& step);
  // One expert's MLP on `rows` rows of x (y overwritten), and its backward: the expert's
  // gradients `g` accumulate, dx is set (dx_write kSet: rows of this expert alone, so not
  // zeroed first) or accumulated (kAdd), dact set, dh1 and dh2 accumulated (the caller
  // zeroes them); h2 / dh2 null for GELU.
  void expert_forward(const ExpertParams& w, DevPtr x, DevPtr h1, DevPtr h2, DevPtr act,
                      DevPtr y, int rows);
  void expert_backward(const ExpertParams& w, const ExpertParams& g, DevPtr dx,
                       DevPtr dy, DevPtr x, DevPtr h1, DevPtr h2, DevPtr act, DevPtr dh1,
                       DevPtr dh2, DevPtr dact, int rows, GradWrite dx_write);
  // Accumulates dln (the MLP input's gradient, [N, C]) and the parameter gradients `g` from
  // dx, the gradient of the MoE block's output.
  void moe_backward(const LayerParams& p, const LayerParams& g, const LayerActs& a, DevPtr ln2,
                    DevPtr dx, DevPtr dln, int N, const std::vector<int>& counts,
                    float loss_scale);
  // One layer's cache in a cached forward: keys and values of layer_elements each, new
  // rows written at `pos` of each sequence's `capacity` positions.
  struct CachedKv {
    DevPtr keys, values;
    int pos = 0, capacity = 0;
    DevPtr qkv;  // the fused q/k/v rows' buffer (null: none)
  };
  // The layer code of both forwards: `cache` null is the training forward
  // (attention_forward over the T tokens, its state kept in a.att_state), else the cached
  // one.
  void block_forward(int layer, const LayerActs& a, DevPtr x_in, DevPtr x_out, int B, int T,
                     const CachedKv* cache, const MoeStep* moe);
  // The final norm of N rows of xL and the head's logits (both forwards).
  void final_norm_and_head(DevPtr xL, DevPtr lnf, DevPtr lnf_mean, DevPtr lnf_rstd,
                           DevPtr logits, int N);
  void layer_backward(int slot, int layer, DevPtr x_in, DevPtr dx, int B, int T,
                      float loss_scale);
  // RoPE (or its transpose) on x[B, T, H, HD] at positions pos.., or under context
  // parallelism at this rank's two chunks' positions.
  void rope(DevPtr x, int B, int T, int H, int pos, bool backward);
  // run(first row, B, T, position of its first token) over the rows of [B, T] at positions
  // pos..: one call, or under context parallelism one per sequence and chunk.
  void rope_segments(int B, int T, int pos,
                     const std::function<void(size_t, int, int, int)>& run) const;
  // The fused q/k/v rows qkv [B*T, q + 2 kv] split into q, k, v (RoPE applied), or with
  // `backward` dq, dk, dv merged into them (RoPE's transpose applied): Ops::qkv_split /
  // qkv_merge at the rope positions.
  void qkv_permute(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int pos,
                   bool backward);
  // Whether the layer's q/k/v projection runs as one GEMM (into a fused-rows buffer the
  // caller has: adjacent_qkv, cache mode's qkv): a RoPE family (fused_qkv_) and the three
  // weights (and biases) stacked in the store, in `p`'s parameters and, when given, `g`'s
  // gradients.
  bool qkv_fusable(const LayerParams& p, const LayerParams* g) const;
  // q as the [N, q + 2 kv] fused rows' buffer when q, k and v (buffers of the largest
  // micro-batch's rows, [rows, q], [rows, kv], [rows, kv], of one dtype) lie one after the
  // other, else null.
  DevPtr adjacent_qkv(DevPtr q, DevPtr k, DevPtr v, int N) const;
  void head_forward(int slot, int B, int T, bool with_loss);
  void head_backward(int slot, float loss_scale, int B, int T);
  DevPtr group_param(int group, const char* name);
  DevPtr group_grad(int group, const char* name);

  TransformerConfig config_;
  Ops& ops_;
  ModelPartition part_;
  DType compute_dtype_ = DType::kF32;
  Recompute recompute_ = Recompute::kNone;
  TensorParallel tp_;
  // The tensor-parallel layers (stateless: local sizes and the group).
  ColumnParallelLinear q_, k_, v_, fc_, up_, head_;
  ColumnParallelLinear qkv_;  // q, k and v as one: their weights stacked (qkv_fusable)
  bool fused_qkv_ = false;
  RowParallelLinear o_, proj_;
  VocabParallelEmbedding embedding_;
  VocabParallelCrossEntropy xent_;
  ParamLayout layout_;
  std::unique_ptr<ResidentParamStore> own_store_;
  ParamStore* store_ = nullptr;
  int micro_batch_size_ = 0;
  int num_slots_ = 1;
  int n_local_layers_ = 0;
  // Local (tensor-parallel) sizes.
  int heads_ = 0, kv_heads_ = 0, ff_ = 0, vocab_local_ = 0;
  // Per global layer, per ParamRole: the index in layout_.params, -1 absent.
  std::vector<std::vector<int>> layer_param_index_;
  // Per global layer, per expert, per ParamRole: the experts' tensors (empty: dense).
  std::vector<std::vector<std::vector<int>>> layer_expert_index_;
  // Mixture of experts: per slot and local layer the row count of each expert (host: the
  // forward's download, read again by backward); the records take_moe_stats returns; a
  // host staging vector; the loss coefficients.
  std::vector<std::vector<int>> moe_counts_;
  MoeStats moe_stats_;
  std::vector<float> moe_host_stats_;
  float moe_aux_coef_ = 0.01f, moe_z_coef_ = 0.0f;
  size_t act_bytes_per_slot_ = 0;
  std::vector<size_t> slot_offsets_;     // per activation index, within one slot
  std::vector<DType> slot_dtypes_;       // per activation index
  std::vector<size_t> scratch_offsets_;  // per scratch index
  std::vector<DType> scratch_dtypes_;    // per scratch index
  DeviceBuffer activations_;             // num_slots * act_bytes_per_slot_, or the pool
  bool pooled_activations_ = false;      // slots live in a pool (share_activations)
  DevPtr act_base_;                      // slot 0: activations_, or the pool's
  size_t act_stride_ = 0;                // bytes from one slot to the next
  DeviceBuffer scratch_;
  // The block's buffers (describe_block order): their roles, and with recomputation the
  // offsets of those not kept per slot (kAbsent for those kept), one set for every layer
  // and slot.
  std::vector<BufferRole> buffer_roles_;
  std::vector<size_t> shared_offsets_;
  DeviceBuffer shared_;
  DeviceBuffer loss_sum_;  // (1) double: the loss accumulator (last stage)
  // Context parallelism (part_.cp_size > 1): this rank's chunks, and the ring attention
  // over the cp group; seq_rows_ the local rows of a sequence (seq_len / cp, else seq_len).
  CpChunks cp_;
  int seq_rows_ = 0;
  std::unique_ptr<RingAttention> ring_;
  // Expert parallelism (part_.ep_size > 1): the ep group tokens travel over.
  Communicator* ep_ = nullptr;
  int local_experts_ = 0, first_expert_ = 0;  // routed experts held here
  struct SlotInfo { int B = 0, T = 0; bool has_targets = false; };
  std::vector<SlotInfo> slot_info_;
};

}  // namespace trident
