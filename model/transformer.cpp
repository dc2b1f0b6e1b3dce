#include "model/transformer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "comm/communicator.h"
#include "core/check.h"
#include "core/rng.h"

namespace trident {

namespace {

constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The 17 per-layer tensors, in LayerParams order; gpt2 / llama name where they differ.
struct LayerTensor {
  const char* gpt2;
  const char* llama;
};
constexpr LayerTensor kLayerTensors[] = {
    {"ln1.weight", "ln1.weight"}, {"ln1.bias", nullptr},
    {"attn.q.weight", "attn.q.weight"}, {"attn.q.bias", nullptr},
    {"attn.k.weight", "attn.k.weight"}, {"attn.k.bias", nullptr},
    {"attn.v.weight", "attn.v.weight"}, {"attn.v.bias", nullptr},
    {"attn.o.weight", "attn.o.weight"}, {"attn.o.bias", nullptr},
    {"ln2.weight", "ln2.weight"}, {"ln2.bias", nullptr},
    {"mlp.fc.weight", "mlp.gate.weight"}, {"mlp.fc.bias", nullptr},
    {nullptr, "mlp.up.weight"},
    {"mlp.proj.weight", "mlp.down.weight"}, {"mlp.proj.bias", nullptr},
};
constexpr int kNumLayerTensors = 17;

// Per-slot activation buffers: the globals, then x_0..x_nl, then kLayerActs per layer.
enum SlotBuffer {
  kTokens, kTargets, kLnf, kLnfMean, kLnfRstd, kLogits, kLosses, kXentMax, kXentSums,
  kSlotGlobals
};
enum LayerAct {
  kLn1, kLn1Mean, kLn1Rstd, kQ, kK, kV, kAtt, kAtty, kRes2, kLn2, kLn2Mean, kLn2Rstd, kH1, kH2,
  kHAct, kLayerActs
};
// Backward scratch shared by all slots.
enum Scratch { kDx, kDln, kDq, kDk, kDv, kDatty, kDh1, kDh2, kDhAct, kScratchCount };

}  // namespace

std::vector<int> stage_layer_counts(int n_layers, int pp, const std::vector<int>& stage_layers) {
  if (!stage_layers.empty()) return stage_layers;
  std::vector<int> counts(static_cast<size_t>(pp), n_layers / pp);
  for (int s = 0; s < n_layers % pp; ++s) counts[static_cast<size_t>(s)]++;
  return counts;
}

// ---- parameter layout ------------------------------------------------------------------

ParamLayout Transformer::plan_params(const TransformerConfig& c, const ModelPartition& part) {
  TRIDENT_CHECK_MSG(c.head_dim > 0, "TransformerConfig must be finalize()d");
  const int L = c.n_layers, tp = part.tp_size, r = part.tp_rank;
  const int layer_end = part.layer_end < 0 ? L : part.layer_end;
  const int64_t C = c.d_model, F = c.d_ff, HD = c.head_dim;
  const int64_t q_dim = c.n_heads * HD, kv_dim = c.n_kv_heads * HD;
  const bool gpt2 = c.is_gpt2();
  ParamLayout layout;
  layout.groups.resize(static_cast<size_t>(L + 2));
  for (int g = 0; g < L + 2; ++g) layout.groups[static_cast<size_t>(g)].id = g;
  size_t cursor = 0;
  int current_group = -1;
  auto add = [&](int group, std::string name, Shape shape, int split_dim) {
    if (group != current_group) {  // groups are added in id order
      cursor = (cursor + 15) / 16 * 16;
      layout.groups[static_cast<size_t>(group)].offset = cursor;
      current_group = group;
    }
    ParamInfo p;
    p.decay = shape.rank() == 2;
    p.name = std::move(name);
    p.shape = shape;
    p.local_shape = shape;
    p.split_dim = split_dim;
    if (split_dim >= 0) {
      TRIDENT_CHECK_MSG(shape[split_dim] % tp == 0, p.name + " does not split over tp");
      p.local_shape[split_dim] = shape[split_dim] / tp;
      p.split_offset = p.local_shape[split_dim] * r;
    }
    p.group = group;
    p.offset = (cursor + 15) / 16 * 16;
    cursor = p.offset + static_cast<size_t>(p.local_shape.numel());
    auto& grp = layout.groups[static_cast<size_t>(group)];
    grp.params.push_back(static_cast<int>(layout.params.size()));
    grp.num_floats = (cursor - grp.offset + 15) / 16 * 16;
    layout.params.push_back(std::move(p));
  };
  if (part.first_stage()) {
    add(0, "wte", {c.padded_vocab, C}, 0);
    if (gpt2) add(0, "wpe", {c.max_seq_len, C}, -1);
  }
  for (int l = part.layer_begin; l < layer_end; ++l) {
    const int g = 1 + l;
    const std::string p = "layers." + std::to_string(l) + ".";
    add(g, p + "ln1.weight", {C}, -1);
    if (gpt2) add(g, p + "ln1.bias", {C}, -1);
    add(g, p + "attn.q.weight", {q_dim, C}, 0);
    if (gpt2) add(g, p + "attn.q.bias", {q_dim}, 0);
    add(g, p + "attn.k.weight", {kv_dim, C}, 0);
    if (gpt2) add(g, p + "attn.k.bias", {kv_dim}, 0);
    add(g, p + "attn.v.weight", {kv_dim, C}, 0);
    if (gpt2) add(g, p + "attn.v.bias", {kv_dim}, 0);
    add(g, p + "attn.o.weight", {C, q_dim}, 1);
    if (gpt2) add(g, p + "attn.o.bias", {C}, -1);
    add(g, p + "ln2.weight", {C}, -1);
    if (gpt2) add(g, p + "ln2.bias", {C}, -1);
    if (gpt2) {
      add(g, p + "mlp.fc.weight", {F, C}, 0);
      add(g, p + "mlp.fc.bias", {F}, 0);
      add(g, p + "mlp.proj.weight", {C, F}, 1);
      add(g, p + "mlp.proj.bias", {C}, -1);
    } else {
      add(g, p + "mlp.gate.weight", {F, C}, 0);
      add(g, p + "mlp.up.weight", {F, C}, 0);
      add(g, p + "mlp.down.weight", {C, F}, 1);
    }
  }
  if (part.last_stage()) {
    const int g = L + 1;
    add(g, "lnf.weight", {C}, -1);
    if (gpt2) add(g, "lnf.bias", {C}, -1);
    if (!c.tied()) {
      add(g, "lm_head.weight", {c.padded_vocab, C}, 0);
    } else if (!part.first_stage()) {
      add(g, "wte", {c.padded_vocab, C}, 0);
      layout.params.back().tied_copy = true;
    }
  }
  return layout;
}

std::vector<float> Transformer::initial_value(const TransformerConfig& c, const ParamInfo& p,
                                              uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(p.numel()), 0.0f);
  const std::string_view name = p.name;
  if (ends_with(name, ".bias")) return host;
  if (name == "lnf.weight" || ends_with(name, "ln1.weight") || ends_with(name, "ln2.weight")) {
    std::fill(host.begin(), host.end(), 1.0f);
    return host;
  }
  const bool residual = ends_with(name, "attn.o.weight") || ends_with(name, "mlp.proj.weight") ||
                        ends_with(name, "mlp.down.weight");
  const float std = residual ? c.init_std / std::sqrt(2.0f * static_cast<float>(c.n_layers))
                             : c.init_std;
  const uint64_t key = rng_key(seed, hash_name(p.name));
  // Padded vocabulary rows stay zero: they never receive a gradient either.
  const bool vocab_rows = name == "wte" || name == "lm_head.weight";
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
    : config_(config), ops_(ops), compute_dtype_(compute) {
  init_partition(nullptr, nullptr, micro_batch_size, 1);
}

Transformer::Transformer(const TransformerConfig& config, Ops& ops, const ModelPartition& part,
                         Communicator* tp, ParamStore* store, int micro_batch_size, int num_slots,
                         DType compute)
    : config_(config), ops_(ops), part_(part), compute_dtype_(compute) {
  init_partition(tp, store, micro_batch_size, num_slots);
}

Transformer::~Transformer() = default;

void Transformer::init_partition(Communicator* tp, ParamStore* store, int micro_batch_size,
                                 int num_slots) {
  const auto& c = config_;
  TRIDENT_CHECK_MSG(c.head_dim > 0 && c.padded_vocab >= c.vocab_size,
                    "TransformerConfig must be finalize()d");
  TRIDENT_CHECK(micro_batch_size > 0 && num_slots > 0);
  if (part_.layer_end < 0) part_.layer_end = c.n_layers;
  TRIDENT_CHECK(tp == nullptr || tp->size() == part_.tp_size);
  tp_ = part_.tp_size > 1 ? tp : nullptr;
  micro_batch_size_ = micro_batch_size;
  num_slots_ = num_slots;
  n_local_layers_ = part_.layer_end - part_.layer_begin;
  heads_ = c.n_heads / part_.tp_size;
  kv_heads_ = c.n_kv_heads / part_.tp_size;
  ff_ = c.d_ff / part_.tp_size;
  vocab_local_ = c.padded_vocab / part_.tp_size;
  vocab_begin_ = vocab_local_ * part_.tp_rank;

  layout_ = plan_params(c, part_);
  if (store == nullptr) {
    own_store_ = std::make_unique<ResidentParamStore>(layout_, ops_, compute_dtype_);
    store_ = own_store_.get();
  } else {
    store_ = store;
  }
  TRIDENT_CHECK_MSG(is_float_dtype(compute_dtype_) && store_->compute_dtype() == compute_dtype_,
                    std::string("model compute dtype ") + dtype_name(compute_dtype_) +
                        ", parameter store " + dtype_name(store_->compute_dtype()));
  layer_param_index_.assign(static_cast<size_t>(c.n_layers), std::vector<int>(kNumLayerTensors, -1));
  for (int l = part_.layer_begin; l < part_.layer_end; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    for (int t = 0; t < kNumLayerTensors; ++t) {
      const char* suffix = c.is_gpt2() ? kLayerTensors[t].gpt2 : kLayerTensors[t].llama;
      if (!suffix) continue;
      const ParamInfo* p = layout_.find(prefix + suffix);
      TRIDENT_CHECK_MSG(p != nullptr, prefix + suffix);
      layer_param_index_[static_cast<size_t>(l)][static_cast<size_t>(t)] =
          static_cast<int>(p - layout_.params.data());
    }
  }
  plan_activations();
  slot_info_.assign(static_cast<size_t>(num_slots_), SlotInfo{});
  loss_sum_ = DeviceBuffer(ops_, sizeof(double));  // zero-filled
}

void Transformer::plan_activations() {
  const auto& c = config_;
  const size_t N = static_cast<size_t>(micro_batch_size_) * c.seq_len;
  const size_t C = c.d_model, F = ff_, q_dim = static_cast<size_t>(heads_) * c.head_dim,
               kv_dim = static_cast<size_t>(kv_heads_) * c.head_dim;
  // The attention state is opaque bytes sized by the backend (kernels/ops.h); compute
  // tensors (activations and their gradients, logits) are of the compute dtype;
  // normalisation and cross-entropy statistics and the losses stay f32; token ids i32.
  const size_t att_bytes =
      ops_.attention_state_bytes(micro_batch_size_, c.seq_len, heads_, kv_heads_, c.head_dim);
  const bool llama = !c.is_gpt2();
  const bool last = part_.last_stage();
  const DType cd = compute_dtype_, f32 = DType::kF32, i32 = DType::kI32;
  Arena slot_arena;
  slot_offsets_.clear();
  slot_dtypes_.clear();
  auto reserve_bytes = [&](size_t bytes, DType dtype) {
    slot_offsets_.push_back(bytes ? slot_arena.reserve(bytes) : kAbsent);
    slot_dtypes_.push_back(dtype);
  };
  auto reserve = [&](size_t elements, DType dtype) {
    reserve_bytes(elements * dtype_size(dtype), dtype);
  };
  const std::pair<size_t, DType> globals[kSlotGlobals] = {
      {N, i32},
      {last ? N : 0, i32},
      {last ? N * C : 0, cd},
      {last ? N : 0, f32},
      {last ? N : 0, f32},
      {last ? N * static_cast<size_t>(vocab_local_) : 0, cd},
      {last ? N : 0, f32},
      {last ? N : 0, f32},
      {last ? 2 * N : 0, f32}};
  for (const auto& [n, dtype] : globals) reserve(n, dtype);
  for (int l = 0; l <= n_local_layers_; ++l) reserve(N * C, cd);
  for (int l = 0; l < n_local_layers_; ++l) {
    const std::pair<size_t, DType> sizes[kLayerActs] = {
        {N * C, cd},      {N, f32},      {N, f32},         {N * q_dim, cd},  {N * kv_dim, cd},
        {N * kv_dim, cd}, {0, DType::kU8}, {N * q_dim, cd}, {N * C, cd},      {N * C, cd},
        {N, f32},         {N, f32},      {N * F, cd},      {llama ? N * F : 0, cd}, {N * F, cd}};
    for (int i = 0; i < kLayerActs; ++i) {
      if (i == kAtt) {
        reserve_bytes(att_bytes, DType::kU8);
      } else {
        reserve(sizes[i].first, sizes[i].second);
      }
    }
  }
  act_bytes_per_slot_ = (slot_arena.total_bytes() + Arena::kAlignment - 1) / Arena::kAlignment *
                        Arena::kAlignment;
  activations_ = DeviceBuffer(ops_, act_bytes_per_slot_ * static_cast<size_t>(num_slots_));

  Arena scratch_arena;
  scratch_offsets_.clear();
  const size_t scratch_sizes[kScratchCount] = {N * C, N * C, N * q_dim, N * kv_dim, N * kv_dim,
                                               N * q_dim, N * F, llama ? N * F : 0, N * F};
  for (size_t s : scratch_sizes) {
    scratch_offsets_.push_back(s ? scratch_arena.reserve(s * dtype_size(cd)) : kAbsent);
  }
  scratch_ = DeviceBuffer(ops_, scratch_arena.total_bytes());
}

DevPtr Transformer::act(int slot, int index) const {
  const size_t off = slot_offsets_[static_cast<size_t>(index)];
  if (off == kAbsent) return DevPtr();
  return activations_.get()
      .byte_offset(act_bytes_per_slot_ * static_cast<size_t>(slot) + off)
      .as(slot_dtypes_[static_cast<size_t>(index)]);
}

DevPtr Transformer::scratch(int index) const {
  const size_t off = scratch_offsets_[static_cast<size_t>(index)];
  return off == kAbsent ? DevPtr() : scratch_.get().byte_offset(off).as(compute_dtype_);
}

namespace {
inline int x_index(int local_layer) { return kSlotGlobals + local_layer; }
}  // namespace

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
  DevPtr fc_w;    // (F_local, C)  gpt2 mlp.fc / llama mlp.gate
  DevPtr fc_b;    // (F_local)
  DevPtr up_w;    // (F_local, C)  llama mlp.up
  DevPtr proj_w;  // (C, F_local)  gpt2 mlp.proj / llama mlp.down
  DevPtr proj_b;  // (C)
};

struct Transformer::LayerActs {
  DevPtr ln1;        // (N, C)
  DevPtr ln1_mean;   // (N)
  DevPtr ln1_rstd;   // (N)
  DevPtr q;          // (N, NH_local*HD)  after RoPE (llama)
  DevPtr k;          // (N, NKV_local*HD) after RoPE (llama)
  DevPtr v;          // (N, NKV_local*HD)
  DevPtr att_state;  // opaque attention state (Ops::attention_state_bytes), never read here
  DevPtr atty;       // (N, NH_local*HD)
  DevPtr res2;       // (N, C)  residual stream after attention
  DevPtr ln2;        // (N, C)
  DevPtr ln2_mean;   // (N)
  DevPtr ln2_rstd;   // (N)
  DevPtr h1;         // (N, F_local)  gpt2 fc output / llama gate output
  DevPtr h2;         // (N, F_local)  llama up output
  DevPtr h_act;      // (N, F_local)  gelu(h1) / silu(h1) * h2
};

Transformer::LayerParams Transformer::layer_params(int layer, DevPtr base) const {
  const auto& idx = layer_param_index_[static_cast<size_t>(layer)];
  const size_t group_start = layout_.groups[static_cast<size_t>(1 + layer)].offset;
  DevPtr ptrs[kNumLayerTensors];
  for (int t = 0; t < kNumLayerTensors; ++t) {
    const int i = idx[static_cast<size_t>(t)];
    ptrs[t] =
        i < 0 ? DevPtr() : base + (layout_.params[static_cast<size_t>(i)].offset - group_start);
  }
  return LayerParams{ptrs[0], ptrs[1], ptrs[2],  ptrs[3],  ptrs[4],  ptrs[5],
                     ptrs[6], ptrs[7], ptrs[8],  ptrs[9],  ptrs[10], ptrs[11],
                     ptrs[12], ptrs[13], ptrs[14], ptrs[15], ptrs[16]};
}

Transformer::LayerActs Transformer::layer_acts(int slot, int local_layer) const {
  const int base = kSlotGlobals + n_local_layers_ + 1 + local_layer * kLayerActs;
  auto a = [&](int i) { return act(slot, base + i); };
  return LayerActs{
      a(kLn1),  a(kLn1Mean), a(kLn1Rstd), a(kQ),       a(kK),       a(kV),  a(kAtt).as(DType::kU8),
      a(kAtty), a(kRes2),    a(kLn2),     a(kLn2Mean), a(kLn2Rstd), a(kH1), a(kH2),
      a(kHAct)};
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

void Transformer::all_reduce_tp(DevPtr data, size_t n, const char* label) {
  if (tp_ == nullptr) return;
  CollectiveOptions opts;
  opts.label = label;
  tp_->all_reduce(CommBuf::device(data, n), ReduceOp::kSum, opts);
}

size_t Transformer::boundary_floats() const {
  return static_cast<size_t>(micro_batch_size_) * config_.seq_len * config_.d_model;
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

std::vector<float> Transformer::logits_to_host() const {
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
  TRIDENT_CHECK_MSG(slot >= 0 && slot < num_slots_ && B >= 1 && B <= micro_batch_size_ &&
                        T >= 1 && T <= c.seq_len,
                    "slot=" + std::to_string(slot) + " B=" + std::to_string(B) +
                        " T=" + std::to_string(T));
  const int N = B * T, C = c.d_model;
  SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
  info = SlotInfo{B, T, false};
  DevPtr x0 = act(slot, x_index(0));
  if (part_.first_stage()) {
    DevPtr d_tokens = act(slot, kTokens).as(DType::kI32);
    ops_.upload(d_tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
    store_->acquire(0, Phase::kForward);
    DevPtr wte = group_param(0, "wte");
    // Positions are added once, on tp rank 0, before the vocab-parallel sum.
    DevPtr wpe = c.is_gpt2() && part_.tp_rank == 0 ? group_param(0, "wpe") : DevPtr();
    ops_.embedding_forward(x0, d_tokens, wte, wpe, B, T, C, vocab_begin_, vocab_local_);
    store_->release(0, Phase::kForward);
    all_reduce_tp(x0, static_cast<size_t>(N) * C, "embedding");
  }
  for (int l = 0; l < n_local_layers_; ++l) {
    const int layer = part_.layer_begin + l;
    store_->acquire(1 + layer, Phase::kForward);
    layer_forward(slot, layer, act(slot, x_index(l)), act(slot, x_index(l + 1)), B, T);
    store_->release(1 + layer, Phase::kForward);
  }
  if (!part_.last_stage()) return;
  if (targets) {
    ops_.upload(act(slot, kTargets), targets, static_cast<size_t>(N) * sizeof(int32_t));
  }
  info.has_targets = targets != nullptr;
  head_forward(slot, B, T, targets != nullptr);
  if (targets) ops_.loss_accumulate(loss_sum_.as(DType::kF64), act(slot, kLosses), N);
}

void Transformer::layer_forward(int slot, int layer, DevPtr x_in, DevPtr x_out, int B, int T) {
  const auto& c = config_;
  const LayerParams p = layer_params(layer, store_->params(1 + layer));
  const LayerActs a = layer_acts(slot, layer - part_.layer_begin);
  const int N = B * T, C = c.d_model, F = ff_, HD = c.head_dim;
  const int q_dim = heads_ * HD, kv_dim = kv_heads_ * HD;
  const bool gpt2 = c.is_gpt2();
  const bool bias_here = part_.tp_rank == 0;  // row-parallel biases are added once

  if (gpt2) {
    ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, N, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(a.ln1, a.ln1_rstd, x_in, p.ln1_w, N, C, c.norm_eps);
  }
  ops_.matmul_forward(a.q, a.ln1, p.q_w, p.q_b, N, C, q_dim);
  ops_.matmul_forward(a.k, a.ln1, p.k_w, p.k_b, N, C, kv_dim);
  ops_.matmul_forward(a.v, a.ln1, p.v_w, p.v_b, N, C, kv_dim);
  if (!gpt2) {
    ops_.rope_forward(a.q, B, T, heads_, HD, c.rope_theta, 0);
    ops_.rope_forward(a.k, B, T, kv_heads_, HD, c.rope_theta, 0);
  }
  ops_.attention_forward(a.atty, a.att_state, a.q, a.k, a.v, B, T, heads_, kv_heads_, HD);
  // res2 = x_in + attn.o(atty), summed over the tp ranks' heads
  ops_.matmul_forward(a.res2, a.atty, p.o_w, bias_here ? p.o_b : DevPtr(), N, q_dim, C);
  all_reduce_tp(a.res2, static_cast<size_t>(N) * C, "attn.o");
  ops_.add(a.res2, a.res2, x_in, static_cast<size_t>(N) * C);

  if (gpt2) {
    ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C,
                           c.norm_eps);
    ops_.matmul_forward(a.h1, a.ln2, p.fc_w, p.fc_b, N, C, F);
    ops_.gelu_forward(a.h_act, a.h1, static_cast<size_t>(N) * F);
  } else {
    ops_.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, p.ln2_w, N, C, c.norm_eps);
    ops_.matmul_forward(a.h1, a.ln2, p.fc_w, DevPtr(), N, C, F);
    ops_.matmul_forward(a.h2, a.ln2, p.up_w, DevPtr(), N, C, F);
    ops_.swiglu_forward(a.h_act, a.h1, a.h2, static_cast<size_t>(N) * F);
  }
  ops_.matmul_forward(x_out, a.h_act, p.proj_w, bias_here ? p.proj_b : DevPtr(), N, F, C);
  all_reduce_tp(x_out, static_cast<size_t>(N) * C, "mlp.out");
  ops_.add(x_out, x_out, a.res2, static_cast<size_t>(N) * C);
}

void Transformer::head_forward(int slot, int B, int T, bool with_loss) {
  const auto& c = config_;
  const int L = c.n_layers, N = B * T, C = c.d_model, head_group = L + 1;
  // A tied head in a one-stage model reads wte from the embedding group.
  const bool head_in_embeddings = c.tied() && part_.first_stage();
  store_->acquire(head_group, Phase::kForward);
  if (head_in_embeddings) store_->acquire(0, Phase::kForward);
  DevPtr lnf = act(slot, kLnf);
  DevPtr xL = act(slot, x_index(n_local_layers_));
  DevPtr lnf_w = group_param(head_group, "lnf.weight");
  if (c.is_gpt2()) {
    ops_.layernorm_forward(lnf, act(slot, kLnfMean), act(slot, kLnfRstd), xL, lnf_w,
                           group_param(head_group, "lnf.bias"), N, C, c.norm_eps);
  } else {
    ops_.rmsnorm_forward(lnf, act(slot, kLnfRstd), xL, lnf_w, N, C, c.norm_eps);
  }
  DevPtr head = head_in_embeddings ? group_param(0, "wte")
                : c.tied()         ? group_param(head_group, "wte")
                                   : group_param(head_group, "lm_head.weight");
  DevPtr logits = act(slot, kLogits);
  ops_.matmul_forward(logits, lnf, head, DevPtr(), N, C, vocab_local_);
  if (head_in_embeddings) store_->release(0, Phase::kForward);
  store_->release(head_group, Phase::kForward);
  if (!with_loss) return;

  DevPtr targets = act(slot, kTargets).as(DType::kI32);
  DevPtr losses = act(slot, kLosses);
  if (tp_ == nullptr) {
    ops_.cross_entropy_forward(losses, logits, targets, N, c.vocab_size, c.padded_vocab);
    return;
  }
  // Vocab-parallel: global max, then global sum of exponentials and the target logit.
  DevPtr row_max = act(slot, kXentMax);
  DevPtr sums = act(slot, kXentSums);  // [sum_exp (N), target_logit (N)]
  ops_.xent_local_max(row_max, logits, N, vocab_local_, vocab_begin_, c.vocab_size);
  CollectiveOptions opts;
  opts.label = "xent max";
  tp_->all_reduce(CommBuf::device(row_max, static_cast<size_t>(N)), ReduceOp::kMax,
                  opts);
  ops_.xent_local_sums(sums, sums + N, logits, row_max, targets, N, vocab_local_, vocab_begin_,
                       c.vocab_size);
  all_reduce_tp(sums, 2 * static_cast<size_t>(N), "xent sums");
  ops_.xent_finish(losses, row_max, sums, sums + N, N);
}

// ---- backward ----------------------------------------------------------------------------

void Transformer::backward_stage(int slot, float loss_scale) {
  const auto& c = config_;
  SlotInfo& info = slot_info_[static_cast<size_t>(slot)];
  const int B = info.B, T = info.T, N = B * T, C = c.d_model;
  TRIDENT_CHECK_MSG(B > 0, "backward_stage() needs a forward_stage() in slot " + std::to_string(slot));
  DevPtr dx = scratch(kDx);
  if (part_.last_stage()) {
    TRIDENT_CHECK_MSG(info.has_targets, "backward needs a forward with targets");
    head_backward(slot, loss_scale, B, T);  // leaves dLoss/dx_L in dx
    info.has_targets = false;                // the logits now hold gradients
  }
  for (int l = n_local_layers_ - 1; l >= 0; --l) {
    const int layer = part_.layer_begin + l;
    store_->acquire(1 + layer, Phase::kBackward);
    layer_backward(slot, layer, act(slot, x_index(l)), dx, B, T);
    store_->release(1 + layer, Phase::kBackward);
  }
  if (part_.first_stage()) {
    store_->acquire(0, Phase::kBackward);
    DevPtr d_tokens = act(slot, kTokens).as(DType::kI32);
    DevPtr dwpe = c.is_gpt2() ? group_grad(0, "wpe") : DevPtr();
    ops_.embedding_backward(group_grad(0, "wte"), dwpe, dx, d_tokens, B, T, C, vocab_begin_,
                            vocab_local_);
    store_->release(0, Phase::kBackward);
  }
  (void)N;
}

void Transformer::head_backward(int slot, float loss_scale, int B, int T) {
  const auto& c = config_;
  const int L = c.n_layers, N = B * T, C = c.d_model, head_group = L + 1;
  const size_t nC = static_cast<size_t>(N) * C;
  const bool head_in_embeddings = c.tied() && part_.first_stage();
  store_->acquire(head_group, Phase::kBackward);
  if (head_in_embeddings) store_->acquire(0, Phase::kBackward);
  DevPtr logits = act(slot, kLogits);
  DevPtr targets = act(slot, kTargets).as(DType::kI32);
  const float dloss = loss_scale / static_cast<float>(N);
  if (tp_ == nullptr) {
    ops_.cross_entropy_backward(logits, logits, targets, dloss, N, c.vocab_size, c.padded_vocab);
  } else {
    DevPtr sums = act(slot, kXentSums);
    ops_.xent_local_backward(logits, logits, act(slot, kXentMax), sums, targets, dloss, N,
                             vocab_local_, vocab_begin_, c.vocab_size);
  }
  const char* head_name = c.tied() ? "wte" : "lm_head.weight";
  const int group = head_in_embeddings ? 0 : head_group;
  DevPtr dln = scratch(kDln);
  zero_elements(dln, nC);
  ops_.matmul_backward(dln, group_grad(group, head_name), DevPtr(), logits, act(slot, kLnf),
                       group_param(group, head_name), N, C, vocab_local_);
  all_reduce_tp(dln, nC, "head dinput");
  DevPtr dx = scratch(kDx);
  zero_elements(dx, nC);
  DevPtr xL = act(slot, x_index(n_local_layers_));
  if (c.is_gpt2()) {
    ops_.layernorm_backward(dx, group_grad(head_group, "lnf.weight"),
                            group_grad(head_group, "lnf.bias"), dln, xL,
                            group_param(head_group, "lnf.weight"), act(slot, kLnfMean),
                            act(slot, kLnfRstd), N, C);
  } else {
    ops_.rmsnorm_backward(dx, group_grad(head_group, "lnf.weight"), dln, xL,
                          group_param(head_group, "lnf.weight"), act(slot, kLnfRstd), N, C);
  }
  if (head_in_embeddings) store_->release(0, Phase::kBackward);
  store_->release(head_group, Phase::kBackward);
}

void Transformer::layer_backward(int slot, int layer, DevPtr x_in, DevPtr dx, int B, int T) {
  // On entry dx = dLoss/dx_out; on exit dx = dLoss/dx_in. Residual branches accumulate
  // straight into dx, since every backward op accumulates.
  const auto& c = config_;
  const LayerParams p = layer_params(layer, store_->params(1 + layer));
  const LayerParams g = layer_params(layer, store_->grads(1 + layer));
  const LayerActs a = layer_acts(slot, layer - part_.layer_begin);
  const int N = B * T, C = c.d_model, F = ff_, HD = c.head_dim;
  const int q_dim = heads_ * HD, kv_dim = kv_heads_ * HD;
  const size_t nF = static_cast<size_t>(N) * F, nC = static_cast<size_t>(N) * C;
  const bool gpt2 = c.is_gpt2();
  DevPtr dln = scratch(kDln);
  DevPtr dq = scratch(kDq);
  DevPtr dk = scratch(kDk);
  DevPtr dv = scratch(kDv);
  DevPtr datty = scratch(kDatty);
  DevPtr dh1 = scratch(kDh1);
  DevPtr dh2 = scratch(kDh2);
  DevPtr dh_act = scratch(kDhAct);

  // MLP: x_out = res2 + proj(act(ln2(res2))). Row-parallel bias gradients come from the
  // full (replicated) dx on every tp rank.
  zero_elements(dh_act, nF);
  ops_.matmul_backward(dh_act, g.proj_w, g.proj_b, dx, a.h_act, p.proj_w, N, F, C);
  zero_elements(dh1, nF);
  zero_elements(dln, nC);
  if (gpt2) {
    ops_.gelu_backward(dh1, dh_act, a.h1, nF);
    ops_.matmul_backward(dln, g.fc_w, g.fc_b, dh1, a.ln2, p.fc_w, N, C, F);
  } else {
    zero_elements(dh2, nF);
    ops_.swiglu_backward(dh1, dh2, dh_act, a.h1, a.h2, nF);
    ops_.matmul_backward(dln, g.fc_w, DevPtr(), dh1, a.ln2, p.fc_w, N, C, F);
    ops_.matmul_backward(dln, g.up_w, DevPtr(), dh2, a.ln2, p.up_w, N, C, F);
  }
  all_reduce_tp(dln, nC, "mlp dinput");
  if (gpt2) {
    ops_.layernorm_backward(dx, g.ln2_w, g.ln2_b, dln, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                            N, C);
  } else {
    ops_.rmsnorm_backward(dx, g.ln2_w, dln, a.res2, p.ln2_w, a.ln2_rstd, N, C);
  }

  // Attention: res2 = x_in + o(attn(q, k, v)), q/k/v = linear(ln1(x_in))
  const size_t nq = static_cast<size_t>(N) * q_dim, nkv = static_cast<size_t>(N) * kv_dim;
  zero_elements(datty, nq);
  ops_.matmul_backward(datty, g.o_w, g.o_b, dx, a.atty, p.o_w, N, q_dim, C);
  zero_elements(dq, nq);
  zero_elements(dk, nkv);
  zero_elements(dv, nkv);
  ops_.attention_backward(dq, dk, dv, datty, a.atty, a.att_state, a.q, a.k, a.v, B, T, heads_,
                          kv_heads_, HD);
  if (!gpt2) {
    ops_.rope_backward(dq, B, T, heads_, HD, c.rope_theta, 0);
    ops_.rope_backward(dk, B, T, kv_heads_, HD, c.rope_theta, 0);
  }
  zero_elements(dln, nC);
  ops_.matmul_backward(dln, g.q_w, g.q_b, dq, a.ln1, p.q_w, N, C, q_dim);
  ops_.matmul_backward(dln, g.k_w, g.k_b, dk, a.ln1, p.k_w, N, C, kv_dim);
  ops_.matmul_backward(dln, g.v_w, g.v_b, dv, a.ln1, p.v_w, N, C, kv_dim);
  all_reduce_tp(dln, nC, "attn dinput");
  if (gpt2) {
    ops_.layernorm_backward(dx, g.ln1_w, g.ln1_b, dln, x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd, N,
                            C);
  } else {
    ops_.rmsnorm_backward(dx, g.ln1_w, dln, x_in, p.ln1_w, a.ln1_rstd, N, C);
  }
}

}  // namespace trident
