// Closed-form memory plan. Every count is a double: a config that passed validation may
// still describe petabytes, and the point is to say so rather than wrap. The tensors
// and buffers are the model description's (model/model_description.h: the same lists
// the Transformer allocates from), summed here per group and arena;
// tests/plan/memory_plan_test.cpp holds the sums equal to the real tables and
// allocations for many layouts.
#include "plan/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "comm/communicator.h"
#include "core/check.h"
#include "core/log.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "plan/partition.h"
#include "plan/traffic_model.h"

namespace trident {
namespace {

constexpr double kF = sizeof(float);

double align(double x, double multiple) { return std::ceil(x / multiple) * multiple; }

// Bytes per element of the compute weights and activations (training.precision).
double compute_bytes(const Config& config) {
  return config.training.precision == Precision::kBf16 ? 2.0 : kF;
}
DType compute_dtype(const Config& config) {
  return config.training.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
}

// A tensor's tensor-parallel local shape as dim-0 rows of row_elems floats each (the
// geometry of parallel/sharded_param_store.h's RowSplit).
struct Rows {
  double rows = 0, row_elems = 1;
  double numel() const { return rows * row_elems; }
};

// The tensors of one parameter group of `part`, in describe_params order.
struct GroupTensors {
  std::vector<Rows> tensors;
  // Floats of the group's buffer: every tensor starts 16-float aligned, and the group
  // size is rounded up to 16 (ParamGroup::num_floats).
  double floats() const {
    double n = 0;
    for (const Rows& t : tensors) n += align(t.numel(), 16);
    return n;
  }
  // One rank's padded shard over dp: ceil(rows / dp) rows of every tensor.
  double shard_floats(int dp) const {
    double n = 0;
    for (const Rows& t : tensors) n += std::ceil(t.rows / dp) * t.row_elems;
    return n;
  }
  // The largest chunk_floats of ShardPlan's bucketing of this group alone (a new chunk
  // starts when the full floats of the chunk would exceed max_chunk).
  double max_chunk_floats(int dp, double max_chunk) const {
    double best = 0, chunk = 0, chunk_full = 0;
    bool empty = true;
    for (const Rows& t : tensors) {
      if (!empty && chunk_full + t.numel() > max_chunk) {
        best = std::max(best, chunk);
        chunk = chunk_full = 0;
      }
      chunk += std::ceil(t.rows / dp) * t.row_elems;
      chunk_full += t.numel();
      empty = false;
    }
    return std::max(best, chunk);
  }
  double largest_tensor() const {
    double n = 0;
    for (const Rows& t : tensors) n = std::max(n, t.numel());
    return n;
  }
};

struct StageGroups {
  GroupTensors embedding, layer, head;  // groups 0, 1 + i (each local layer alike), L + 1
  // Expert parallelism (ep > 1): each local layer's routed experts held here, a group of
  // their own (L + 2 + i) reduced and sharded over the expert-data-parallel group; the
  // layer group then holds the router and the shared experts only.
  GroupTensors experts;
  // A mixture of experts' leading dense layers (model.moe_first_dense_layers) held here,
  // each alike: their group has the dense MLP (`layer` and `experts` are the MoE layers').
  GroupTensors dense;
  double local_layers = 0;
  double dense_layers = 0;
  double moe_layers() const { return local_layers - dense_layers; }
  // Every local layer's floats (the experts' groups included).
  double layers_floats() const {
    return moe_layers() * (layer.floats() + experts.floats()) + dense_layers * dense.floats();
  }
  double num_tensors() const {
    return static_cast<double>(embedding.tensors.size() + head.tensors.size()) +
           moe_layers() * static_cast<double>(layer.tensors.size()) +
           dense_layers * static_cast<double>(dense.tensors.size());
  }
};

// A group's tensors as RowSplit rows.
GroupTensors group_tensors(const TransformerConfig& c, GroupKind kind, int tp, bool first,
                           int layer = -1) {
  GroupTensors g;
  for (const TensorDesc& t : describe_group(c, kind, tp, first, layer)) {
    const double rows = static_cast<double>(t.local_shape[0]);
    g.tensors.push_back({rows, static_cast<double>(t.local_shape.numel()) / rows});
  }
  return g;
}

// The groups of a rank holding `chunks` (in layer order; one unless interleaved).
StageGroups stage_groups(const TransformerConfig& c, const std::vector<ModelPartition>& chunks) {
  const ModelPartition& part = chunks.front();
  const int tp = part.tp_size;
  StageGroups s;
  for (const ModelPartition& chunk : chunks) {
    s.local_layers += chunk.local_layers(c.n_layers);
    const int end = chunk.layer_end < 0 ? c.n_layers : chunk.layer_end;
    for (int l = chunk.layer_begin; l < end; ++l) s.dense_layers += c.moe() && !c.moe_layer(l);
  }
  const bool first = part.first_stage(), last = chunks.back().last_stage();
  if (first) s.embedding = group_tensors(c, GroupKind::kEmbedding, tp, true);
  if (s.dense_layers > 0) s.dense = group_tensors(c, GroupKind::kLayer, tp, first, 0);
  if (s.moe_layers() > 0) s.layer = group_tensors(c, GroupKind::kLayer, tp, first);
  if (s.moe_layers() > 0 && part.ep_size > 1) {
    const std::vector<TensorDesc> tensors = describe_group(c, GroupKind::kLayer, tp, first);
    GroupTensors layer;
    const int local = c.moe_experts / part.ep_size;  // every ep rank's experts are alike
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int e = tensors[i].expert;
      const bool routed = e >= 0 && e < c.moe_experts;
      if (!routed) layer.tensors.push_back(s.layer.tensors[i]);
      if (routed && e < local) s.experts.tensors.push_back(s.layer.tensors[i]);
    }
    s.layer = layer;
  }
  if (last) s.head = group_tensors(c, GroupKind::kHead, tp, first);
  return s;
}

// Bytes of an Arena holding slices of these byte counts (each slice 64-byte aligned;
// zero-sized slices are not reserved). `pad_last`: the total is rounded up too
// (activation slots).
double arena_slices_bytes(const std::vector<double>& bytes, bool pad_last) {
  double total = 0;
  for (double b : bytes) {
    if (b <= 0) continue;
    total = align(total, 64) + b;
  }
  return pad_last ? align(total, 64) : total;
}

// What one layer of a micro-batch keeps for backward under torchtitan's op-level
// selective checkpointing. A model of another trainer's policy, not of Trident's
// allocation (Trident has no such setting): torchtitan/parallelisms/parallelize_llama.py
// at the commits of its published figures (pytorch/torchtitan 395a526, 157a12c; April
// 2024) wraps every TransformerBlock in a non-reentrant checkpoint whose policy saves the
// outputs of no_recompute_list = {aten.mm, the flash and efficient SDPA,
// _c10d_functional.reduce_scatter_tensor} "except every second mm", and reruns every other
// op (the even matmuls, norms, rope, silu and the product, the residual adds). Kept, per
// layer, besides the block input (the residual stream's x_l, counted as Trident's):
//   the odd matmuls' outputs (torchtitan_op_matmuls: q, v, the MLP's first and, SwiGLU,
//   the down projection), N token rows (tp: the column weights read the gathered input;
//   a row weight's output is its partial sum over all N rows) of the local width;
//   under tensor and sequence parallelism the reduce-scatter of each row-parallel output
//   (attention o and the MLP's down projection), N / tp rows of C;
//   the SDPA's output (N x the local heads' width) and its log-sum-exp (flash attention,
//   f32 [B, local heads, T]).
// All in the compute dtype, N = B x seq_len / cp tokens of the micro-batch.
double torchtitan_op_layer_bytes(const Config& config, const ModelPartition& part) {
  const TransformerConfig& c = config.model;
  const int tp = part.tp_size;
  const double B = config.parallel.micro_batch_size, T = c.seq_len / part.cp_size, N = B * T;
  const double heads = c.n_heads / tp;
  const bool sp = config.parallel.sequence_parallel && tp > 1;
  double elements = N * heads * c.head_dim;  // the SDPA's output
  for (const OpPolicyMatmul& mm : torchtitan_op_matmuls(c, tp)) {
    if (mm.saved) elements += N * mm.out_width;
    if (mm.row_parallel && sp) elements += N / tp * c.d_model;
  }
  return elements * compute_bytes(config) + B * heads * T * kF;
}

// The model's activation arenas (model/model_description.h's describe_activations,
// what Transformer allocates), for one slot and for the backward scratch. The attention
// state is the backend's (Ops::attention_state_bytes, saturating at SIZE_MAX: a size
// that would wrap still reads as far too big).
// `reruns` kTorchtitanOp under selective recomputation: torchtitan's op-level policy
// instead (a model of that trainer, torchtitan_op_layer_bytes): per layer what it saves;
// the rerun of a block in backward materialises all its tensors at once, one block at a
// time, which is full recomputation's working set (every layer buffer in the one shared
// set of the scratch). The head's buffers stay Trident's but for the logits, which
// torchtitan's Transformer returns as output(h).float() and its cross-entropy keeps in f32
// (torchtitan/models/llama/model.py, train.py loss_fn at 157a12c).
void activation_plan(const Config& config, const ModelPartition& part,
                     const AttentionStateBytes& attention_state_bytes, double local_layers,
                     SelectiveReruns reruns, double* slot_bytes, double* scratch_bytes) {
  const TransformerConfig& c = config.model;
  const bool op_policy = reruns == SelectiveReruns::kTorchtitanOp &&
                         config.training.recompute == Recompute::kSelective;
  TRIDENT_CHECK_MSG(!op_policy || !c.moe(),
                    "selective reruns torchtitan-op: dense models only (model.moe_experts > 0)");
  ActivationShape shape;
  shape.micro_batch_size = config.parallel.micro_batch_size;
  shape.tp_size = part.tp_size;
  shape.sequence_parallel = config.parallel.sequence_parallel;
  shape.last_stage = part.last_stage();
  shape.compute = compute_dtype(config);
  shape.recompute = op_policy ? Recompute::kFull : config.training.recompute;
  // Context parallelism: seq_len / cp rows per sequence, ring attention's lse as the
  // attention state (Transformer::allocate_activations), and the ring's own buffers.
  const int B = config.parallel.micro_batch_size, cp = part.cp_size, rows = c.seq_len / cp;
  const int NH = c.n_heads / part.tp_size, NKV = c.n_kv_heads / part.tp_size;
  shape.cp_size = cp;
  shape.ep_size = part.ep_size;
  shape.attention_state_bytes =
      cp > 1 ? double(B) * NH * rows * sizeof(float)
             : static_cast<double>(
                   attention_state_bytes(B, c.seq_len, NH, NKV, c.head_dim, shape.compute));
  const double ring =
      cp > 1 ? static_cast<double>(RingAttention::buffer_bytes(B, rows / 2, NH, NKV, c.head_dim,
                                                               shape.compute, cp))
             : 0.0;
  ActivationDescription d = describe_activations(c, shape);
  if (op_policy) {
    BufferDesc& logits = d.globals[buffers::kLogits];
    logits.bytes = logits.elements * kF;
  }
  auto bytes = [](const std::vector<BufferDesc>& buffers, bool shared) {
    std::vector<double> out;
    for (const BufferDesc& b : buffers) out.push_back(b.shared == shared ? b.bytes : 0.0);
    return out;
  };
  // Globals, then x_0..x_nl, then the per-layer saved tensors. Every layer's list is
  // the same, so an arena of n layers is n times one layer's aligned slices; the
  // buffers recomputation shares are one set in the scratch.
  const double layer_bytes = op_policy ? torchtitan_op_layer_bytes(config, part)
                                       : arena_slices_bytes(bytes(d.layer, false), true);
  *slot_bytes = arena_slices_bytes(bytes(d.globals, false), true) +
                (local_layers + 1) * arena_slices_bytes({d.residual.bytes}, true) +
                local_layers * layer_bytes;
  *scratch_bytes = arena_slices_bytes(bytes(d.scratch, false), false) +
                   (local_layers > 0 ? arena_slices_bytes(bytes(d.layer, true), false) : 0) +
                   ring;
}

uint64_t host_hash() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) std::snprintf(name, sizeof(name), "?");
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h;
}

// A memory limit file: a byte count, or "max" / missing / unparsable (no limit).
double read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0')
    return std::numeric_limits<double>::infinity();
  return static_cast<double>(v);
}

// The tightest memory limit of this process's cgroup and its ancestors (v2), or of its
// v1 memory cgroup; the root files cover containers whose /proc/self/cgroup paths do not
// resolve inside their own mount.
double cgroup_limit() {
  double limit = read_limit("/sys/fs/cgroup/memory.max");
  limit = std::min(limit, read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-id:controllers:path"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    const bool v1 = (',' + controllers + ',').find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    while (!path.empty() && path != "/") {
      limit = std::min(limit,
                       v2 ? read_limit("/sys/fs/cgroup" + path + "/memory.max")
                          : read_limit("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
      path = path.substr(0, path.rfind('/'));
    }
  }
  return limit;
}

std::string bytes_text(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : (bytes < 1e6 ? "%.1f %s" : "%.3g %s"), bytes,
                kUnits[u]);
  return buf;
}

const char* biggest_consumer(const RankMemory& m) {
  const std::pair<double, const char*> kinds[] = {{m.params, "parameters"},
                                                  {m.master, "fp32 master weights"},
                                                  {m.grads, "gradients"},
                                                  {m.optimizer, "optimizer state"},
                                                  {m.activations, "activations"},
                                                  {m.checkpoint, "checkpoint snapshot"},
                                                  {m.other, "other buffers"}};
  const auto* top =
      std::max_element(std::begin(kinds), std::end(kinds),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
  return top->second;
}

// What to change to shrink the biggest consumer, naming the keys and their values.
std::string shrink_hint(const Config& config, const RankMemory& m) {
  const auto& c = config.model;
  const auto& p = config.parallel;
  const std::string biggest = biggest_consumer(m);
  if (biggest == "activations") {
    return "reduce parallel.micro_batch_size=" + std::to_string(p.micro_batch_size) +
           " or model.seq_len=" + std::to_string(c.seq_len) +
           ", or split the layers over parallel.pp (now " + std::to_string(p.pp) +
           ") and the heads over parallel.tp (now " + std::to_string(p.tp) + ")";
  }
  if (biggest == "other buffers" &&
      m.tables >= std::max({m.scratch, m.transient, m.comm_buffers})) {
    return "the pipeline schedule and parameter tables dominate: reduce "
           "training.global_batch_size=" +
           std::to_string(config.training.global_batch_size) + " (" +
           std::to_string(config.grad_accum_steps()) +
           " micro-batches per step) or model.n_layers=" + std::to_string(c.n_layers);
  }
  return "reduce the model (model.n_layers=" + std::to_string(c.n_layers) +
         ", model.d_model=" + std::to_string(c.d_model) + ", model.d_ff=" + std::to_string(c.d_ff) +
         ", model.vocab_size=" + std::to_string(c.vocab_size) +
         ") or shard it with parallel.zero_stage (now " + std::to_string(p.zero_stage) +
         "; 1 shards the optimizer state over dp, 2 also the gradients, 3 also the "
         "parameters), parallel.tp (now " +
         std::to_string(p.tp) + ") or parallel.pp (now " + std::to_string(p.pp) + ")";
}

std::string breakdown(const RankMemory& m) {
  const std::string master = m.master > 0 ? ", fp32 masters " + bytes_text(m.master) : "";
  return "parameters " + bytes_text(m.params) + master + ", gradients " + bytes_text(m.grads) +
         ", optimizer " + bytes_text(m.optimizer) + ", activations " + bytes_text(m.activations) +
         ", checkpoint snapshot " + bytes_text(m.checkpoint) + ", other " + bytes_text(m.other);
}

// The device-resident kinds, then the host-resident ones (a rank with its own device).
std::string device_breakdown(const RankMemory& m) {
  const std::string master = m.master > 0 ? ", fp32 masters " + bytes_text(m.master) : "";
  return "parameters " + bytes_text(m.params) + master + ", gradients " + bytes_text(m.grads) +
         ", optimizer " + bytes_text(m.optimizer) + ", activations " + bytes_text(m.activations) +
         ", scratch and comm buffers " + bytes_text(m.scratch + m.comm_buffers) +
         ", workspaces " + bytes_text(m.workspace);
}
std::string host_breakdown(const RankMemory& m) {
  return "checkpoint snapshot " + bytes_text(m.checkpoint) + ", pinned staging " +
         bytes_text(m.pinned) + ", tables and transient " + bytes_text(m.tables + m.transient);
}

const char* biggest_device_consumer(const RankMemory& m) {
  RankMemory d = m;  // only the device kinds compete
  d.checkpoint = 0;
  d.other = d.scratch + d.comm_buffers + d.workspace;
  return biggest_consumer(d);
}

}  // namespace

std::vector<OpPolicyMatmul> torchtitan_op_matmuls(const TransformerConfig& model, int tp) {
  static constexpr ParamRole kForwardOrder[] = {ParamRole::kQW,     ParamRole::kKW,
                                                ParamRole::kVW,     ParamRole::kOW,
                                                ParamRole::kMlpInW, ParamRole::kMlpUpW,
                                                ParamRole::kMlpOutW};
  const std::vector<TensorDesc> tensors = describe_group(model, GroupKind::kLayer, tp, false);
  std::vector<OpPolicyMatmul> out;
  for (ParamRole role : kForwardOrder) {
    for (const TensorDesc& t : tensors) {
      if (t.role != role || t.local_shape.rank() != 2) continue;
      OpPolicyMatmul mm;
      mm.weight_elements = static_cast<double>(t.local_shape.numel());
      mm.out_width = static_cast<double>(t.local_shape[0]);  // [out, in]
      mm.row_parallel = role == ParamRole::kOW || role == ParamRole::kMlpOutW;
      mm.saved = out.size() % 2 == 0;  // the policy's counter, from 1: odd ones saved
      out.push_back(mm);
    }
  }
  return out;
}

int pipeline_slots(PipeSchedule schedule, int pp, int stage, int num_micro, int virtual_stages) {
  return pipeline_stage_slots(schedule, pp, stage, num_micro, virtual_stages);
}

RankMemory estimate_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                                const Ops& ops) {
  RankMemory m = estimate_rank_memory(
      config, part, dp_rank, [&ops](int B, int T, int NH, int NKV, int HD, DType dtype) {
        return ops.attention_state_bytes(B, T, NH, NKV, HD, dtype);
      });
  // The backend's own buffers: its attention scratch for this rank's shape (every layer
  // of every chunk shares it; none without a local layer) and its pinned staging.
  const TransformerConfig& c = config.model;
  bool layers = false;
  for (const ModelPartition& chunk : config.parallel.virtual_stages > 1
                                         ? rank_chunks(config, part.tp_rank, part.pp_rank, part.ep_rank)
                                         : std::vector<ModelPartition>{part}) {
    layers = layers || (chunk.layer_end < 0 ? c.n_layers : chunk.layer_end) > chunk.layer_begin;
  }
  if (layers) {
    m.workspace = static_cast<double>(ops.attention_workspace_bytes(
        config.parallel.micro_batch_size, c.seq_len, c.n_heads / part.tp_size,
        c.n_kv_heads / part.tp_size, c.head_dim, compute_dtype(config)));
  }
  if (const std::optional<Ops::DeviceMemory> device = ops.device_memory()) {
    m.pinned = static_cast<double>(device->pinned_host_bytes);
  }
  m.other += m.workspace + m.pinned;
  m.total += m.workspace + m.pinned;
  return m;
}

RankMemory estimate_rank_memory(const Config& config, const ModelPartition& part, int dp_rank,
                                const AttentionStateBytes& attention_state_bytes,
                                SelectiveReruns selective_reruns) {
  const TransformerConfig& c = config.model;
  const ParallelConfig& par = config.parallel;
  // The data-parallel machinery runs over dp x cp (the cp ranks hold the same
  // parameters: parallel/context_parallel.h), so ZeRO shards over dp * cp and dp_rank is
  // the rank's place in that group.
  const int dp = par.dp * par.cp, stage = par.zero_stage;
  // The rank's model chunks (several under interleaved 1F1B: plan/partition.h).
  const std::vector<ModelPartition> chunks =
      par.virtual_stages > 1 ? rank_chunks(config, part.tp_rank, part.pp_rank, part.ep_rank)
                             : std::vector<ModelPartition>{part};
  const StageGroups g = stage_groups(c, chunks);
  // Expert parallelism: the experts' engine runs over dp / ep ranks (parallel/expert_parallel.h).
  const int edp = par.dp / std::max(1, par.ep);
  const double total_floats = g.embedding.floats() + g.layers_floats() + g.head.floats();
  const double shard_floats =
      g.embedding.shard_floats(dp) + g.moe_layers() * g.layer.shard_floats(dp) +
      g.dense_layers * g.dense.shard_floats(dp) + g.head.shard_floats(dp) +
      g.moe_layers() * g.experts.shard_floats(edp);
  // The group buffers a ZeRO-2/3 store's pools hold at once (max_held_group_floats): one
  // group, or the head together with the embeddings when a one-stage model's head is tied
  // to wte.
  double held = std::max(
      {g.embedding.floats(), g.layer.floats(), g.dense.floats(), g.head.floats()});
  if (c.tied() && chunks.front().first_stage() && chunks.back().last_stage()) {
    held = std::max(held, g.embedding.floats() + g.head.floats());
  }
  held += g.experts.floats();  // the experts' store has a pool of its own (one group)
  RankMemory m;
  // The compute weights the model reads; in bf16 the fp32 masters are apart, held like
  // the moments (every element on ZeRO-0, the owned shard from ZeRO-1 on). ZeRO-3 in
  // bf16 keeps no compute shard: the gathered groups alone (the store casts the masters
  // at each gather, staging in its collective scratch and prefetch buffer).
  const double kA = compute_bytes(config);
  const bool bf16 = config.training.precision == Precision::kBf16;
  m.params = (stage == 3 ? (bf16 ? 0.0 : shard_floats) + held : total_floats) * kA;
  if (bf16) {
    m.master = (stage == 0 ? total_floats : shard_floats) * kF;
  }
  // Stage 1 keeps the full gradients the model accumulates into and the reduced shard.
  m.grads = (stage >= 2 ? shard_floats + held : total_floats + (stage == 1 ? shard_floats : 0)) * kF;
  m.optimizer = 2 * (stage == 0 ? total_floats : shard_floats) * kF;

  const int accum = config.grad_accum_steps();
  const int slots =
      pipeline_slots(par.pipeline_schedule, par.pp, part.pp_rank, accum, par.virtual_stages);
  // The chunks share one pool of `slots` slots of the largest chunk's slot bytes
  // (Transformer::share_activations; one chunk: its own); each has its backward scratch.
  double max_slot_bytes = 0;
  for (const ModelPartition& chunk : chunks) {
    const double chunk_layers =
        (chunk.layer_end < 0 ? c.n_layers : chunk.layer_end) - chunk.layer_begin;
    double slot_bytes = 0, scratch = 0;
    activation_plan(config, chunk, attention_state_bytes, chunk_layers, selective_reruns,
                    &slot_bytes, &scratch);
    max_slot_bytes = std::max(max_slot_bytes, slot_bytes);
    m.scratch += scratch;
  }
  m.activations = max_slot_bytes * slots;

  const double bucket = dp_bucket_floats(par);
  const double bucket_chunk =
      std::max({g.embedding.max_chunk_floats(dp, bucket), g.layer.max_chunk_floats(dp, bucket),
                g.dense.max_chunk_floats(dp, bucket),
                g.head.max_chunk_floats(dp, bucket)});
  const double group_chunk =
      std::max({g.embedding.shard_floats(dp), g.layer.shard_floats(dp), g.dense.shard_floats(dp),
                g.head.shard_floats(dp)});
  if (stage == 1 || stage == 2) {
    // DataParallel's pack (dp chunks) and segment (one chunk) of the largest bucket.
    // They gather compute weights; stage 1 reduce-scatters f32 gradients through them too.
    m.comm_buffers = (dp + 1) * bucket_chunk * (stage == 1 ? kF : kA);
  }
  if (stage >= 2) {
    // The store's collective scratch (collective_scratch_bytes): the [dp + 1, chunk] f32
    // pack of one group's reduce-scatter (a group is one chunk), which its all-gathers
    // reuse.
    m.comm_buffers += (dp + 1) * group_chunk * kF;
  }
  if (par.overlap_grad_reduce && stage >= 1 && dp > 1) {  // dp 1: nothing to overlap
    // The overlap queue's two slots (ReduceScatterQueue): stage 1 reduces buckets,
    // stages 2-3 whole groups.
    m.comm_buffers += 2 * (dp + 1) * (stage == 1 ? bucket_chunk : group_chunk) * kF;
  }
  if (par.overlap_param_gather && stage == 3 && dp > 1) {
    // The store's prefetch buffer: one packed group of compute weights, in bf16 and the
    // prefetch's staged chunk.
    m.comm_buffers += (dp + (bf16 ? 1 : 0)) * group_chunk * kA;
  }
  if (!g.experts.tensors.empty()) {
    // The experts' engine, the same buffers over its edp ranks and its one kind of group.
    const double e_bucket = g.experts.max_chunk_floats(edp, bucket);
    const double e_group = g.experts.shard_floats(edp);
    if (stage == 1 || stage == 2) m.comm_buffers += (edp + 1) * e_bucket * (stage == 1 ? kF : kA);
    if (stage >= 2) m.comm_buffers += (edp + 1) * e_group * kF;
    if (par.overlap_grad_reduce && stage >= 1 && edp > 1) {
      m.comm_buffers += 2 * (edp + 1) * (stage == 1 ? e_bucket : e_group) * kF;
    }
    if (par.overlap_param_gather && stage == 3 && edp > 1) {
      m.comm_buffers += (edp + (bf16 ? 1 : 0)) * e_group * kA;
    }
  }
  // Short-lived: the host copy of one tensor while initialising (or loading).
  m.transient =
      std::max({g.embedding.largest_tensor(), g.layer.largest_tensor(), g.dense.largest_tensor(),
                g.head.largest_tensor()}) *
      kF;
  // A checkpoint copies the saved rows (parameter, two moments) to host memory: ZeRO-0
  // state is saved by dp rank 0 alone, sharded state by every rank.
  // Under expert parallelism the experts are saved by each ep rank's edp replica 0.
  const double ckpt0 = (dp_rank == 0 ? total_floats - g.moe_layers() * g.experts.floats() : 0.0) +
                       (dp_rank < par.ep ? g.moe_layers() * g.experts.floats() : 0.0);
  m.checkpoint = 3 * (stage == 0 ? ckpt0 : shard_floats) * kF;
  // Tables: ~512 bytes per local tensor (ParamInfo in the trainer's and the model's
  // layout, ShardPlan entries), ~256 per global layer (group tables, the model's
  // per-layer index), the pipeline schedule (built twice at start-up: 2 actions per
  // micro-batch), and the token buffers.
  m.tables = 512.0 * g.num_tensors() + 256.0 * c.n_layers +
             2.0 * 2.0 * accum * par.virtual_stages * sizeof(PipeAction) +
             (2.0 * par.micro_batch_size * c.seq_len + c.seq_len + 1) * sizeof(int32_t);
  m.other = m.scratch + m.comm_buffers + m.transient + m.tables;
  m.total =
      m.params + m.master + m.grads + m.optimizer + m.activations + m.checkpoint + m.other;
  return m;
}

Result<HostMemory> available_host_memory() {
  if (const char* env = std::getenv("TRIDENT_MEMORY_LIMIT_BYTES"); env && *env) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || env[0] == '-') {
      return Status::invalid_config(std::string("TRIDENT_MEMORY_LIMIT_BYTES: expected a positive "
                                                "number of bytes, got '") +
                                    env + "'");
    }
    return HostMemory{static_cast<double>(v), "TRIDENT_MEMORY_LIMIT_BYTES"};
  }
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double cgroup = cgroup_limit();
  if (cgroup < physical) return HostMemory{cgroup, "cgroup memory limit"};
  return HostMemory{physical, "physical memory"};
}

std::string describe_rank_memory(const RankMemory& m) {
  return bytes_text(m.total) + " per rank (" + breakdown(m) + ")";
}

Status check_memory_fits(const Config& config, std::span<const RankMemoryReport> reports,
                         const std::string& source, const std::string& device_source) {
  // Devices first: each rank's device-resident parts against its own device.
  const RankMemoryReport* worst_device = nullptr;
  for (const RankMemoryReport& r : reports) {
    if (r.device_free <= 0 || r.need.device_resident() <= r.device_free) continue;
    if (!worst_device || r.need.device_resident() / r.device_free >
                             worst_device->need.device_resident() / worst_device->device_free) {
      worst_device = &r;
    }
  }
  if (worst_device) {
    const RankMemory& m = worst_device->need;
    return Status::invalid_config(
        "model needs " + bytes_text(m.device_resident()) + " of device memory per rank (" +
        device_breakdown(m) + "; biggest: " + biggest_device_consumer(m) + ") but the device has " +
        bytes_text(worst_device->device_free) + " free of " +
        bytes_text(worst_device->device_total) + " (" + device_source + "); " +
        shrink_hint(config, m));
  }
  // Then every machine: the host parts of ranks with a device, the totals of the others.
  struct Host {
    double need = 0, available = std::numeric_limits<double>::infinity();
    int ranks = 0;
    const RankMemory* largest = nullptr;
    double largest_need = 0;
    bool device = false;  // the largest rank has its own device: only its host parts count
  };
  std::map<uint64_t, Host> hosts;
  for (const RankMemoryReport& r : reports) {
    Host& h = hosts[r.host];
    const double need = r.device_free > 0 ? r.need.host_resident() : r.need.total;
    h.need += need;
    h.available = std::min(h.available, r.available);
    h.ranks++;
    if (!h.largest || need > h.largest_need) {
      h.largest = &r.need;
      h.largest_need = need;
      h.device = r.device_free > 0;
    }
  }
  // The most over-committed machine, so that every rank names the same one.
  const Host* worst = nullptr;
  for (const auto& [hash, h] : hosts) {
    if (h.need > h.available && (!worst || h.need / h.available > worst->need / worst->available)) {
      worst = &h;
    }
  }
  if (!worst) return Status::ok();
  const RankMemory& m = *worst->largest;
  const bool many = worst->ranks > 1;
  std::string msg =
      worst->device
          ? "model needs " + std::string(many ? "up to " : "") + bytes_text(m.host_resident()) +
                " of host memory per rank (" + host_breakdown(m) + ")"
          : "model needs " + std::string(many ? "up to " : "") + bytes_text(m.total) +
                " per rank (" + breakdown(m) + "; biggest: " + biggest_consumer(m) + ")";
  if (many) {
    msg += ", " + std::to_string(worst->ranks) + " ranks on one machine need " +
           bytes_text(worst->need) + " together,";
  }
  msg += " but this machine has " + bytes_text(worst->available) + " (" + source + ") for " +
         std::to_string(worst->ranks) + (many ? " ranks" : " rank") + "; " + shrink_hint(config, m);
  return Status::invalid_config(msg);
}

Status plan_and_check_memory(const Config& config, const ModelPartition& part, int dp_rank,
                             const Ops& ops, Communicator& world, bool quiet) {
  // Every rank takes part in the all-gather even when its own figure is unreadable, so
  // that the decision below is the same everywhere.
  Result<HostMemory> host = available_host_memory();
  RankMemoryReport mine;
  mine.host = host_hash();
  mine.available = host.is_ok() ? host->bytes : std::numeric_limits<double>::infinity();
  mine.need = estimate_rank_memory(config, part, dp_rank, ops);
  const std::optional<Ops::DeviceMemory> device = ops.device_memory();
  if (device) {
    mine.device_free = static_cast<double>(device->free_bytes);
    mine.device_total = static_cast<double>(device->total_bytes);
  }
  const std::string device_source = device ? device->source : "";
  std::vector<RankMemoryReport> all(static_cast<size_t>(world.size()));
  world.all_gather(CommBuf::host(std::as_bytes(std::span<const RankMemoryReport>(&mine, 1))),
                   CommBuf::host(std::as_writable_bytes(std::span<RankMemoryReport>(all))),
                   {.label = "memory plan"});
  if (!host.is_ok()) return host.status();
  const std::string source = host->source;
  if (world.rank() == 0 && !quiet) {
    const RankMemoryReport* largest = &all[0];
    int same_host = 0;
    for (const RankMemoryReport& r : all) {
      if (r.need.total > largest->need.total) largest = &r;
      if (r.host == mine.host) same_host++;
    }
    const char* up_to = world.size() > 1 ? "up to " : "";
    if (device) {
      // This rank's device (every rank checks its own): device-resident parts against it,
      // host-resident ones against the machine.
      log::info("memory plan: device {}{} per rank ({}), this rank's device has {} free of {} "
                "({}); host {}{} per rank ({}); {} rank{} on this machine, {} available ({})",
                up_to, bytes_text(largest->need.device_resident()),
                device_breakdown(largest->need), bytes_text(mine.device_free),
                bytes_text(mine.device_total), device_source, up_to,
                bytes_text(largest->need.host_resident()), host_breakdown(largest->need),
                same_host, same_host > 1 ? "s" : "", bytes_text(host->bytes), source);
    } else {
      log::info("memory plan: {}{}; {} rank{} on this machine, {} available ({})", up_to,
                describe_rank_memory(largest->need), same_host, same_host > 1 ? "s" : "",
                bytes_text(host->bytes), source);
    }
  }
  return check_memory_fits(config, all, source, device_source.empty() ? "device" : device_source);
}

}  // namespace trident
