#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace trident {

namespace {

constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

using namespace buffers;  // the per-slot globals and the scratch (model_description.h)

}  // namespace

// ---- the block's tensors and buffers --------------------------------------------------
// The rows come from the model description (describe_block); a row's role says which
// member of LayerParams / LayerActs the block reads it through.

// Expert e's MLP (the dense one's roles): fc / gate, its bias, up, proj / down, its bias.
struct Transformer::ExpertParams {
  DevPtr in_w, in_b, up_w, out_w, out_b;
};

struct Transformer::LayerParams {
  DevPtr ln1_w;   // (C)
  DevPtr ln1_b;   // (C)
  DevPtr q_w;     // (NH_local*HD, C)
  DevPtr q_b;     // (NH_local*HD)
  DevPtr k_w;     // (NKV_local*HD, C)
  DevPtr k_b;     // (NKV_local*HD)
  DevPtr v_w;     // (NKV_local*HD, C)
  DevPtr v_b;     // (NKV_local*HD)
  DevPtr o_w;     // (C, NH_local*HD)
  DevPtr o_b;     // (C)
  DevPtr ln2_w;   // (C)
  DevPtr ln2_b;   // (C)
  DevPtr fc_w;    // (F_local, C)  GELU mlp.fc / SwiGLU mlp.gate
  DevPtr fc_b;    // (F_local)
  DevPtr up_w;    // (F_local, C)  SwiGLU mlp.up
  DevPtr proj_w;  // (C, F_local)  GELU mlp.proj / SwiGLU mlp.down
  DevPtr proj_b;  // (C)
  DevPtr router_w;  // (E, C)  mixture of experts
  std::vector<ExpertParams> experts;  // the routed ones, then the shared ones
};

struct Transformer::LayerActs {
  DevPtr ln1;        // (N, C)
  DevPtr ln1_mean;   // (N)
  DevPtr ln1_rstd;   // (N)
  DevPtr q;          // (N, NH_local*HD)  after RoPE
  DevPtr k;          // (N, NKV_local*HD) after RoPE
  DevPtr v;          // (N, NKV_local*HD)
  DevPtr att_state;  // opaque attention state (Ops::attention_state_bytes), never read here
  DevPtr atty;       // (N, NH_local*HD)
  DevPtr res2;       // (N, C)  residual stream after attention
  DevPtr ln2;        // (N, C)
  DevPtr ln2_mean;   // (N)
  DevPtr ln2_rstd;   // (N)
  DevPtr h1;         // (N, F_local)  fc / gate output
  DevPtr h2;         // (N, F_local)  SwiGLU up output
  DevPtr h_act;      // (N, F_local)  gelu(h1) / silu(h1) * h2
  // Mixture of experts (model_description.h BufferRole).
  DevPtr router_probs;  // (N, E) f32
  DevPtr router_lse;    // (N) f32
  DevPtr moe_weights;   // (N, K) f32
  DevPtr moe_experts;   // (N, K) i32
  DevPtr moe_order;     // (N * K) i32
  DevPtr moe_position;  // (N * K) i32
  DevPtr moe_x;         // (N * K, C)  the dispatched ln2 rows, expert 0's first
  DevPtr moe_h1;        // (N * K, Fe)
  DevPtr moe_h2;        // (N * K, Fe) SwiGLU
  DevPtr moe_h_act;     // (N * K, Fe)
  DevPtr moe_y;         // (N * K, C)  the experts' outputs
  DevPtr shared_h1;     // (S, N, Fe)  the shared experts'
  DevPtr shared_h2;     // (S, N, Fe)  SwiGLU
  DevPtr shared_h_act;  // (S, N, Fe)
};

namespace {

using LP = Transformer::LayerParams;
using LA = Transformer::LayerActs;

// The member of each ParamRole / BufferRole, in role order.
// The expert roles have no member of their own (null here): they bind into
// LayerParams::experts (kExpertField).
constexpr DevPtr LP::*kParamField[kParamRoles] = {
    &LP::ln1_w, &LP::ln1_b, &LP::q_w,   &LP::q_b,   &LP::k_w,  &LP::k_b,
    &LP::v_w,   &LP::v_b,   &LP::o_w,   &LP::o_b,   &LP::ln2_w, &LP::ln2_b,
    &LP::fc_w,  &LP::fc_b,  &LP::up_w,  &LP::proj_w, &LP::proj_b, &LP::router_w,
    nullptr,    nullptr,    nullptr,    nullptr,    nullptr};
constexpr int kFirstExpertRole = static_cast<int>(ParamRole::kExpertInW);
constexpr DevPtr Transformer::ExpertParams::*kExpertField[kParamRoles - kFirstExpertRole] = {
    &Transformer::ExpertParams::in_w, &Transformer::ExpertParams::in_b, &Transformer::ExpertParams::up_w, &Transformer::ExpertParams::out_w,
    &Transformer::ExpertParams::out_b};
constexpr DevPtr LA::*kBufferField[kBufferRoles] = {
    &LA::ln1,  &LA::ln1_mean, &LA::ln1_rstd, &LA::q,        &LA::k,        &LA::v,
    &LA::att_state, &LA::atty, &LA::res2,    &LA::ln2,      &LA::ln2_mean, &LA::ln2_rstd,
    &LA::h1,   &LA::h2,       &LA::h_act,    &LA::router_probs, &LA::router_lse,
    &LA::moe_weights, &LA::moe_experts, &LA::moe_order, &LA::moe_position, &LA::moe_x,
    &LA::moe_h1, &LA::moe_h2, &LA::moe_h_act, &LA::moe_y, &LA::shared_h1, &LA::shared_h2,
    &LA::shared_h_act};

}  // namespace

std::vector<int> stage_layer_counts(int n_layers, int pp, const std::vector<int>& stage_layers) {
  if (!stage_layers.empty()) return stage_layers;
  std::vector<int> counts(static_cast<size_t>(pp), n_layers / pp);
  for (int s = 0; s < n_layers % pp; ++s) counts[static_cast<size_t>(s)]++;
  return counts;
}

// ---- parameters -------------------------------------------------------------------------

std::vector<float> Transformer::initial_value(const TransformerConfig& c, const ParamInfo& p,
                                              uint64_t seed) {
  // The rule is the parameter's model description row's (model/model_description.h).
  std::vector<float> host(static_cast<size_t>(p.numel()), 0.0f);
  if (p.init == InitKind::kZeros) return host;
  if (p.init == InitKind::kOnes) {
    std::fill(host.begin(), host.end(), 1.0f);
    return host;
  }
  const float std = p.init == InitKind::kResidualNormal
                        ? c.init_std / std::sqrt(2.0f * static_cast<float>(c.n_layers))
                        : c.init_std;
  const uint64_t key = rng_key(seed, hash_name(p.name));
  // Padded vocabulary rows stay zero: they never receive a gradient either.
  const bool vocab_rows = p.init == InitKind::kVocabNormal;
  const int64_t rows = p.local_shape[0];
  const int64_t cols = p.local_shape.rank() == 2 ? p.local_shape[1] : 1;
  const int64_t global_cols = p.shape.rank() == 2 ? p.shape[1] : 1;
  const int64_t row0 = p.split_dim == 0 ? p.split_offset : 0;
  const int64_t col0 = p.split_dim == 1 ? p.split_offset : 0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t global_row = row0 + i;
    if (vocab_rows && global_row >= c.vocab_size) continue;
    for (int64_t j = 0; j < cols; ++j) {
      const uint64_t index = static_cast<uint64_t>(global_row * global_cols + col0 + j);
      host[static_cast<size_t>(i * cols + j)] = std * normal_at(key, index);
    }
  }
  return host;
}

// ---- construction ----------------------------------------------------------------------

Transformer::Transformer(const TransformerConfig& config, Ops& ops, int micro_batch_size,
                         DType compute)
    : config_(config), ops_(ops), compute_dtype_(compute), tp_(ops, nullptr, 0, 1) {
  init_partition(nullptr, micro_batch_size, 1);
}

Transformer::Transformer(const TransformerConfig& config, Ops& ops, const ModelPartition& part,
                         Communicator* tp, ParamStore* store, int micro_batch_size, int num_slots,
                         DType compute, Recompute recompute, Communicator* cp,
                         Communicator* ep, bool pooled_activations)
    : config_(config),
      ops_(ops),
      part_(part),
      compute_dtype_(compute),
      recompute_(recompute),
      tp_(ops, tp, part.tp_rank, part.tp_size, part.sequence_parallel),
      pooled_activations_(pooled_activations) {
  if (part.ep_size > 1) {
    TRIDENT_CHECK_MSG(ep != nullptr && ep->size() == part.ep_size && ep->rank() == part.ep_rank,
                      "expert parallelism: the model needs the ep group of its partition (ep " +
                          std::to_string(part.ep_size) + ", rank " + std::to_string(part.ep_rank) +
                          ")");
    ep_ = ep;
  }
  init_partition(store, micro_batch_size, num_slots);
  if (part_.cp_size > 1) {
    TRIDENT_CHECK_MSG(cp != nullptr && cp->size() == part_.cp_size && cp->rank() == part_.cp_rank,
                      "context parallelism: the model needs the cp group of its partition (cp " +
                          std::to_string(part_.cp_size) + ", rank " +
                          std::to_string(part_.cp_rank) + ")");
    ring_ = std::make_unique<RingAttention>(ops_, *cp, micro_batch_size, cp_.chunk, heads_,
                                            kv_heads_, config_.head_dim, compute_dtype_);
  }
}

Transformer::~Transformer() = default;

void Transformer::init_partition(ParamStore* store, int micro_batch_size, int num_slots) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(c.head_dim > 0 && c.padded_vocab >= c.vocab_size,
                    "TransformerConfig must be finalize()d");
  TRIDENT_CHECK(micro_batch_size > 0 && num_slots >= 0);
  if (part_.layer_end < 0) part_.layer_end = c.n_layers;
  // The local rows of each sequence: all of them, or this cp rank's two chunks.
  if (part_.cp_size > 1) cp_ = cp_chunks(c.seq_len, part_.cp_size, part_.cp_rank);
  seq_rows_ = part_.cp_size > 1 ? cp_.rows() : c.seq_len;
  micro_batch_size_ = micro_batch_size;
  num_slots_ = num_slots;
  n_local_layers_ = part_.layer_end - part_.layer_begin;
  // The tensor-parallel layers (parallel/tensor_parallel.h); with tp = 1 each is the plain
  // Ops call.
  const int C = c.d_model, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  heads_ = tp_.local(c.n_heads, "n_heads");
  kv_heads_ = tp_.local(c.n_kv_heads, "n_kv_heads");
  ff_ = tp_.local(c.d_ff, "d_ff");
  q_ = ColumnParallelLinear(tp_, C, q_dim, "attn.q");
  k_ = ColumnParallelLinear(tp_, C, kv_dim, "attn.k");
  v_ = ColumnParallelLinear(tp_, C, kv_dim, "attn.v");
  qkv_ = ColumnParallelLinear(tp_, C, q_dim + 2 * kv_dim, "attn.qkv");
  fused_qkv_ = c.family().rope() && fused_qkv_from_env();
  o_ = RowParallelLinear(tp_, q_dim, C, "attn.o");
  fc_ = ColumnParallelLinear(tp_, C, c.d_ff, "mlp.fc");  // GELU mlp.fc, SwiGLU mlp.gate
  up_ = ColumnParallelLinear(tp_, C, c.d_ff, "mlp.up");  // SwiGLU only
  proj_ = RowParallelLinear(tp_, c.d_ff, C, "mlp.out");  // GELU mlp.proj, SwiGLU mlp.down
  head_ = ColumnParallelLinear(tp_, C, c.padded_vocab, "lm_head");
  embedding_ = VocabParallelEmbedding(tp_, c.padded_vocab, C);
  xent_ = VocabParallelCrossEntropy(tp_, c.vocab_size, c.padded_vocab);
  vocab_local_ = head_.out_local();

  layout_ = describe_params(c, part_);
  if (store == nullptr) {
    own_store_ = std::make_unique<ResidentParamStore>(layout_, ops_, compute_dtype_);
    store_ = own_store_.get();
  } else {
    store_ = store;
  }
  TRIDENT_CHECK_MSG(is_float_dtype(compute_dtype_) && store_->compute_dtype() == compute_dtype_,
                    std::string("model compute dtype ") + dtype_name(compute_dtype_) +
                        ", parameter store " + dtype_name(store_->compute_dtype()));
  // Tensor parallelism of a MoE model: the router and the experts are replicated over
  // the tp group and every tp rank runs the whole MoE block on the same full N rows (ln2
  // is replicated without sequence parallelism, gathered with it), so each computes the
  // complete gradient of its replicated weights and of ln2 (no reduction over tp, none
  // counted twice), and the ep exchanges go within each tp rank's own ep group. With
  // sequence parallelism the block's output is computed for all N rows, of which the
  // rank keeps its own (no reduce-scatter: every rank has the full sum), and backward
  // gathers the output gradient's rows and passes on its own rows of ln2's gradient.
  local_experts_ = c.moe() ? c.moe_experts / part_.ep_size : 0;
  first_expert_ = part_.ep_rank * local_experts_;
  layer_param_index_.assign(static_cast<size_t>(c.n_layers), std::vector<int>(kParamRoles, -1));
  layer_expert_index_.assign(static_cast<size_t>(c.n_layers), {});
  for (int l = part_.layer_begin; l < part_.layer_end; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    auto& experts = layer_expert_index_[static_cast<size_t>(l)];
    experts.assign(static_cast<size_t>(c.moe_experts + c.moe_shared_experts),
                   std::vector<int>(kParamRoles, -1));
    for (const LayerTensor& t : describe_layer_block(c, l).tensors) {
      if (t.role == ParamRole::kNone) continue;  // allocated, not read by this block
      // Expert parallelism: another ep rank's routed experts are not here.
      if (t.expert >= 0 && t.expert < c.moe_experts &&
          (t.expert < first_expert_ || t.expert >= first_expert_ + local_experts_)) {
        continue;
      }
      const ParamInfo* p = layout_.find(prefix + t.name);
      TRIDENT_CHECK_MSG(p != nullptr, prefix + t.name);
      auto& index = t.expert >= 0 ? experts[static_cast<size_t>(t.expert)]
                                  : layer_param_index_[static_cast<size_t>(l)];
      index[static_cast<size_t>(t.role)] = static_cast<int>(p - layout_.params.data());
    }
  }
  if (c.moe()) {
    // At ep > 1 also the received rows' counts (ep_exchange_counts).
    moe_counts_.assign(static_cast<size_t>(num_slots_) * n_local_layers_,
                       std::vector<int>(static_cast<size_t>(c.moe_experts * (ep_ ? 2 : 1)), 0));
    moe_stats_.counts.assign(static_cast<size_t>(n_local_layers_),
                             std::vector<int64_t>(static_cast<size_t>(c.moe_experts), 0));
  }
  allocate_activations();
  slot_info_.assign(static_cast<size_t>(num_slots_), SlotInfo{});
  loss_sum_ = DeviceBuffer(ops_, sizeof(double));  // zero-filled
}

void Transformer::allocate_activations() {
  const auto& c = config_;
  if (num_slots_ == 0) return;  // cache mode only: forward_cached brings its buffers
  ActivationShape shape;
  shape.micro_batch_size = micro_batch_size_;
  shape.tp_size = tp_.size();
  shape.sequence_parallel = tp_.sequence_parallel();
  shape.last_stage = part_.last_stage();
  shape.compute = compute_dtype_;
  shape.recompute = recompute_;
  shape.cp_size = part_.cp_size;
  shape.ep_size = part_.ep_size;
  // Ring attention's state is its row log-sum-exp (RingAttention::lse_elems, f32).
  shape.attention_state_bytes =
      part_.cp_size > 1
          ? static_cast<double>(micro_batch_size_) * heads_ * seq_rows_ * sizeof(float)
          : static_cast<double>(ops_.attention_state_bytes(micro_batch_size_, c.seq_len, heads_,
                                                           kv_heads_, c.head_dim, compute_dtype_));
  const ActivationDescription d = describe_activations(c, shape);
  TRIDENT_CHECK(d.globals.size() == kSlotGlobals && d.scratch.size() == kScratchCount);
  auto bytes_of = [](const BufferDesc& b) { return static_cast<size_t>(b.bytes); };

  // One slot: the globals, then x_0..x_nl, then the layer buffers of each local layer
  // (those recomputation shares are not reserved per slot).
  Arena slot_arena;
  slot_offsets_.clear();
  slot_dtypes_.clear();
  auto reserve = [&](const BufferDesc& b, bool reserved) {
    const size_t bytes = reserved ? bytes_of(b) : 0;
    slot_offsets_.push_back(bytes ? slot_arena.reserve(bytes) : kAbsent);
    slot_dtypes_.push_back(b.dtype);
  };
  for (const BufferDesc& b : d.globals) reserve(b, true);
  for (int l = 0; l <= n_local_layers_; ++l) reserve(d.residual, true);
  for (int l = 0; l < n_local_layers_; ++l) {
    for (const BufferDesc& b : d.layer) reserve(b, !b.shared);
  }
  act_bytes_per_slot_ = (slot_arena.total_bytes() + Arena::kAlignment - 1) / Arena::kAlignment *
                        Arena::kAlignment;
  if (!pooled_activations_) {
    activations_ = DeviceBuffer(ops_, act_bytes_per_slot_ * static_cast<size_t>(num_slots_));
    act_base_ = activations_.get();
    act_stride_ = act_bytes_per_slot_;
  }

  Arena scratch_arena;
  scratch_offsets_.clear();
  scratch_dtypes_.clear();
  for (const BufferDesc& b : d.scratch) {
    scratch_offsets_.push_back(bytes_of(b) ? scratch_arena.reserve(bytes_of(b)) : kAbsent);
    scratch_dtypes_.push_back(b.dtype);
  }
  scratch_ = DeviceBuffer(ops_, scratch_arena.total_bytes());

  Arena shared_arena;
  shared_offsets_.clear();
  buffer_roles_.clear();
  for (const BufferDesc& b : d.layer) {
    const size_t bytes = b.shared && n_local_layers_ > 0 ? bytes_of(b) : 0;
    shared_offsets_.push_back(bytes ? shared_arena.reserve(bytes) : kAbsent);
    buffer_roles_.push_back(b.role);
  }
  shared_ = shared_arena.total_bytes() ? DeviceBuffer(ops_, shared_arena.total_bytes())
                                       : DeviceBuffer();
}

void Transformer::share_activations(std::span<Transformer* const> models) {
  TRIDENT_CHECK(!models.empty());
  size_t stride = 0;
  for (const Transformer* m : models) {
    TRIDENT_CHECK_MSG(m->pooled_activations_ && m->num_slots_ == models[0]->num_slots_,
                      "share_activations: every model must be built pooled_activations with "
                      "the same num_slots");
    stride = std::max(stride, m->act_bytes_per_slot_);
  }
  Transformer& owner = *models[0];
  owner.activations_ =
      DeviceBuffer(owner.ops_, stride * static_cast<size_t>(owner.num_slots_));
  for (Transformer* m : models) {
    m->act_base_ = owner.activations_.get();
    m->act_stride_ = stride;
  }
}

DevPtr Transformer::act(int slot, int index) const {
  const size_t off = slot_offsets_[static_cast<size_t>(index)];
  if (off == kAbsent) return DevPtr();
  TRIDENT_CHECK_MSG(!act_base_.is_null(), "pooled activations before share_activations");
  return act_base_.byte_offset(act_stride_ * static_cast<size_t>(slot) + off)
      .as(slot_dtypes_[static_cast<size_t>(index)]);
}

DevPtr Transformer::scratch(int index) const {
  const size_t off = scratch_offsets_[static_cast<size_t>(index)];
  return off == kAbsent ? DevPtr()
                        : scratch_.get().byte_offset(off).as(scratch_dtypes_[static_cast<size_t>(index)]);
}

namespace {
inline int x_index(int local_layer) { return kSlotGlobals + local_layer; }
}  // namespace

void Transformer::acquire_layer(int layer, Phase phase) {
  store_->acquire(1 + layer, phase);
  if (ep_ && config_.moe_layer(layer)) {
    store_->acquire(moe_expert_group(config_.n_layers, part_.ep_size, layer), phase);
  }
}

void Transformer::release_layer(int layer, Phase phase) {
  if (ep_ && config_.moe_layer(layer)) {
    store_->release(moe_expert_group(config_.n_layers, part_.ep_size, layer), phase);
  }
  store_->release(1 + layer, phase);
}

Transformer::LayerParams Transformer::layer_params(int layer, DevPtr base,
                                                   DevPtr expert_base) const {
  const auto& idx = layer_param_index_[static_cast<size_t>(layer)];
  LayerParams p;
  // A tensor's place in its group's buffer (the layer's, or its routed experts').
  auto at = [&](int i) {
    const ParamInfo& info = layout_.params[static_cast<size_t>(i)];
    const size_t start = layout_.groups[static_cast<size_t>(info.group)].offset;
    return (info.group == 1 + layer ? base : expert_base) + (info.offset - start);
  };
  for (size_t r = 0; r < idx.size(); ++r) {
    if (idx[r] < 0) continue;  // absent in this family: stays null
    p.*kParamField[r] = at(idx[r]);
  }
  for (const std::vector<int>& expert : layer_expert_index_[static_cast<size_t>(layer)]) {
    ExpertParams e;
    for (size_t r = kFirstExpertRole; r < expert.size(); ++r) {
      if (expert[r] >= 0) e.*kExpertField[r - kFirstExpertRole] = at(expert[r]);
    }
    p.experts.push_back(e);
  }
  return p;
}

namespace {

// The block's view of buffers listed in describe_block order: buffer i (role roles[i]) is
// ptr_of(i).
template <class PtrOf>
Transformer::LayerActs bind_layer_acts(const std::vector<BufferRole>& roles, PtrOf ptr_of) {
  Transformer::LayerActs a;
  for (size_t i = 0; i < roles.size(); ++i) {
    if (roles[i] == BufferRole::kNone) continue;  // allocated, not read by this block
    a.*kBufferField[static_cast<size_t>(roles[i])] = ptr_of(i);
  }
  return a;
}

}  // namespace

Transformer::LayerActs Transformer::layer_acts(int slot, int local_layer) const {
  const size_t count = buffer_roles_.size();
  const int base = kSlotGlobals + n_local_layers_ + 1 + local_layer * static_cast<int>(count);
  return bind_layer_acts(buffer_roles_, [&](size_t i) {
    const size_t shared_off = shared_offsets_[i];
    if (shared_off != kAbsent) {  // recomputed: one set for every layer and slot
      const DType dtype = slot_dtypes_[static_cast<size_t>(base) + i];
      return shared_.get().byte_offset(shared_off).as(dtype);
    }
    return act(slot, base + static_cast<int>(i));
  });
}

DevPtr Transformer::group_param(int group, const char* name) {
  const ParamInfo* p = layout_.find(name);
  TRIDENT_CHECK_MSG(p != nullptr && p->group == group, name);
  return store_->params(group) + (p->offset - layout_.groups[static_cast<size_t>(group)].offset);
}

DevPtr Transformer::group_grad(int group, const char* name) {
  const ParamInfo* p = layout_.find(name);
  TRIDENT_CHECK_MSG(p != nullptr && p->group == group, name);
  return store_->grads(group) + (p->offset - layout_.groups[static_cast<size_t>(group)].offset);
}

size_t Transformer::boundary_floats() const {
  return static_cast<size_t>(tp_.local_rows(micro_batch_size_ * seq_rows_)) *
         config_.d_model;
}

Transformer::NormGrads Transformer::norm_grad_targets(const NormGrads& params) {
  if (!tp_.sequence_parallel()) return params;
  const size_t C = config_.d_model;
  DevPtr buf = scratch(kNormGrads);
  NormGrads targets{};
  size_t used = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]) targets[i] = buf + C * used++;
  }
  zero_elements(buf, used * C);
  return targets;
}

void Transformer::finish_norm_grads(const NormGrads& params, const NormGrads& targets,
                                    const char* label) {
  if (!tp_.sequence_parallel()) return;
  const size_t C = config_.d_model;
  size_t used = 0;
  for (const DevPtr& p : params) used += p ? 1 : 0;
  tp_.reduce_sequence_grads(scratch(kNormGrads), used * C, label);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]) ops_.accumulate(params[i], targets[i], C);
  }
}

// ---- resident-store conveniences ---------------------------------------------------------

DevPtr Transformer::param_data() {
  auto* resident = dynamic_cast<ResidentParamStore*>(store_);
  TRIDENT_CHECK_MSG(resident != nullptr, "param_data() needs a resident parameter store");
  return resident->param_data();
}

DevPtr Transformer::grad_data() {
  auto* resident = dynamic_cast<ResidentParamStore*>(store_);
  TRIDENT_CHECK_MSG(resident != nullptr, "grad_data() needs a resident parameter store");
  return resident->grad_data();
}

void Transformer::init_weights(uint64_t seed) {
  for (const auto& p : layout_.params) {
    std::vector<float> host = initial_value(config_, p, seed);
    set_param(p, host.data());
  }
  zero_grads();
}

void Transformer::set_param(const ParamInfo& param, const float* host) {
  ops_.upload_floats(param_data() + param.offset, host, static_cast<size_t>(param.numel()));
}

void Transformer::get_param(const ParamInfo& param, float* host) const {
  auto* self = const_cast<Transformer*>(this);
  ops_.download_floats(host, self->param_data() + param.offset,
                       static_cast<size_t>(param.numel()));
}

std::vector<float> Transformer::params_to_host() const {
  std::vector<float> host(num_param_floats());
  ops_.download_floats(host.data(), const_cast<Transformer*>(this)->param_data(), host.size());
  return host;
}

std::vector<float> Transformer::grads_to_host() const {
  std::vector<float> host(num_param_floats());
  ops_.download(host.data(), const_cast<Transformer*>(this)->grad_data(),
                host.size() * sizeof(float));
  return host;
}

void Transformer::params_from_host(const std::vector<float>& host) {
  TRIDENT_CHECK(host.size() == num_param_floats());
  ops_.upload_floats(param_data(), host.data(), host.size());
}

void Transformer::zero_grads() { zero_elements(grad_data(), num_param_floats()); }

void Transformer::zero_elements(DevPtr p, size_t n) { ops_.zero(p, n * dtype_size(p.dtype())); }

void Transformer::check_slots(const char* call) const {
  TRIDENT_CHECK_MSG(num_slots_ > 0, std::string(call) +
                                        ": this model has no activation slots (num_slots 0: "
                                        "built for forward_cached only)");
}

std::vector<float> Transformer::logits_to_host() const {
  check_slots("logits_to_host");
  const SlotInfo& s = slot_info_[0];
  const size_t n = static_cast<size_t>(s.B) * s.T * static_cast<size_t>(vocab_local_);
  std::vector<float> host(n);
  ops_.download_floats(host.data(), act(0, kLogits), n);
  return host;
}

// ---- forward -----------------------------------------------------------------------------

float Transformer::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  TRIDENT_CHECK_MSG(part_.first_stage() && part_.last_stage(),
                    "forward() runs a whole model; pipeline stages use forward_stage()");
  if (targets) reset_loss_sum();
  forward_stage(0, tokens, targets, B, T);
  return targets ? static_cast<float>(download_loss_sum()) : 0.0f;
}

double Transformer::download_loss_sum() {
  double host = 0.0;
  ops_.download(&host, loss_sum_.get(), sizeof(double));
  reset_loss_sum();
  return host;
}

void Transformer::reset_loss_sum() { ops_.zero(loss_sum_.get(), sizeof(double)); }

void Transformer::backward(float loss_scale) { backward_stage(0, loss_scale); }

DevPtr Transformer::input_activation(int slot) { return act(slot, x_index(0)); }
DevPtr Transformer::output_activation(int slot) { return act(slot, x_index(n_local_layers_)); }
DevPtr Transformer::output_grad() { return scratch(kDx); }
DevPtr Transformer::input_grad() { return scratch(kDx); }

void Transformer::forward_stage(int slot, const int32_t* tokens, const int32_t* targets, int B,
                                int T) {
  const auto& c = config_;
  check_slots("forward_stage");
  // Ring attention is built for one shape: whole micro-batches of this rank's rows.
  const bool ring_shape = !ring_ || (B == micro_batch_size_ && T == seq_rows_);
  TRIDENT_CHECK_MSG(slot >= 0 && slot < num_slots_ && B >= 1 && B <= micro_batch_size_ &&
                        T >= 1 && T <= seq_rows_ && ring_shape,
                    "slot=" + std::to_string(slot) + " B=" + std::to_string(B) +
                        " T=" + std::to_string(T) +
                        (ring_ ? " (context parallelism: B = micro_batch_size, T = seq_len / "
                                 "cp = " + std::to_string(seq_rows_) + ")"
                               : std::string()));
  const int N = B * T;
  TRIDENT_CHECK_MSG(!tp_.sequence_parallel() || N % tp_.size() == 0,
                    "sequence parallelism: B*T=" + std::to_string(N) +
                        " token rows do not split over tp " + std::to_string(tp_.size()));
  SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
  info = SlotInfo{B, T, false};
  DevPtr x0 = act(slot, x_index(0));
  if (part_.first_stage()) {
    DevPtr d_tokens = act(slot, kTokens).as(DType::kI32);
    ops_.upload(d_tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
    store_->acquire(0, Phase::kForward);
    DevPtr wte = group_param(0, "wte");
    DevPtr wpe = c.family().learned_positions() ? group_param(0, "wpe") : DevPtr();
    if (wpe && ring_) {  // the table of this rank's positions: its two chunks' rows of wpe
      const DevPtr table = scratch(kPositions);
      const size_t chunk = static_cast<size_t>(cp_.chunk) * c.d_model;
      const size_t bytes = chunk * dtype_size(wpe.dtype());
      ops_.copy(table, wpe + static_cast<size_t>(cp_.first_pos()) * c.d_model, bytes);
      ops_.copy(table + chunk, wpe + static_cast<size_t>(cp_.second_pos()) * c.d_model, bytes);
      wpe = table;
    }
    embedding_.forward(x0, d_tokens, wte, wpe, B, T, scratch(kGather));
    store_->release(0, Phase::kForward);
  }
  if (c.moe() && n_local_layers_ > 0) moe_stats_.micro_batches++;
  for (int l = 0; l < n_local_layers_; ++l) {
    const int layer = part_.layer_begin + l;
    acquire_layer(layer, Phase::kForward);
    layer_forward(slot, layer, act(slot, x_index(l)), act(slot, x_index(l + 1)), B, T);
    release_layer(layer, Phase::kForward);
  }
  if (!part_.last_stage()) return;
  if (targets) {
    ops_.upload(act(slot, kTargets), targets, static_cast<size_t>(N) * sizeof(int32_t));
  }
  info.has_targets = targets != nullptr;
  head_forward(slot, B, T, targets != nullptr);
  if (targets) ops_.loss_accumulate(loss_sum_.as(DType::kF64), act(slot, kLosses), N);
}

void Transformer::layer_forward(int slot, int layer, DevPtr x_in, DevPtr x_out, int B, int T,
                                bool recomputing) {
  const int local = layer - part_.layer_begin;
  MoeStep moe;
  if (config_.moe()) {
    moe.counts = &moe_counts_[static_cast<size_t>(slot * n_local_layers_ + local)];
    moe.local_layer = local;
    moe.record = !recomputing;
  }
  block_forward(layer, layer_acts(slot, local), x_in, x_out, B, T, nullptr, &moe);
}

// ---- mixture of experts ------------------------------------------------------------------

void Transformer::set_moe_loss_coefs(float aux, float z) {
  moe_aux_coef_ = aux;
  moe_z_coef_ = z;
}

Transformer::MoeStats Transformer::take_moe_stats() {
  MoeStats out = moe_stats_;
  moe_stats_.aux_loss = moe_stats_.z_loss = 0;
  moe_stats_.micro_batches = 0;
  for (std::vector<int64_t>& layer : moe_stats_.counts) std::fill(layer.begin(), layer.end(), 0);
  return out;
}

void Transformer::moe_forward(const LayerParams& p, const LayerActs& a, DevPtr ln2, DevPtr x_out,
                              int N, const MoeStep& step) {
  const auto& c = config_;
  const int C = c.d_model, E = c.moe_experts, K = c.moe_top_k, Fe = c.moe_d_ff;
  const auto work = [&](int index) {
    return step.scratch.empty() ? scratch(index) : step.scratch[static_cast<size_t>(index)];
  };
  DevPtr logits = work(kRouterLogits);
  DevPtr stats = work(kMoeStats);
  ops_.matmul_forward(logits, ln2, p.router_w, DevPtr(), N, C, E);
  ops_.moe_route_forward(a.moe_weights, a.moe_experts, a.router_probs, a.router_lse, stats, logits,
                         N, E, K);
  // The experts' row counts size the GEMMs below: one download per layer (on a GPU a
  // synchronisation per layer and micro-batch), which also brings the load-balancing
  // statistics.
  std::vector<float>& host = moe_host_stats_;
  host.resize(static_cast<size_t>(2 * E + 1));
  ops_.download(host.data(), stats, host.size() * sizeof(float));
  std::vector<int>& counts = *step.counts;
  for (int e = 0; e < E; ++e) counts[static_cast<size_t>(e)] = static_cast<int>(host[static_cast<size_t>(e)]);
  if (step.record) {
    // Switch Transformer's load-balancing loss, E * sum_e f_e * P_e, with f_e the fraction
    // of the N * K assignments expert e received and P_e its mean router probability
    // (1 when balanced), and the router z-loss, the mean of lse^2 (ST-MoE).
    double balance = 0;
    for (int e = 0; e < E; ++e) {
      const double f = host[static_cast<size_t>(e)] / (double(N) * K);
      balance += f * host[static_cast<size_t>(E + e)] / N;
      moe_stats_.counts[static_cast<size_t>(step.local_layer)][static_cast<size_t>(e)] +=
          counts[static_cast<size_t>(e)];
    }
    moe_stats_.aux_loss += E * balance;
    moe_stats_.z_loss += host[static_cast<size_t>(2 * E)] / N;
  }
  ops_.moe_dispatch(a.moe_order, a.moe_position, a.moe_experts, N, K, E);
  // The local experts' rows are in moe_x, expert-major; their outputs go to `out`.
  DevPtr out = a.moe_y;
  // Expert parallelism: the dispatched rows (in a scratch: backward's dmoe_x is free now)
  // go to their experts' ranks, are reordered expert-major into moe_x, run there, and
  // their outputs come back in dispatch order into moe_y.
  DevPtr sent;
  std::vector<size_t> send_n, recv_n;
  size_t total = 0, sent_total = 0;
  if (ep_) {
    sent = work(kDMoeX);
    out = work(kDMoeY);
    ops_.moe_gather_forward(sent, ln2, a.moe_order, N, K, C);
    ep_exchange_counts(counts);
    ep_row_counts(counts, static_cast<size_t>(C), &send_n, &recv_n);
    total = std::accumulate(recv_n.begin(), recv_n.end(), size_t{0});
    sent_total = std::accumulate(send_n.begin(), send_n.end(), size_t{0});
    ep_->all_to_all(CommBuf::device(sent, sent_total), send_n, CommBuf::device(out, total),
                    recv_n, {.label = "moe dispatch"});
    ep_reorder(a.moe_x, out, counts, static_cast<size_t>(C), /*to_experts=*/true);
  } else {
    ops_.moe_gather_forward(a.moe_x, ln2, a.moe_order, N, K, C);
  }
  size_t row = 0;  // the expert's first row
  for (int le = 0; le < local_experts_; ++le) {
    const int rows = local_expert_rows(counts, le);
    if (rows > 0) {
      expert_forward(p.experts[static_cast<size_t>(first_expert_ + le)], a.moe_x + row * C,
                     a.moe_h1 + row * Fe, a.moe_h2 ? a.moe_h2 + row * Fe : DevPtr(),
                     a.moe_h_act + row * Fe, out + row * C, rows);
    }
    row += static_cast<size_t>(rows);
  }
  if (ep_) {
    ep_reorder(sent, out, counts, static_cast<size_t>(C), /*to_experts=*/false);
    ep_->all_to_all(CommBuf::device(sent, total), recv_n,
                    CommBuf::device(a.moe_y, sent_total), send_n, {.label = "moe combine"});
  }
  ops_.moe_combine_forward(x_out, a.moe_y, a.moe_weights, a.moe_position, N, K, C);
  // The shared experts on every token, each added to the output (the backward scratch of
  // the dispatched rows holds the [N, C] result meanwhile: K * N rows >= N).
  const size_t nF = static_cast<size_t>(N) * Fe;
  for (int s = 0; s < c.moe_shared_experts; ++s) {
    DevPtr y = work(kDMoeY);
    expert_forward(p.experts[static_cast<size_t>(E + s)], ln2, a.shared_h1 + s * nF,
                   a.shared_h2 ? a.shared_h2 + s * nF : DevPtr(), a.shared_h_act + s * nF, y, N);
    ops_.add(x_out, x_out, y, static_cast<size_t>(N) * C);
  }
}

void Transformer::ep_exchange_counts(std::vector<int>& counts) {
  const int E = config_.moe_experts;
  const DevPtr d = scratch(kMoeEpCounts).as(DType::kI32);
  ops_.upload(d, counts.data(), static_cast<size_t>(E) * sizeof(int32_t));
  // Rank j gets the counts of its own experts, [j * El, (j + 1) * El).
  const std::vector<size_t> each(static_cast<size_t>(part_.ep_size),
                                 static_cast<size_t>(local_experts_));
  ep_->all_to_all(CommBuf::device(d, static_cast<size_t>(E)), each,
                  CommBuf::device(d + static_cast<size_t>(E), static_cast<size_t>(E)), each,
                  {.label = "moe counts"});
  ops_.download(counts.data() + E, d + static_cast<size_t>(E),
                static_cast<size_t>(E) * sizeof(int32_t));
}

int Transformer::local_expert_rows(const std::vector<int>& counts, int local_expert) const {
  if (!ep_) return counts[static_cast<size_t>(local_expert)];
  int rows = 0;
  for (int src = 0; src < part_.ep_size; ++src) {
    rows += counts[static_cast<size_t>(config_.moe_experts + src * local_experts_ + local_expert)];
  }
  return rows;
}

void Transformer::ep_row_counts(const std::vector<int>& counts, size_t width,
                                std::vector<size_t>* send, std::vector<size_t>* recv) const {
  const int E = config_.moe_experts, El = local_experts_;
  send->assign(static_cast<size_t>(part_.ep_size), 0);
  recv->assign(static_cast<size_t>(part_.ep_size), 0);
  for (int j = 0; j < part_.ep_size; ++j) {
    for (int le = 0; le < El; ++le) {
      (*send)[static_cast<size_t>(j)] += static_cast<size_t>(counts[static_cast<size_t>(j * El + le)]) * width;
      (*recv)[static_cast<size_t>(j)] +=
          static_cast<size_t>(counts[static_cast<size_t>(E + j * El + le)]) * width;
    }
  }
}

void Transformer::ep_reorder(DevPtr dst, DevPtr src, const std::vector<int>& counts, size_t width,
                             bool to_experts) {
  const int E = config_.moe_experts, El = local_experts_, ep = part_.ep_size;
  const size_t bytes_per_row = width * dtype_size(src.dtype());
  // Source-major offsets of each (source, local expert) block, in rows.
  std::vector<size_t> source_major(static_cast<size_t>(ep * El));
  size_t row = 0;
  for (int k = 0; k < ep * El; ++k) {
    source_major[static_cast<size_t>(k)] = row;
    row += static_cast<size_t>(counts[static_cast<size_t>(E + k)]);
  }
  size_t expert_major = 0;
  for (int le = 0; le < El; ++le) {
    for (int srcr = 0; srcr < ep; ++srcr) {
      const size_t k = static_cast<size_t>(srcr * El + le);
      const size_t rows = static_cast<size_t>(counts[static_cast<size_t>(E) + k]);
      if (rows > 0) {
        const size_t from = to_experts ? source_major[k] : expert_major;
        const size_t to = to_experts ? expert_major : source_major[k];
        ops_.copy(dst + to * width, src + from * width, rows * bytes_per_row);
      }
      expert_major += rows;
    }
  }
}

void Transformer::expert_forward(const ExpertParams& w, DevPtr x, DevPtr h1, DevPtr h2,
                                 DevPtr act, DevPtr y, int rows) {
  const int C = config_.d_model, Fe = config_.moe_d_ff;
  const size_t nF = static_cast<size_t>(rows) * Fe;
  ops_.matmul_forward(h1, x, w.in_w, w.in_b, rows, C, Fe);
  if (config_.family().swiglu()) {
    ops_.matmul_forward(h2, x, w.up_w, DevPtr(), rows, C, Fe);
    ops_.swiglu_forward(act, h1, h2, nF);
  } else {
    ops_.gelu_forward(act, h1, nF);
  }
  ops_.matmul_forward(y, act, w.out_w, w.out_b, rows, Fe, C);
}

void Transformer::expert_backward(const ExpertParams& w, const ExpertParams& g,
                                  DevPtr dx, DevPtr dy, DevPtr x, DevPtr h1, DevPtr h2,
                                  DevPtr act, DevPtr dh1, DevPtr dh2, DevPtr dact, int rows,
                                  GradWrite dx_write) {
  const int C = config_.d_model, Fe = config_.moe_d_ff;
  const size_t nF = static_cast<size_t>(rows) * Fe;
  // The first writer of each input gradient sets it when asked (as the dense MLP's).
  ops_.matmul_backward(dact, g.out_w, g.out_b, dy, act, w.out_w, rows, Fe, C, GradWrite::kSet);
  if (config_.family().swiglu()) {
    ops_.swiglu_backward(dh1, dh2, dact, h1, h2, nF);
    ops_.matmul_backward(dx, g.up_w, DevPtr(), dh2, x, w.up_w, rows, C, Fe, dx_write);
    dx_write = GradWrite::kAdd;
  } else {
    ops_.gelu_backward(dh1, dact, h1, nF);
  }
  ops_.matmul_backward(dx, g.in_w, g.in_b, dh1, x, w.in_w, rows, C, Fe, dx_write);
}

void Transformer::moe_backward(const LayerParams& p, const LayerParams& g, const LayerActs& a,
                               DevPtr ln2, DevPtr dx, DevPtr dln, int N,
                               const std::vector<int>& counts, float loss_scale) {
  const auto& c = config_;
  const int C = c.d_model, E = c.moe_experts, K = c.moe_top_k, Fe = c.moe_d_ff;
  const size_t NK = static_cast<size_t>(N) * K;
  DevPtr dy = scratch(kDMoeY), dxs = scratch(kDMoeX), dw = scratch(kDMoeWeights);
  DevPtr dh1 = scratch(kDMoeH1), dh2 = scratch(kDMoeH2), dact = scratch(kDMoeHAct);
  zero_elements(dy, NK * C);
  zero_elements(dw, NK);
  ops_.moe_combine_backward(dy, dw, dx, a.moe_y, a.moe_weights, a.moe_position, N, K, C);
  auto at = [](DevPtr p, size_t offset) { return p ? p + offset : DevPtr(); };
  // Expert parallelism: the outputs' gradients (dispatch order) go to the experts' ranks
  // (into dxs, source-major), are reordered expert-major into dy, run through the local
  // experts' backward into dxs, and the inputs' gradients come back (via dy) into dxs in
  // dispatch order. The experts' rows are those forward received (the same counts).
  size_t R = NK;  // the local experts' rows
  std::vector<size_t> send_n, recv_n;
  size_t total = 0;
  if (ep_) {
    ep_row_counts(counts, static_cast<size_t>(C), &send_n, &recv_n);
    total = std::accumulate(recv_n.begin(), recv_n.end(), size_t{0});
    ep_->all_to_all(CommBuf::device(dy, NK * C), send_n, CommBuf::device(dxs, total), recv_n,
                    {.label = "moe combine backward"});
    ep_reorder(dy, dxs, counts, static_cast<size_t>(C), /*to_experts=*/true);
    R = total / static_cast<size_t>(C);
  }
  // dxs and dact: set by each expert's rows (every one of the R rows is an expert's).
  zero_elements(dh1, R * Fe);
  if (dh2) zero_elements(dh2, R * Fe);
  size_t row = 0;
  for (int le = 0; le < local_experts_; ++le) {
    const int rows = local_expert_rows(counts, le);
    if (rows > 0) {
      const size_t xo = row * C, ho = row * Fe;
      const size_t e = static_cast<size_t>(first_expert_ + le);
      expert_backward(p.experts[e], g.experts[e], dxs + xo, dy + xo, a.moe_x + xo, a.moe_h1 + ho,
                      at(a.moe_h2, ho), a.moe_h_act + ho, dh1 + ho, at(dh2, ho), dact + ho, rows,
                      GradWrite::kSet);
    }
    row += static_cast<size_t>(rows);
  }
  TRIDENT_CHECK_MSG(row == R, "moe backward: the local experts' rows " + std::to_string(row) +
                                  " do not cover the " + std::to_string(R) + " rows set");
  if (ep_) {
    ep_reorder(dy, dxs, counts, static_cast<size_t>(C), /*to_experts=*/false);
    ep_->all_to_all(CommBuf::device(dy, total), recv_n, CommBuf::device(dxs, NK * C), send_n,
                    {.label = "moe dispatch backward"});
  }
  ops_.moe_gather_backward(dln, dxs, a.moe_position, N, K, C);
  // The shared experts (their [N, Fe] gradients in the same scratch, K * N rows >= N).
  const size_t nF = static_cast<size_t>(N) * Fe;
  for (int s = 0; s < c.moe_shared_experts; ++s) {
    zero_elements(dh1, nF);
    if (dh2) zero_elements(dh2, nF);
    // dln already holds the routed experts' (and earlier shared experts') gradient.
    expert_backward(p.experts[static_cast<size_t>(E + s)], g.experts[static_cast<size_t>(E + s)],
                    dln, dx, ln2, a.shared_h1 + s * nF, at(a.shared_h2, s * nF),
                    a.shared_h_act + s * nF, dh1, dh2, dact, N, GradWrite::kAdd);
  }
  // The router: the weights' gradient, the load-balancing loss's (a constant per expert,
  // its token fractions carrying no gradient) and the z-loss's, scaled like the LM loss.
  DevPtr prob_grad;
  if (moe_aux_coef_ != 0.0f) {
    std::vector<float>& host = moe_host_stats_;
    host.resize(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      const double f = counts[static_cast<size_t>(e)] / (double(N) * K);
      host[static_cast<size_t>(e)] =
          static_cast<float>(double(loss_scale) * moe_aux_coef_ * E * f / N);
    }
    prob_grad = scratch(kMoeProbGrad);
    ops_.upload(prob_grad, host.data(), static_cast<size_t>(E) * sizeof(float));
  }
  DevPtr dlogits = scratch(kRouterLogits);
  zero_elements(dlogits, static_cast<size_t>(N) * E);
  ops_.moe_route_backward(dlogits, dw, a.moe_weights, a.router_probs, a.router_lse, a.moe_experts,
                          prob_grad, loss_scale * moe_z_coef_ / static_cast<float>(N), N, E, K);
  ops_.matmul_backward(dln, g.router_w, DevPtr(), dlogits, ln2, p.router_w, N, C, E);
}

void Transformer::rope_segments(int B, int T, int pos,
                                const std::function<void(size_t, int, int, int)>& run) const {
  if (!ring_) return run(0, B, T, pos);
  // Each sequence's two chunks sit at their own positions (RoPE is per row, so the
  // rotations are those of one call over the whole sequence).
  for (int b = 0; b < B; ++b) {
    const size_t row0 = static_cast<size_t>(b) * T;
    run(row0, 1, cp_.chunk, cp_.first_pos());
    run(row0 + cp_.chunk, 1, cp_.chunk, cp_.second_pos());
  }
}

void Transformer::rope(DevPtr x, int B, int T, int H, int pos, bool backward) {
  const auto& c = config_;
  const size_t row = static_cast<size_t>(H) * c.head_dim;
  rope_segments(B, T, pos, [&](size_t row0, int b, int t, int offset) {
    const DevPtr p = x + row0 * row;
    if (backward) {
      ops_.rope_backward(p, b, t, H, c.head_dim, c.rope_theta, offset);
    } else {
      ops_.rope_forward(p, b, t, H, c.head_dim, c.rope_theta, offset);
    }
  });
}

void Transformer::qkv_permute(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int pos,
                              bool backward) {
  const auto& c = config_;
  const int HD = c.head_dim;
  const size_t qd = static_cast<size_t>(heads_) * HD, kvd = static_cast<size_t>(kv_heads_) * HD;
  const bool rotate = c.family().rope();
  rope_segments(B, T, pos, [&](size_t row0, int b, int t, int offset) {
    const DevPtr qs = q + row0 * qd, ks = k + row0 * kvd, vs = v + row0 * kvd;
    const DevPtr fused = qkv + row0 * (qd + 2 * kvd);
    if (backward) {
      ops_.qkv_merge(fused, qs, ks, vs, b, t, heads_, kv_heads_, HD, rotate, c.rope_theta, offset);
    } else {
      ops_.qkv_split(qs, ks, vs, fused, b, t, heads_, kv_heads_, HD, rotate, c.rope_theta, offset);
    }
  });
}

bool Transformer::fused_qkv_from_env() {
  const char* env = std::getenv("TRIDENT_FUSED_QKV");
  if (env == nullptr || *env == 0) return true;
  const std::string value = env;
  TRIDENT_CHECK_MSG(value == "0" || value == "1",
                    "TRIDENT_FUSED_QKV='" + value + "': must be 1 (one q/k/v GEMM, the default) "
                    "or 0 (three)");
  return value == "1";
}

DevPtr Transformer::adjacent_qkv(DevPtr q, DevPtr k, DevPtr v, int N) const {
  // The buffers hold the largest micro-batch's rows; its q | k | v span holds any N of
  // them as fused rows.
  const size_t rows = static_cast<size_t>(micro_batch_size_) * seq_rows_;
  const size_t HD = static_cast<size_t>(config_.head_dim);
  const bool adjacent = !q.is_null() && static_cast<size_t>(N) <= rows &&
                        k == q + rows * heads_ * HD && v == k + rows * kv_heads_ * HD;
  return adjacent ? q : DevPtr();
}

bool Transformer::qkv_fusable(const LayerParams& p, const LayerParams* g) const {
  if (!fused_qkv_) return false;
  const size_t C = static_cast<size_t>(config_.d_model), HD = static_cast<size_t>(config_.head_dim);
  const size_t qd = heads_ * HD, kvd = kv_heads_ * HD;
  // The three weights (and biases, when present) one after the other, so that they are
  // the one [q + 2 kv, C] weight of the fused GEMM.
  auto stacked = [&](const LayerParams& t) {
    const bool weights = t.k_w == t.q_w + qd * C && t.v_w == t.k_w + kvd * C;
    const bool biases = t.q_b.is_null()
                            ? t.k_b.is_null() && t.v_b.is_null()
                            : t.k_b == t.q_b + qd && t.v_b == t.k_b + kvd;
    return weights && biases;
  };
  return stacked(p) && (g == nullptr || stacked(*g));
}

void Transformer::block_forward(int layer, const LayerActs& a, DevPtr x_in, DevPtr x_out, int B,
                                int T, const CachedKv* cache, const MoeStep* moe) {
  const auto& c = config_;
  const LayerParams p =
      layer_params(layer, store_->params(1 + layer),
                   c.moe_layer(layer)
                       ? store_->params(moe_expert_group(c.n_layers, part_.ep_size, layer))
                       : DevPtr());
  const int N = B * T, C = c.d_model, F = ff_, HD = c.head_dim;
  const int n = tp_.local_rows(N);  // rows of x, the norms and res2 (N/tp: sequence parallel)
  const Architecture& arch = c.family();
  // Sequence parallelism's [N, C] workspace, else null (cache mode has no scratch).
  DevPtr work = tp_.sequence_parallel() ? scratch(kGather) : DevPtr();
  const int pos = cache != nullptr ? cache->pos : 0;  // of the first of the T tokens

  if (arch.layer_norm()) {
    ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, n, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(a.ln1, a.ln1_rstd, x_in, p.ln1_w, n, C, c.norm_eps);
  }
  DevPtr ln1 = tp_.gather_rows(a.ln1, work, N, C, "attn input");
  // The fused rows' buffer: cache mode's own; in the training step the backward scratch
  // dq | dk | dv, free in forward and exactly [N, q + 2 kv] when the three are adjacent.
  const DevPtr qkv =
      cache != nullptr ? cache->qkv : adjacent_qkv(scratch(kDq), scratch(kDk), scratch(kDv), N);
  if (!qkv.is_null() && qkv_fusable(p, nullptr)) {
    // One GEMM against the stacked weights, then its rows split into q, k and v, rotated
    // on the way (the pass RoPE makes anyway).
    qkv_.forward(qkv, ln1, p.q_w, p.q_b, N);
    qkv_permute(a.q, a.k, a.v, qkv, B, T, pos, false);
  } else {
    q_.forward(a.q, ln1, p.q_w, p.q_b, N);  // (biases null when the family has none)
    k_.forward(a.k, ln1, p.k_w, p.k_b, N);
    v_.forward(a.v, ln1, p.v_w, p.v_b, N);
    if (arch.rope()) {
      rope(a.q, B, T, heads_, pos, false);
      rope(a.k, B, T, kv_heads_, pos, false);
    }
  }
  if (cache == nullptr && ring_) {
    ring_->forward(a.atty, a.att_state.as(DType::kF32), a.q, a.k, a.v);
  } else if (cache == nullptr) {
    ops_.attention_forward(a.atty, a.att_state, a.q, a.k, a.v, B, T, heads_, kv_heads_, HD);
  } else {
    // The new keys and values join the cache at their positions; the queries attend over
    // every cached position up to their own.
    const size_t kv_dim = static_cast<size_t>(kv_heads_) * HD;
    const size_t bytes = static_cast<size_t>(T) * kv_dim * dtype_size(a.k.dtype());
    for (int b = 0; b < B; ++b) {
      const size_t row = (static_cast<size_t>(b) * cache->capacity + pos) * kv_dim;
      const size_t src = static_cast<size_t>(b) * T * kv_dim;
      ops_.copy(cache->keys + row, a.k + src, bytes);
      ops_.copy(cache->values + row, a.v + src, bytes);
    }
    ops_.attention_cached_forward(a.atty, a.q, cache->keys, cache->values, B, T, pos,
                                  cache->capacity, heads_, kv_heads_, HD);
  }
  // res2 = x_in + attn.o(atty), summed over the tp ranks' heads
  o_.forward(a.res2, a.atty, p.o_w, p.o_b, N, work);
  ops_.add(a.res2, a.res2, x_in, static_cast<size_t>(n) * C);

  if (arch.layer_norm()) {
    ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, n, C,
                           c.norm_eps);
  } else {
    ops_.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, p.ln2_w, n, C, c.norm_eps);
  }
  DevPtr ln2 = tp_.gather_rows(a.ln2, work, N, C, "mlp input");
  if (c.moe_layer(layer)) {
    TRIDENT_CHECK_MSG(moe != nullptr, "a mixture-of-experts layer needs its MoeStep");
    // Sequence parallelism: all N rows into the workspace's second half (its first holds
    // the gathered ln2), then this rank's rows.
    const DevPtr out = work ? work + static_cast<size_t>(N) * C : x_out;
    moe_forward(p, a, ln2, out, N, *moe);
    ops_.add(x_out, out + (work ? static_cast<size_t>(tp_.rank()) * n * C : 0), a.res2,
             static_cast<size_t>(n) * C);
    return;
  }
  if (!arch.swiglu()) {
    fc_.forward(a.h1, ln2, p.fc_w, p.fc_b, N);
    ops_.gelu_forward(a.h_act, a.h1, static_cast<size_t>(N) * F);
  } else {
    fc_.forward(a.h1, ln2, p.fc_w, p.fc_b, N);
    up_.forward(a.h2, ln2, p.up_w, DevPtr(), N);
    ops_.swiglu_forward(a.h_act, a.h1, a.h2, static_cast<size_t>(N) * F);
  }
  proj_.forward(x_out, a.h_act, p.proj_w, p.proj_b, N, work);
  ops_.add(x_out, x_out, a.res2, static_cast<size_t>(n) * C);
}

void Transformer::head_forward(int slot, int B, int T, bool with_loss) {
  const int N = B * T;
  DevPtr logits = act(slot, kLogits);
  final_norm_and_head(act(slot, x_index(n_local_layers_)), act(slot, kLnf), act(slot, kLnfMean),
                      act(slot, kLnfRstd), logits, N);
  if (!with_loss) return;

  xent_.forward(act(slot, kLosses), act(slot, kXentMax), act(slot, kXentSums), logits,
                act(slot, kTargets).as(DType::kI32), N);
}

void Transformer::final_norm_and_head(DevPtr xL, DevPtr lnf, DevPtr lnf_mean, DevPtr lnf_rstd,
                                      DevPtr logits, int N) {
  const auto& c = config_;
  const int L = c.n_layers, C = c.d_model, head_group = L + 1;
  const int n = tp_.local_rows(N);
  // A tied head in a one-stage model reads wte from the embedding group.
  const bool head_in_embeddings = c.tied() && part_.first_stage();
  store_->acquire(head_group, Phase::kForward);
  if (head_in_embeddings) store_->acquire(0, Phase::kForward);
  // The head reads all N rows of the final norm: with sequence parallelism this rank's
  // rows are normed in the workspace and gathered into kLnf (kept for the head's weight
  // gradient).
  DevPtr lnf_rows = tp_.sequence_parallel() ? scratch(kGather) : lnf;
  DevPtr lnf_w = group_param(head_group, "lnf.weight");
  if (c.family().layer_norm()) {
    ops_.layernorm_forward(lnf_rows, lnf_mean, lnf_rstd, xL, lnf_w,
                           group_param(head_group, "lnf.bias"), n, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(lnf_rows, lnf_rstd, xL, lnf_w, n, C, c.norm_eps);
  }
  if (tp_.sequence_parallel()) tp_.gather_rows(lnf_rows, lnf, N, C, "head input");
  DevPtr head = head_in_embeddings ? group_param(0, "wte")
                : c.tied()         ? group_param(head_group, "wte")
                                   : group_param(head_group, "lm_head.weight");
  head_.forward(logits, lnf, head, DevPtr(), N);
  if (head_in_embeddings) store_->release(0, Phase::kForward);
  store_->release(head_group, Phase::kForward);
}

// ---- cache mode ----------------------------------------------------------------------------

KvCache Transformer::make_kv_cache(int batch, int capacity, int max_new, bool all_logits) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(capacity >= 1 && capacity <= c.max_seq_len,
                    "KV cache capacity " + std::to_string(capacity) + " is not in [1, " +
                        std::to_string(c.max_seq_len) + "] (model.max_seq_len)");
  TRIDENT_CHECK_MSG(max_new >= 1 && max_new <= capacity,
                    "KV cache: max_new " + std::to_string(max_new) + " is not in [1, capacity " +
                        std::to_string(capacity) + "]");
  KvCacheShape shape;
  shape.batch = batch;
  shape.capacity = capacity;
  shape.max_new = max_new;
  shape.tp_size = tp_.size();
  shape.compute = compute_dtype_;
  shape.all_logits = all_logits;
  const KvCacheDescription d = describe_kv_cache(c, shape);
  KvCache cache;
  cache.batch_ = batch;
  cache.capacity_ = capacity;
  cache.max_new_ = max_new;
  cache.all_logits_ = all_logits;
  cache.layer_elements_ = static_cast<size_t>(d.keys.elements);
  const size_t layers = static_cast<size_t>(n_local_layers_);
  cache.keys_ = DeviceBuffer(ops_, std::max<size_t>(1, layers * static_cast<size_t>(d.keys.bytes)));
  cache.values_ =
      DeviceBuffer(ops_, std::max<size_t>(1, layers * static_cast<size_t>(d.values.bytes)));
  const std::vector<BufferDesc>& globals = d.forward.globals;
  Arena arena;
  std::vector<size_t> global_off, layer_off;
  auto reserve = [&](const BufferDesc& b) {
    return b.bytes > 0 ? arena.reserve(static_cast<size_t>(b.bytes)) : kAbsent;
  };
  for (const BufferDesc& b : globals) global_off.push_back(reserve(b));
  const size_t x0 = reserve(d.forward.residual), x1 = reserve(d.forward.residual);
  for (const BufferDesc& b : d.forward.layer) layer_off.push_back(reserve(b));
  std::vector<size_t> scratch_off;
  for (const BufferDesc& b : d.forward.scratch) scratch_off.push_back(reserve(b));
  cache.work_ = DeviceBuffer(ops_, std::max<size_t>(1, arena.total_bytes()));
  auto view = [&](size_t off, DType dtype) {
    return off == kAbsent ? DevPtr() : cache.work_.get().byte_offset(off).as(dtype);
  };
  for (size_t i = 0; i < globals.size(); ++i) {
    cache.globals_.push_back(view(global_off[i], globals[i].dtype));
  }
  cache.x_ = {view(x0, d.forward.residual.dtype), view(x1, d.forward.residual.dtype)};
  for (size_t i = 0; i < d.forward.layer.size(); ++i) {
    cache.layer_.push_back(view(layer_off[i], d.forward.layer[i].dtype));
    cache.roles_.push_back(d.forward.layer[i].role);
  }
  for (size_t i = 0; i < d.forward.scratch.size(); ++i) {
    cache.scratch_.push_back(view(scratch_off[i], d.forward.scratch[i].dtype));
  }
  cache.moe_counts_.assign(static_cast<size_t>(c.moe_experts), 0);
  return cache;
}

void Transformer::forward_cached(const int32_t* tokens, int B, int T, KvCache& cache) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(part_.first_stage() && part_.last_stage(),
                    "forward_cached runs a whole model: cache mode has no pipeline stages "
                    "(pp > 1 is not supported)");
  TRIDENT_CHECK_MSG(tp_.size() == 1,
                    "forward_cached: cache mode does not support tensor (or sequence) "
                    "parallelism, tp " + std::to_string(tp_.size()));
  TRIDENT_CHECK_MSG(!ring_, "forward_cached: cache mode does not support context parallelism, cp " +
                                std::to_string(part_.cp_size));
  TRIDENT_CHECK_MSG(cache.capacity_ > 0 && cache.layer_elements_ > 0,
                    "forward_cached needs a cache from make_kv_cache");
  TRIDENT_CHECK_MSG(B >= 1 && B <= cache.batch_ && T >= 1 && T <= cache.max_new_,
                    "forward_cached: B=" + std::to_string(B) + " T=" + std::to_string(T) +
                        " (the cache takes batch " + std::to_string(cache.batch_) +
                        ", max_new " + std::to_string(cache.max_new_) + ")");
  const int pos = cache.position_;
  TRIDENT_CHECK_MSG(pos + T <= cache.capacity_,
                    "KV cache full: " + std::to_string(pos) + " positions filled + " +
                        std::to_string(T) + " new tokens exceed its capacity of " +
                        std::to_string(cache.capacity_) + " positions");
  const int N = B * T, C = c.d_model;
  const auto global = [&](int g) { return cache.globals_[static_cast<size_t>(g)]; };
  DevPtr d_tokens = global(kTokens).as(DType::kI32);
  ops_.upload(d_tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
  store_->acquire(0, Phase::kForward);
  DevPtr wte = group_param(0, "wte");
  // Learned positions: wpe's rows pos.. are the table the embedding indexes by t.
  DevPtr wpe = c.family().learned_positions()
                   ? group_param(0, "wpe") + static_cast<size_t>(pos) * C
                   : DevPtr();
  embedding_.forward(cache.x_[0], d_tokens, wte, wpe, B, T, DevPtr());
  store_->release(0, Phase::kForward);

  const LayerActs a =
      bind_layer_acts(cache.roles_, [&](size_t i) { return cache.layer_[i]; });
  MoeStep moe;
  moe.counts = &cache.moe_counts_;
  moe.record = false;  // generation is no training step: no load statistics
  moe.scratch = cache.scratch_;
  for (int l = 0; l < n_local_layers_; ++l) {
    const int layer = part_.layer_begin + l;
    const size_t off = static_cast<size_t>(l) * cache.layer_elements_;
    const CachedKv kv{cache.keys_.as(compute_dtype_) + off, cache.values_.as(compute_dtype_) + off,
                      pos, cache.capacity_, cache.scratch_[kQkv]};
    store_->acquire(1 + layer, Phase::kForward);
    moe.local_layer = l;
    block_forward(layer, a, cache.x_[l % 2], cache.x_[(l + 1) % 2], B, T, &kv,
                  c.moe() ? &moe : nullptr);
    store_->release(1 + layer, Phase::kForward);
  }
  DevPtr xL = cache.x_[n_local_layers_ % 2];
  int rows = N;
  if (!cache.all_logits_ && T > 1) {
    // Only each sequence's last row goes through the head: gathered into the other
    // residual buffer (free by now).
    DevPtr last = cache.x_[(n_local_layers_ + 1) % 2];
    const size_t row_bytes = static_cast<size_t>(C) * dtype_size(xL.dtype());
    for (int b = 0; b < B; ++b) {
      ops_.copy(last + static_cast<size_t>(b) * C,
                xL + (static_cast<size_t>(b) * T + T - 1) * C, row_bytes);
    }
    xL = last;
  }
  if (!cache.all_logits_) rows = B;
  final_norm_and_head(xL, global(kLnf), global(kLnfMean), global(kLnfRstd), global(kLogits),
                      rows);
  cache.position_ = pos + T;
  cache.last_B_ = B;
  cache.last_T_ = T;
}

std::vector<float> Transformer::cached_logits_to_host(const KvCache& cache) const {
  TRIDENT_CHECK_MSG(cache.last_B_ > 0, "cached_logits_to_host needs a forward_cached first");
  const size_t rows = static_cast<size_t>(cache.last_B_) * (cache.all_logits_ ? cache.last_T_ : 1);
  std::vector<float> host(rows * static_cast<size_t>(vocab_local_));
  ops_.download_floats(host.data(), cache.globals_[kLogits], host.size());
  return host;
}

// ---- backward ----------------------------------------------------------------------------

void Transformer::backward_stage(int slot, float loss_scale) {
  const auto& c = config_;
  check_slots("backward_stage");
  SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
  const int B = info.B, T = info.T;
  TRIDENT_CHECK_MSG(B > 0, "backward_stage() needs a forward_stage() in slot " + std::to_string(slot));
  DevPtr dx = scratch(kDx);
  if (part_.last_stage()) {
    TRIDENT_CHECK_MSG(info.has_targets, "backward needs a forward with targets");
    head_backward(slot, loss_scale, B, T);  // leaves dLoss/dx_L in dx
    info.has_targets = false;                // the logits now hold gradients
  }
  for (int l = n_local_layers_ - 1; l >= 0; --l) {
    const int layer = part_.layer_begin + l;
    acquire_layer(layer, Phase::kBackward);
    if (recompute_ == Recompute::kFull) {
      // The layer's tensors were overwritten by later layers and slots: rerun its forward
      // from the kept input. Its output x_{l+1} is rewritten with the same values.
      layer_forward(slot, layer, act(slot, x_index(l)), act(slot, x_index(l + 1)), B, T,
                    /*recomputing=*/true);
    }
    layer_backward(slot, layer, act(slot, x_index(l)), dx, B, T, loss_scale);
    release_layer(layer, Phase::kBackward);
  }
  if (part_.first_stage()) {
    store_->acquire(0, Phase::kBackward);
    DevPtr d_tokens = act(slot, kTokens).as(DType::kI32);
    DevPtr dwpe = c.family().learned_positions() ? group_grad(0, "wpe") : DevPtr();
    if (dwpe && ring_) {  // this rank's positions' gradient, then added at their rows
      const DevPtr dtable = scratch(kDPositions);
      const size_t chunk = static_cast<size_t>(cp_.chunk) * c.d_model;
      zero_elements(dtable, 2 * chunk);
      embedding_.backward(group_grad(0, "wte"), dtable, dx, d_tokens, B, T, scratch(kGather));
      ops_.accumulate(dwpe + static_cast<size_t>(cp_.first_pos()) * c.d_model, dtable, chunk);
      ops_.accumulate(dwpe + static_cast<size_t>(cp_.second_pos()) * c.d_model, dtable + chunk,
                      chunk);
    } else {
      embedding_.backward(group_grad(0, "wte"), dwpe, dx, d_tokens, B, T, scratch(kGather));
    }
    store_->release(0, Phase::kBackward);
  }
}

void Transformer::head_backward(int slot, float loss_scale, int B, int T) {
  const auto& c = config_;
  const int L = c.n_layers, N = B * T, C = c.d_model, head_group = L + 1;
  const int n = tp_.local_rows(N);
  const bool head_in_embeddings = c.tied() && part_.first_stage();
  store_->acquire(head_group, Phase::kBackward);
  if (head_in_embeddings) store_->acquire(0, Phase::kBackward);
  DevPtr logits = act(slot, kLogits);
  DevPtr targets = act(slot, kTargets).as(DType::kI32);
  const float dloss = loss_scale / static_cast<float>(N);
  xent_.backward(logits, logits, act(slot, kXentMax), act(slot, kXentSums), targets, dloss, N);
  const char* head_name = c.tied() ? "wte" : "lm_head.weight";
  const int group = head_in_embeddings ? 0 : head_group;
  DevPtr dln_full = scratch(kDln);
  head_.backward(dln_full, group_grad(group, head_name), DevPtr(), logits, act(slot, kLnf),
                 group_param(group, head_name), N, GradWrite::kSet);
  DevPtr dln = tp_.reduce_column_input_grad(dln_full, scratch(kDlnLocal), N, C, "head dinput");
  DevPtr dx = scratch(kDx);
  zero_elements(dx, static_cast<size_t>(n) * C);
  DevPtr xL = act(slot, x_index(n_local_layers_));
  const bool layer_norm = c.family().layer_norm();
  const NormGrads grads = {group_grad(head_group, "lnf.weight"),
                           layer_norm ? group_grad(head_group, "lnf.bias") : DevPtr(), DevPtr(),
                           DevPtr()};
  const NormGrads into = norm_grad_targets(grads);
  if (layer_norm) {
    ops_.layernorm_backward(dx, into[0], into[1], dln, xL, group_param(head_group, "lnf.weight"),
                            act(slot, kLnfMean), act(slot, kLnfRstd), n, C);
  } else {
    ops_.rmsnorm_backward(dx, into[0], dln, xL, group_param(head_group, "lnf.weight"),
                          act(slot, kLnfRstd), n, C);
  }
  finish_norm_grads(grads, into, "lnf grads");
  if (head_in_embeddings) store_->release(0, Phase::kBackward);
  store_->release(head_group, Phase::kBackward);
}

void Transformer::layer_backward(int slot, int layer, DevPtr x_in, DevPtr dx, int B, int T,
                                 float loss_scale) {
  // On entry dx = dLoss/dx_out; on exit dx = dLoss/dx_in. Residual branches accumulate
  // straight into dx, since every backward op accumulates.
  const auto& c = config_;
  const int eg = moe_expert_group(c.n_layers, part_.ep_size, layer);
  const bool moe_layer = c.moe_layer(layer);  // else no expert group is held
  const LayerParams p = layer_params(layer, store_->params(1 + layer),
                                     moe_layer ? store_->params(eg) : DevPtr());
  const LayerParams g = layer_params(layer, store_->grads(1 + layer),
                                     moe_layer ? store_->grads(eg) : DevPtr());
  const LayerActs a = layer_acts(slot, layer - part_.layer_begin);
  const int N = B * T, C = c.d_model, F = ff_, HD = c.head_dim;
  const int n = tp_.local_rows(N);  // rows of dx, x, the norms and res2
  const int q_dim = heads_ * HD, kv_dim = kv_heads_ * HD;
  const size_t nF = static_cast<size_t>(N) * F, NC = static_cast<size_t>(N) * C;
  const Architecture& arch = c.family();
  DevPtr work = scratch(kGather);  // sequence parallelism's [N, C] workspace ([2N, C] with
                                   // experts), else null
  DevPtr dln_local = scratch(kDlnLocal);
  DevPtr dln_full = scratch(kDln);
  // Norm-weight gradients: ln2 then ln1 (summed over tp at the end with sequence
  // parallelism).
  const NormGrads norm_grads = {g.ln2_w, g.ln2_b, g.ln1_w, g.ln1_b};
  const NormGrads into = norm_grad_targets(norm_grads);
  DevPtr dq = scratch(kDq);
  DevPtr dk = scratch(kDk);
  DevPtr dv = scratch(kDv);
  DevPtr datty = scratch(kDatty);
  DevPtr dh1 = scratch(kDh1);
  DevPtr dh2 = scratch(kDh2);
  DevPtr dh_act = scratch(kDhAct);

  // MLP: x_out = res2 + proj(act(ln2(res2))).
  if (c.moe_layer(layer)) {
    zero_elements(dln_full, NC);
    const int local = layer - part_.layer_begin;
    // Sequence parallelism: the block's input gathered again and its output gradient's
    // rows gathered (the workspace's two halves); of ln2's gradient, complete for all N
    // rows on every rank, this rank's rows go on.
    const bool sp = tp_.sequence_parallel();
    DevPtr ln2 = tp_.gather_rows(a.ln2, work, N, C, "moe input (backward)");
    DevPtr dout = tp_.gather_rows(dx, sp ? work + NC : DevPtr(), N, C, "moe output grad");
    moe_backward(p, g, a, ln2, dout, dln_full, N,
                 moe_counts_[static_cast<size_t>(slot * n_local_layers_ + local)], loss_scale);
    DevPtr dln = dln_full + (sp ? static_cast<size_t>(tp_.rank()) * n * C : 0);
    if (arch.layer_norm()) {
      ops_.layernorm_backward(dx, into[0], into[1], dln, a.res2, p.ln2_w, a.ln2_mean,
                              a.ln2_rstd, n, C);
    } else {
      ops_.rmsnorm_backward(dx, into[0], dln, a.res2, p.ln2_w, a.ln2_rstd, n, C);
    }
  } else {
  // The first writer of each input gradient sets it (GradWrite::kSet: no zero-fill first).
  proj_.backward(dh_act, g.proj_w, g.proj_b, dx, a.h_act, p.proj_w, N, work, GradWrite::kSet);
  zero_elements(dh1, nF);
  // The MLP's input, gathered again for the weight gradients (sequence parallelism).
  DevPtr ln2 = tp_.gather_rows(a.ln2, work, N, C, "mlp input (backward)");
  if (!arch.swiglu()) {
    ops_.gelu_backward(dh1, dh_act, a.h1, nF);
    fc_.backward(dln_full, g.fc_w, g.fc_b, dh1, ln2, p.fc_w, N, GradWrite::kSet);
  } else {
    zero_elements(dh2, nF);
    ops_.swiglu_backward(dh1, dh2, dh_act, a.h1, a.h2, nF);
    fc_.backward(dln_full, g.fc_w, g.fc_b, dh1, ln2, p.fc_w, N, GradWrite::kSet);
    up_.backward(dln_full, g.up_w, DevPtr(), dh2, ln2, p.up_w, N);
  }
  DevPtr dln = tp_.reduce_column_input_grad(dln_full, dln_local, N, C, "mlp dinput");
  if (arch.layer_norm()) {
    ops_.layernorm_backward(dx, into[0], into[1], dln, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                            n, C);
  } else {
    ops_.rmsnorm_backward(dx, into[0], dln, a.res2, p.ln2_w, a.ln2_rstd, n, C);
  }
  }

  // Attention: res2 = x_in + o(attn(q, k, v)), q/k/v = linear(ln1(x_in))
  const size_t nq = static_cast<size_t>(N) * q_dim, nkv = static_cast<size_t>(N) * kv_dim;
  o_.backward(datty, g.o_w, g.o_b, dx, a.atty, p.o_w, N, work, GradWrite::kSet);
  zero_elements(dq, nq);
  zero_elements(dk, nkv);
  zero_elements(dv, nkv);
  if (ring_) {
    // Ring attention's state (the row log-sum-exp) is kept per layer even under selective
    // recomputation (describe_activations), so nothing is rerun here.
    ring_->backward(dq, dk, dv, datty, a.atty, a.att_state.as(DType::kF32), a.q, a.k, a.v);
  } else {
    if (recompute_ == Recompute::kSelective) {
      // The shared state holds the last attention forward's: rerun this layer's (q, k and
      // v are kept, after RoPE), rewriting atty with the same values.
      ops_.attention_forward(a.atty, a.att_state, a.q, a.k, a.v, B, T, heads_, kv_heads_, HD);
    }
    ops_.attention_backward(dq, dk, dv, datty, a.atty, a.att_state, a.q, a.k, a.v, B, T,
                            heads_, kv_heads_, HD);
  }
  DevPtr ln1 = tp_.gather_rows(a.ln1, work, N, C, "attn input (backward)");
  // The packed gradient's buffer: this layer's q | k | v activations, which nothing reads
  // after the attention backward above (every consumer of a.q, a.k, a.v ran), exactly
  // [N, q + 2 kv] when the three are adjacent.
  const DevPtr dqkv = adjacent_qkv(a.q, a.k, a.v, N);
  if (!dqkv.is_null() && qkv_fusable(p, &g)) {
    // dq, dk (rotated back) and dv packed into the fused rows: one GEMM for the input
    // gradient (set), one for the stacked weights' gradient.
    qkv_permute(dq, dk, dv, dqkv, B, T, 0, true);
    qkv_.backward(dln_full, g.q_w, g.q_b, dqkv, ln1, p.q_w, N, GradWrite::kSet);
  } else {
    if (arch.rope()) {
      rope(dq, B, T, heads_, 0, true);
      rope(dk, B, T, kv_heads_, 0, true);
    }
    q_.backward(dln_full, g.q_w, g.q_b, dq, ln1, p.q_w, N, GradWrite::kSet);
    k_.backward(dln_full, g.k_w, g.k_b, dk, ln1, p.k_w, N);
    v_.backward(dln_full, g.v_w, g.v_b, dv, ln1, p.v_w, N);
  }
  DevPtr dln_attn = tp_.reduce_column_input_grad(dln_full, dln_local, N, C, "attn dinput");
  if (arch.layer_norm()) {
    ops_.layernorm_backward(dx, into[2], into[3], dln_attn, x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd,
                            n, C);
  } else {
    ops_.rmsnorm_backward(dx, into[2], dln_attn, x_in, p.ln1_w, a.ln1_rstd, n, C);
  }
  finish_norm_grads(norm_grads, into, "norm grads");
}

}  // namespace trident
