#include "model/model_description.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/check.h"
#include "parallel/tensor_parallel.h"

namespace trident {
namespace {

// The sizes a Dim stands for.
struct DimSizes {
  double c, q, kv, f;
  double e = 0, k = 0, fe = 0, s = 0;  // mixture of experts (never split over tp)
  double of(Dim d) const {
    switch (d) {
      case Dim::kOne: return 1;
      case Dim::kC: return c;
      case Dim::kQ: return q;
      case Dim::kKV: return kv;
      case Dim::kF: return f;
      case Dim::kE: return e;
      case Dim::kK: return k;
      case Dim::kFe: return fe;
      case Dim::kKC: return k * c;
      case Dim::kKF: return k * fe;
      case Dim::kSF: return s * fe;
    }
    return 0;
  }
};

DimSizes global_sizes(const TransformerConfig& c) {
  return {double(c.d_model), double(int64_t{c.n_heads} * c.head_dim),
          double(int64_t{c.n_kv_heads} * c.head_dim), double(c.d_ff), double(c.moe_experts),
          double(c.moe_top_k), double(c.moe_d_ff), double(c.moe_shared_experts)};
}

bool is_norm(ParamRole r) {
  return r == ParamRole::kNorm1W || r == ParamRole::kNorm1B || r == ParamRole::kNorm2W ||
         r == ParamRole::kNorm2B;
}

double numel(const Shape& s) { return static_cast<double>(s.numel()); }

TensorDesc tensor(std::string name, ParamRole role, Shape shape, int split_dim, int tp,
                  InitKind init, int expert = -1) {
  TensorDesc t;
  t.expert = expert;
  t.name = std::move(name);
  t.role = role;
  t.init = init;
  t.shape = shape;
  t.local_shape = shape;
  t.split_dim = split_dim;
  if (split_dim >= 0) {
    TRIDENT_CHECK_MSG(shape[split_dim] % tp == 0, t.name + " does not split over tp");
    t.local_shape[split_dim] = shape[split_dim] / tp;
  }
  return t;
}

}  // namespace

// ---- the block -------------------------------------------------------------------------

void standard_block(const TransformerConfig& c, BlockDescription* block) {
  const Architecture& a = architecture(c.arch);
  TRIDENT_CHECK_MSG(!a.qk_norm, std::string(a.name) + ": q/k norms are not implemented");
  constexpr int col = ColumnParallelLinear::kWeightSplitDim;
  constexpr int col_bias = ColumnParallelLinear::kBiasSplitDim;
  constexpr int row = RowParallelLinear::kWeightSplitDim;
  constexpr int row_bias = RowParallelLinear::kBiasSplitDim;
  using P = ParamRole;
  using B = BufferRole;
  auto& t = block->tensors;
  const bool norm_bias = a.layer_norm(), bias = a.biases;
  t.push_back({"ln1.weight", P::kNorm1W, Dim::kC, Dim::kOne, -1});
  if (norm_bias) t.push_back({"ln1.bias", P::kNorm1B, Dim::kC, Dim::kOne, -1});
  t.push_back({"attn.q.weight", P::kQW, Dim::kQ, Dim::kC, col, B::kLn1});
  if (bias) t.push_back({"attn.q.bias", P::kQB, Dim::kQ, Dim::kOne, col_bias});
  t.push_back({"attn.k.weight", P::kKW, Dim::kKV, Dim::kC, col, B::kLn1});
  if (bias) t.push_back({"attn.k.bias", P::kKB, Dim::kKV, Dim::kOne, col_bias});
  t.push_back({"attn.v.weight", P::kVW, Dim::kKV, Dim::kC, col, B::kLn1});
  if (bias) t.push_back({"attn.v.bias", P::kVB, Dim::kKV, Dim::kOne, col_bias});
  t.push_back({"attn.o.weight", P::kOW, Dim::kC, Dim::kQ, row});
  if (bias) t.push_back({"attn.o.bias", P::kOB, Dim::kC, Dim::kOne, row_bias});
  t.push_back({"ln2.weight", P::kNorm2W, Dim::kC, Dim::kOne, -1});
  if (norm_bias) t.push_back({"ln2.bias", P::kNorm2B, Dim::kC, Dim::kOne, -1});
  const char* in = a.swiglu() ? "gate" : "fc";
  const char* out = a.swiglu() ? "down" : "proj";
  if (c.moe()) {
    // The router and the experts, replicated over tp (every tp rank routes and runs them
    // on the same N rows, gathered under sequence parallelism).
    // Expert e's MLP is the dense one's, named moe.experts.{e}.*.
    t.push_back({"moe.router.weight", P::kRouterW, Dim::kE, Dim::kC, -1});
    // Shared expert s is expert E + s, named moe.shared_experts.{s}.*.
    for (int e = 0; e < c.moe_experts + c.moe_shared_experts; ++e) {
      const bool routed = e < c.moe_experts;
      const std::string x = (routed ? "moe.experts." : "moe.shared_experts.") +
                            std::to_string(routed ? e : e - c.moe_experts) + ".";
      auto add = [&](const std::string& name, ParamRole role, Dim rows, Dim cols) {
        LayerTensor row{x + name, role, rows, cols, -1};
        row.expert = e;
        t.push_back(row);
      };
      add(std::string(in) + ".weight", P::kExpertInW, Dim::kFe, Dim::kC);
      if (bias) add(std::string(in) + ".bias", P::kExpertInB, Dim::kFe, Dim::kOne);
      if (a.swiglu()) add("up.weight", P::kExpertUpW, Dim::kFe, Dim::kC);
      add(std::string(out) + ".weight", P::kExpertOutW, Dim::kC, Dim::kFe);
      if (bias) add(std::string(out) + ".bias", P::kExpertOutB, Dim::kC, Dim::kOne);
    }
  } else {
    const std::string mi = std::string("mlp.") + in, mo = std::string("mlp.") + out;
    t.push_back({mi + ".weight", P::kMlpInW, Dim::kF, Dim::kC, col, B::kLn2});
    if (bias) t.push_back({mi + ".bias", P::kMlpInB, Dim::kF, Dim::kOne, col_bias});
    if (a.swiglu()) t.push_back({"mlp.up.weight", P::kMlpUpW, Dim::kF, Dim::kC, col, B::kLn2});
    t.push_back({mo + ".weight", P::kMlpOutW, Dim::kC, Dim::kF, row});
    if (bias) t.push_back({mo + ".bias", P::kMlpOutB, Dim::kC, Dim::kOne, row_bias});
  }

  // The buffers backward reads. LayerNorm keeps a mean and an rstd row, RMSNorm (which
  // has no mean) an rstd row only.
  auto& b = block->buffers;
  using K = BufferKind;
  b.push_back({"ln1", B::kLn1, Dim::kC, K::kCompute, true});
  if (norm_bias) b.push_back({"ln1_mean", B::kLn1Mean, Dim::kOne, K::kStatistic, true});
  b.push_back({"ln1_rstd", B::kLn1Rstd, Dim::kOne, K::kStatistic, true});
  b.push_back({"q", B::kQ, Dim::kQ, K::kCompute, false});  // after RoPE
  b.push_back({"k", B::kK, Dim::kKV, K::kCompute, false});
  b.push_back({"v", B::kV, Dim::kKV, K::kCompute, false});
  b.push_back({"att_state", B::kAttState, Dim::kOne, K::kAttentionState, false, true});
  b.push_back({"atty", B::kAtty, Dim::kQ, K::kCompute, false});
  b.push_back({"res2", B::kRes2, Dim::kC, K::kCompute, true});  // residual after attention
  b.push_back({"ln2", B::kLn2, Dim::kC, K::kCompute, true});
  if (norm_bias) b.push_back({"ln2_mean", B::kLn2Mean, Dim::kOne, K::kStatistic, true});
  b.push_back({"ln2_rstd", B::kLn2Rstd, Dim::kOne, K::kStatistic, true});
  if (c.moe()) {
    b.push_back({"router_probs", B::kRouterProbs, Dim::kE, K::kStatistic, false});
    b.push_back({"router_lse", B::kRouterLse, Dim::kOne, K::kStatistic, false});
    b.push_back({"moe_weights", B::kMoeWeights, Dim::kK, K::kStatistic, false});
    b.push_back({"moe_experts", B::kMoeExperts, Dim::kK, K::kIndex, false});
    b.push_back({"moe_order", B::kMoeOrder, Dim::kK, K::kIndex, false});
    b.push_back({"moe_position", B::kMoePosition, Dim::kK, K::kIndex, false});
    b.push_back({"moe_x", B::kMoeX, Dim::kKC, K::kCompute, false});  // dispatched ln2 rows
    b.push_back({"moe_h1", B::kMoeH1, Dim::kKF, K::kCompute, false});
    if (a.swiglu()) b.push_back({"moe_h2", B::kMoeH2, Dim::kKF, K::kCompute, false});
    b.push_back({"moe_h_act", B::kMoeHAct, Dim::kKF, K::kCompute, false});
    b.push_back({"moe_y", B::kMoeY, Dim::kKC, K::kCompute, false});  // the experts' outputs
    if (c.moe_shared_experts > 0) {
      b.push_back({"shared_h1", B::kSharedH1, Dim::kSF, K::kCompute, false});
      if (a.swiglu()) b.push_back({"shared_h2", B::kSharedH2, Dim::kSF, K::kCompute, false});
      b.push_back({"shared_h_act", B::kSharedHAct, Dim::kSF, K::kCompute, false});
    }
    return;
  }
  b.push_back({"h1", B::kH1, Dim::kF, K::kCompute, false});  // fc / gate output
  if (a.swiglu()) b.push_back({"h2", B::kH2, Dim::kF, K::kCompute, false});  // up output
  b.push_back({"h_act", B::kHAct, Dim::kF, K::kCompute, false});  // gelu(h1) / silu(h1)*h2
}

namespace {

// A block is built once per thread and (family, routed experts, shared experts): the
// builders read nothing else (the rows' sizes are Dim symbols), and `trident plan` asks
// for the block per layout and stage (tens of thousands of times for a mixture of experts).
const BlockDescription& cached_block(const TransformerConfig& c, int experts, int shared) {
  thread_local std::map<std::tuple<int, int, int>, BlockDescription> cache;
  const std::tuple<int, int, int> key{static_cast<int>(c.arch), experts, shared};
  auto it = cache.find(key);
  if (it == cache.end()) {
    TransformerConfig k = c;
    k.moe_experts = experts;
    k.moe_shared_experts = shared;
    BlockDescription block;
    const BlockBuilder builder = architecture(c.arch).block;
    (builder ? builder : standard_block)(k, &block);
    it = cache.emplace(key, std::move(block)).first;
  }
  return it->second;
}

}  // namespace

const BlockDescription& describe_block(const TransformerConfig& c) {
  return cached_block(c, c.moe_experts, c.moe_shared_experts);
}

const BlockDescription& describe_layer_block(const TransformerConfig& c, int layer) {
  if (c.moe_layer(layer) || !c.moe()) return describe_block(c);
  return cached_block(c, 0, 0);  // a leading dense layer of a MoE model
}

// ---- parameters ------------------------------------------------------------------------

std::vector<TensorDesc> describe_group(const TransformerConfig& c, GroupKind kind, int tp,
                                       bool first, int layer) {
  const Architecture& a = architecture(c.arch);
  const int64_t C = c.d_model;
  std::vector<TensorDesc> out;
  switch (kind) {
    case GroupKind::kEmbedding:
      out.push_back(tensor("wte", ParamRole::kNone, {c.padded_vocab, C},
                           VocabParallelEmbedding::kTableSplitDim, tp, InitKind::kVocabNormal));
      out.back().lookup = true;
      if (a.learned_positions()) {
        out.push_back(tensor("wpe", ParamRole::kNone, {c.max_seq_len, C}, -1, tp,
                             InitKind::kNormal));
        out.back().lookup = true;
      }
      break;
    case GroupKind::kLayer: {
      const DimSizes g = global_sizes(c);
      for (const LayerTensor& t :
           (layer < 0 ? describe_block(c) : describe_layer_block(c, layer)).tensors) {
        const auto rows = static_cast<int64_t>(g.of(t.rows));
        const Shape shape = t.cols == Dim::kOne
                                ? Shape{rows}
                                : Shape{rows, static_cast<int64_t>(g.of(t.cols))};
        out.push_back(tensor(t.name, t.role, shape, t.split_dim, tp, t.init, t.expert));
      }
      break;
    }
    case GroupKind::kHead:
      out.push_back(tensor("lnf.weight", ParamRole::kNone, {C}, -1, tp, InitKind::kOnes));
      if (a.layer_norm()) {
        out.push_back(tensor("lnf.bias", ParamRole::kNone, {C}, -1, tp, InitKind::kZeros));
      }
      if (!c.tied()) {
        out.push_back(tensor("lm_head.weight", ParamRole::kNone, {c.padded_vocab, C},
                             ColumnParallelLinear::kWeightSplitDim, tp, InitKind::kVocabNormal));
      } else if (!first) {
        out.push_back(tensor("wte", ParamRole::kNone, {c.padded_vocab, C},
                             ColumnParallelLinear::kWeightSplitDim, tp, InitKind::kVocabNormal));
        out.back().tied_copy = true;
      }
      break;
  }
  return out;
}

ParamLayout describe_params(const TransformerConfig& c, const ModelPartition& part) {
  return describe_params(c, std::span<const ModelPartition>(&part, 1));
}

ParamLayout describe_params(const TransformerConfig& c, std::span<const ModelPartition> chunks) {
  TRIDENT_CHECK_MSG(c.head_dim > 0, "TransformerConfig must be finalize()d");
  TRIDENT_CHECK(!chunks.empty());
  const int L = c.n_layers, tp = chunks.front().tp_size, r = chunks.front().tp_rank;
  const int ep = chunks.front().ep_size, ep_rank = chunks.front().ep_rank;
  const int El = c.moe() ? c.moe_experts / ep : 0;  // routed experts per ep rank
  TRIDENT_CHECK_MSG(ep == 1 || (c.moe() && c.moe_experts % ep == 0),
                    "expert parallelism: ep " + std::to_string(ep) + " with " +
                        std::to_string(c.moe_experts) + " experts");
  ParamLayout layout;
  const int num_groups = ep > 1 ? 2 * L + 2 : L + 2;
  layout.groups.resize(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) layout.groups[static_cast<size_t>(g)].id = g;
  size_t cursor = 0;
  int current_group = -1;
  auto add = [&](int group, const TensorDesc& t, const std::string& prefix) {
    if (group != current_group) {  // groups are added in id order
      TRIDENT_CHECK_MSG(group > current_group, "model chunks out of layer order");
      cursor = (cursor + 15) / 16 * 16;
      layout.groups[static_cast<size_t>(group)].offset = cursor;
      current_group = group;
    }
    ParamInfo p;
    p.decay = t.shape.rank() == 2;
    p.name = prefix + t.name;
    p.shape = t.shape;
    p.local_shape = t.local_shape;
    p.split_dim = t.split_dim;
    if (t.split_dim >= 0) p.split_offset = p.local_shape[t.split_dim] * r;
    p.tied_copy = t.tied_copy;
    p.init = t.init;
    p.group = group;
    p.offset = (cursor + 15) / 16 * 16;
    cursor = p.offset + static_cast<size_t>(p.local_shape.numel());
    auto& grp = layout.groups[static_cast<size_t>(group)];
    grp.params.push_back(static_cast<int>(layout.params.size()));
    grp.num_floats = (cursor - grp.offset + 15) / 16 * 16;
    layout.params.push_back(std::move(p));
  };
  // Each layer's tensors (a MoE model's leading dense layers have the dense MLP).
  auto layer_tensors = [&](int l) { return describe_group(c, GroupKind::kLayer, tp, false, l); };
  // At ep > 1 the local routed experts go to their own groups, after every chunk's.
  auto routed = [&](const TensorDesc& t) { return ep > 1 && t.expert >= 0 && t.expert < c.moe_experts; };
  for (const ModelPartition& part : chunks) {
    const int layer_end = part.layer_end < 0 ? L : part.layer_end;
    if (part.first_stage()) {
      for (const TensorDesc& t : describe_group(c, GroupKind::kEmbedding, tp, true)) {
        add(0, t, "");
      }
    }
    for (int l = part.layer_begin; l < layer_end; ++l) {
      const std::string prefix = "layers." + std::to_string(l) + ".";
      for (const TensorDesc& t : layer_tensors(l)) {
        if (!routed(t)) add(1 + l, t, prefix);
      }
    }
    if (part.last_stage()) {
      for (const TensorDesc& t : describe_group(c, GroupKind::kHead, tp, part.first_stage())) {
        add(L + 1, t, "");
      }
    }
  }
  if (ep > 1) {
    for (const ModelPartition& part : chunks) {
      const int layer_end = part.layer_end < 0 ? L : part.layer_end;
      for (int l = part.layer_begin; l < layer_end; ++l) {
        const std::string prefix = "layers." + std::to_string(l) + ".";
        for (const TensorDesc& t : layer_tensors(l)) {
          if (routed(t) && t.expert / El == ep_rank) add(moe_expert_group(L, ep, l), t, prefix);
        }
      }
    }
  }
  return layout;
}

// ---- activations -----------------------------------------------------------------------

namespace {

BufferDesc buffer(std::string name, double elements, DType dtype, bool kept = true) {
  BufferDesc b;
  b.name = std::move(name);
  b.dtype = dtype;
  b.elements = elements;
  b.bytes = elements * static_cast<double>(dtype_size(dtype));
  b.kept = kept;
  return b;
}

}  // namespace

ActivationDescription describe_activations(const TransformerConfig& c,
                                           const ActivationShape& s) {
  TRIDENT_CHECK_MSG(c.head_dim > 0, "TransformerConfig must be finalize()d");
  const double tp = s.tp_size, N = double(s.micro_batch_size) * (c.seq_len / s.cp_size);
  // Sequence parallelism: the residual stream, the norms and their statistics, res2 and
  // the boundary on this rank's N/tp token rows; the scratch adds the [N, C] gather
  // workspace, this rank's rows of the reduced input gradient and the norm-weight
  // gradients (f32, 4C).
  const bool sp = s.sequence_parallel && s.tp_size > 1;
  const double n = sp ? N / tp : N;
  const double C = c.d_model, F = c.d_ff / tp, Vl = c.padded_vocab / tp;
  const double q = double(c.n_heads / s.tp_size) * c.head_dim;
  const double kv = double(c.n_kv_heads / s.tp_size) * c.head_dim;
  const DimSizes local{C, q, kv, F, double(c.moe_experts), double(c.moe_top_k),
                       double(c.moe_d_ff), double(c.moe_shared_experts)};
  const bool last = s.last_stage, swiglu = architecture(c.arch).swiglu();
  const bool layer_norm = architecture(c.arch).layer_norm();
  const DType cd = s.compute, f32 = DType::kF32, i32 = DType::kI32;
  // The local position table under context parallelism (learned positions: kPositions).
  const bool cp_positions = s.cp_size > 1 && c.family().learned_positions();
  // Mixture of experts (0 for a dense model): experts, choices per token, expert width.
  const bool moe = c.moe();
  const double E = moe ? c.moe_experts : 0, K = moe ? c.moe_top_k : 0, Fe = moe ? c.moe_d_ff : 0;
  // Some layer has the dense MLP (a dense model, or a MoE model's leading layers).
  const bool dense_mlp = !moe || c.moe_first_dense_layers > 0;
  // The rows an expert-side buffer holds: N * K dispatched, or ep * N * K received.
  const double R = N * K * s.ep_size;
  ActivationDescription d;
  // Compute tensors (activations and their gradients, logits) are of the compute dtype;
  // normalisation and cross-entropy statistics and the losses stay f32; token ids i32.
  d.globals = {buffer("tokens", N, i32),
               buffer("targets", last ? N : 0, i32),
               buffer("lnf", last ? N * C : 0, cd),  // the head's input: all rows (gathered)
               buffer("lnf_mean", last && layer_norm ? n : 0, f32),  // RMSNorm: no mean
               buffer("lnf_rstd", last ? n : 0, f32),
               buffer("logits", last ? N * Vl : 0, cd),
               buffer("losses", last ? N : 0, f32),
               buffer("xent_max", last ? N : 0, f32),
               buffer("xent_sums", last ? 2 * N : 0, f32)};
  d.residual = buffer("x", n * C, cd);
  // A MoE model with leading dense layers keeps both blocks' buffers in every layer's set
  // (one layout for all layers; the dense MLP's h1, h2, h_act added to the MoE block's).
  std::vector<LayerBuffer> layer_buffers = describe_block(c).buffers;
  if (moe && c.moe_first_dense_layers > 0) {
    for (const LayerBuffer& b : describe_layer_block(c, 0).buffers) {
      if (b.role == BufferRole::kH1 || b.role == BufferRole::kH2 || b.role == BufferRole::kHAct) {
        layer_buffers.push_back(b);
      }
    }
  }
  for (const LayerBuffer& b : layer_buffers) {
    BufferDesc out;
    if (b.kind == BufferKind::kAttentionState) {
      out = buffer(b.name, s.attention_state_bytes, DType::kU8);
    } else {
      const DType dtype = b.kind == BufferKind::kCompute ? cd
                          : b.kind == BufferKind::kIndex ? i32
                                                         : f32;
      // Under expert parallelism the experts' input rows and hidden tensors are those a
      // rank receives: up to ep * N * K rows.
      const bool received = b.role == BufferRole::kMoeX || b.role == BufferRole::kMoeH1 ||
                            b.role == BufferRole::kMoeH2 || b.role == BufferRole::kMoeHAct;
      out = buffer(b.name, (b.sharded ? n : N) * local.of(b.width) * (received ? s.ep_size : 1),
                   dtype);
    }
    out.role = b.role;
    out.shared = s.recompute == Recompute::kFull ||
                 (s.recompute == Recompute::kSelective && b.selective && s.cp_size == 1);
    d.layer.push_back(std::move(out));
  }
  d.scratch = {buffer("dx", n * C, cd, false),
               buffer("dln", N * C, cd, false),
               buffer("dq", N * q, cd, false),
               buffer("dk", N * kv, cd, false),
               buffer("dv", N * kv, cd, false),
               buffer("datty", N * q, cd, false),
               buffer("dh1", dense_mlp ? N * F : 0, cd, false),
               buffer("dh2", swiglu && dense_mlp ? N * F : 0, cd, false),
               buffer("dh_act", dense_mlp ? N * F : 0, cd, false),
               // a MoE block's second half: its output's (or output gradient's) N rows
               buffer("gather", sp ? (moe ? 2 : 1) * N * C : 0, cd, false),
               buffer("dln_local", sp ? n * C : 0, cd, false),
               buffer("norm_grads", sp ? 4 * C : 0, f32, false),
               buffer("router_logits", N * E, f32, false),  // the router runs in fp32
               buffer("dmoe_x", R * C, cd, false),
               buffer("dmoe_h1", R * Fe, cd, false),
               buffer("dmoe_h2", swiglu ? R * Fe : 0, cd, false),
               buffer("dmoe_h_act", R * Fe, cd, false),
               buffer("dmoe_y", R * C, cd, false),
               buffer("dmoe_weights", N * K, f32, false),
               buffer("moe_prob_grad", E, f32, false),
               buffer("moe_stats", moe ? 2 * E + 1 : 0, f32, false),
               buffer("positions", cp_positions ? N / s.micro_batch_size * C : 0, cd, false),
               buffer("dpositions", cp_positions ? N / s.micro_batch_size * C : 0, f32, false),
               buffer("moe_ep_counts", moe && s.ep_size > 1 ? 2 * E : 0, i32, false),
               // The training step's fused q/k/v rows live in dq | dk | dv (forward) and
               // in the layer's q | k | v (backward): none of their own, only cache mode's.
               buffer("qkv", 0, cd, false)};
  return d;
}

// ---- the key/value cache -----------------------------------------------------------------

double KvCacheDescription::bytes(int local_layers) const {
  double total = local_layers * (keys.bytes + values.bytes) + 2 * forward.residual.bytes;
  for (const BufferDesc& b : forward.globals) total += b.bytes;
  for (const BufferDesc& b : forward.layer) total += b.bytes;
  for (const BufferDesc& b : forward.scratch) total += b.bytes;
  return total;
}

KvCacheDescription describe_kv_cache(const TransformerConfig& c, const KvCacheShape& s) {
  TRIDENT_CHECK_MSG(c.head_dim > 0, "TransformerConfig must be finalize()d");
  TRIDENT_CHECK_MSG(s.batch > 0 && s.capacity > 0 && s.max_new > 0 && s.tp_size > 0,
                    "kv cache: batch " + std::to_string(s.batch) + ", capacity " +
                        std::to_string(s.capacity) + ", max_new " + std::to_string(s.max_new));
  KvCacheDescription d;
  const double kv = double(c.n_kv_heads / s.tp_size) * c.head_dim;
  const double elements = double(s.batch) * s.capacity * kv;
  d.keys = buffer("k_cache", elements, s.compute);
  d.values = buffer("v_cache", elements, s.compute);
  // The forward's buffers are the training forward's for batch x max_new token rows, with
  // every layer buffer in the one shared set (full recomputation's layout: nothing is kept
  // per layer) and no attention state.
  TransformerConfig rows = c;
  rows.seq_len = s.max_new;
  ActivationShape a;
  a.micro_batch_size = s.batch;
  a.tp_size = s.tp_size;
  a.last_stage = true;
  a.compute = s.compute;
  a.recompute = Recompute::kFull;
  a.attention_state_bytes = 0;
  d.forward = describe_activations(rows, a);
  using namespace buffers;
  // Of the scratch only what a forward works in: a mixture-of-experts layer's router
  // logits, routing statistics and shared expert's output; a RoPE family's fused q/k/v
  // rows (batch x max_new of them), which the training step keeps in its backward scratch.
  for (int i = 0; i < kScratchCount; ++i) {
    if (i == kRouterLogits || i == kMoeStats || i == kDMoeY) continue;
    BufferDesc& b = d.forward.scratch[static_cast<size_t>(i)];
    b = buffer(b.name, 0, b.dtype);
  }
  if (c.family().rope()) {
    const double rows = double(s.batch) * s.max_new;
    const double width =
        double(c.n_heads / s.tp_size + 2 * (c.n_kv_heads / s.tp_size)) * c.head_dim;
    d.forward.scratch[kQkv] = buffer("qkv", rows * width, s.compute, false);
  }
  const double head_rows = s.all_logits ? 1.0 : 1.0 / s.max_new;  // of batch x max_new
  for (int g : {kLnf, kLnfMean, kLnfRstd, kLogits}) {
    BufferDesc& b = d.forward.globals[static_cast<size_t>(g)];
    b = buffer(b.name, b.elements * head_rows, b.dtype);
  }
  for (int g : {kTargets, kLosses, kXentMax, kXentSums}) {
    BufferDesc& b = d.forward.globals[static_cast<size_t>(g)];
    b = buffer(b.name, 0, b.dtype);
  }
  return d;
}

// ---- FLOPs -----------------------------------------------------------------------------

Work StageFlops::forward() const {
  return {layers * layer.gemm_flops + head.gemm_flops,
          layers * layer.attention_flops + head.attention_flops,
          layers * layer.elementwise_bytes + head.elementwise_bytes};
}

Work StageFlops::recompute(Recompute r) const {
  switch (r) {
    case Recompute::kFull: return layer;
    case Recompute::kSelective: return {0, layer.attention_flops, 0};
    case Recompute::kNone: break;
  }
  return {};
}

StageFlops describe_flops(const TransformerConfig& c, const ModelPartition& part,
                          int micro_batch_size, DType compute, bool sequence_parallel) {
  const double B = micro_batch_size, T = c.seq_len, N = B * T;
  const double tp = part.tp_size;
  const int tpi = part.tp_size;
  StageFlops f;
  f.layers = part.local_layers(c.n_layers);
  // GEMMs: 2 FLOPs per multiply-add of every local 2-D weight but the lookup tables
  // (wte on the first stage is a lookup unless it is also this stage's head; wpe always).
  double layer_matrix = 0, head_matrix = 0;
  // An expert's matrices are active for top_k / experts of the tokens on average (exactly:
  // the dispatch sends every token to top_k experts).
  // A mixture of experts' leading dense layers (moe_first_dense_layers) among the part's
  // run the dense MLP: `layer` is the mean of the part's layers.
  const double expert_share = c.moe() ? double(c.moe_top_k) / c.moe_experts : 1.0;
  const int end = part.layer_end < 0 ? c.n_layers : part.layer_end;
  const double dense_share =
      c.moe() && f.layers > 0
          ? std::max(0, std::min(end, c.moe_first_dense_layers) - part.layer_begin) / f.layers
          : 0.0;
  auto matrix = [&](int layer) {
    double m = 0;
    for (const TensorDesc& t : describe_group(c, GroupKind::kLayer, tpi, false, layer)) {
      if (t.local_shape.rank() == 2) {
        const bool routed = t.expert >= 0 && t.expert < c.moe_experts;
        m += numel(t.local_shape) * (routed ? expert_share : 1.0);
      }
    }
    return m;
  };
  layer_matrix = (1 - dense_share) * matrix(-1) + (dense_share > 0 ? dense_share * matrix(0) : 0.0);
  const bool first = part.first_stage(), last = part.last_stage();
  if (first) {
    for (const TensorDesc& t : describe_group(c, GroupKind::kEmbedding, tpi, true)) {
      const bool head_reads = t.name == "wte" && c.tied() && last;
      if (t.local_shape.rank() == 2 && (!t.lookup || head_reads)) head_matrix += numel(t.local_shape);
    }
  }
  if (last) {
    for (const TensorDesc& t : describe_group(c, GroupKind::kHead, tpi, first)) {
      if (t.local_shape.rank() == 2) head_matrix += numel(t.local_shape);
    }
  }
  f.layer.gemm_flops = 2 * N * layer_matrix;
  f.head.gemm_flops = 2 * N * head_matrix;
  // The attention core (QK^T and PV, causal: half of 4*B*T^2 per query width).
  const double q_local = static_cast<double>(c.n_heads) * c.head_dim / tp;
  f.layer.attention_flops = 2 * B * T * T * q_local;
  // Elementwise passes (norms, residual adds, rope, the activation function, the
  // softmax statistics): about 12 reads/writes of the [N, C] stream and 4 of the [N, F]
  // and [N, q] ones per layer. The [N, C] ones run on a sequence shard under sequence
  // parallelism.
  const double kA = static_cast<double>(dtype_size(compute));
  const double c_stream = sequence_parallel ? c.d_model / tp : c.d_model;
  const double hidden =
      c.moe() ? (1 - dense_share) * double(c.moe_top_k + c.moe_shared_experts) * c.moe_d_ff +
                    dense_share * c.d_ff / tp
              : c.d_ff / tp;
  f.layer.elementwise_bytes = kA * N * (12 * c_stream + 4 * hidden + 4 * q_local);
  // The head's softmax / cross-entropy over the local vocabulary: ~4 passes.
  f.head.elementwise_bytes = last ? 4 * N * c.padded_vocab / tp * kA : 0;
  return f;
}

LayerCollectives describe_collectives(const TransformerConfig& c, int layer) {
  LayerCollectives out;
  const BlockDescription& block = layer < 0 ? describe_block(c) : describe_layer_block(c, layer);
  const DimSizes g = global_sizes(c);
  std::vector<BufferRole> inputs;
  for (const LayerTensor& t : block.tensors) {
    const bool matrix = t.cols != Dim::kOne;
    if (matrix && t.split_dim == ColumnParallelLinear::kWeightSplitDim &&
        std::find(inputs.begin(), inputs.end(), t.input) == inputs.end()) {
      inputs.push_back(t.input);
    }
    if (matrix && t.split_dim == RowParallelLinear::kWeightSplitDim) out.row_outputs += 1;
    if (is_norm(t.role)) out.norm_floats += g.of(t.rows) * g.of(t.cols);
  }
  out.column_inputs = static_cast<double>(inputs.size());
  for (const TensorDesc& t : describe_group(c, GroupKind::kHead, 1, true)) {
    if (t.split_dim < 0) out.head_norm_floats += numel(t.shape);
  }
  return out;
}

}  // namespace trident
