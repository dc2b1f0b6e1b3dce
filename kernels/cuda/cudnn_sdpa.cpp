// The "cudnn" attention path (contract: attention.h): cuDNN's fused flash attention via
// the backend graph API, without cudnn-frontend.
//
// cuDNN 9.19's unified SDPA operation has no causal mask, so the graphs here are the
// composite ones cudnn-frontend builds and cuDNN's runtime fusion engine recognises
// transcribed op by op from NVIDIA/cudnn-frontend @3929da2
// include/cudnn_frontend/node/scaled_dot_product_flash_attention.h:
//   forward  = CompositeSDPANode::expand_node with attn_scale (a by-value tensor), the
//              top-left causal mask (CompositeDiagonalBandMaskNode, right bound 0) and
//              Stats (CompositeSoftmaxNode, softmax.h);
//   backward = CompositeSDPABackwardNode::expand_node with the same options and
//              is_deterministic_algorithm (as llm.c sets), i.e. the "dP workspace" form
//              that writes dQ straight from its matmul (no fp32 dQ_accum and no atomics).
// Each step below carries the FE node name. The graph context is llm.c's: io bf16,
// intermediate and compute fp32.
//
// Logical shapes: Q, O, dQ, dO [B, H, T, D] over Trident's [B, T, H, D] memory (strides
// {T*H*D, D, H*D, 1}, no permute); K, V, dK, dV [B, Hk, T, D] likewise; K enters as K^T
// (dims and strides 2<->3 swapped); Stats fp32 [B, H, T, 1]. GQA (Hk < H) is native in the
// matmuls; the backward reduces full-head dK / dV over each group's heads.
#include <cudnn.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/ops.h"

namespace trident::cuda {

namespace {

// Unique ids of the tensors we bind in the variant pack; virtual tensors count from 100.
enum Uid : int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kdO = 6, kdQ = 7, kdK = 8, kdV = 9,
  kScale = 10, kNegInf = 11, kOne = 12, kSoftmaxSum = 13, kFirstVirtual = 100,
};

std::string last_error() {
  char buf[2048] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
}

std::string shape_str(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HD=" + std::to_string(s.HD);
}

// Owns backend descriptors and records the first failure; after a failure every call is
// a no-op, so a builder reads as straight-line code.
class Graph {
 public:
  using Desc = cudnnBackendDescriptor_t;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& summary() const { return summary_; }
  Desc graph() const { return graph_; }
  int op_count() const { return static_cast<int>(ops_.size()); }

  Desc create(cudnnBackendDescriptorType_t type, const std::string& what) {
    if (!ok()) return nullptr;
    Desc d = nullptr;
    check(cudnnBackendCreateDescriptor(type, &d), what, "create");
    if (ok()) owned_.push_back(d);
    return ok() ? d : nullptr;
  }
  void set(Desc d, cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t n,
           const void* value, const std::string& what, const char* attr_name) {
    if (!ok()) return;
    check(cudnnBackendSetAttribute(d, attr, type, n, value), what, attr_name);
  }
  void finalize(Desc d, const std::string& what) {
    if (!ok()) return;
    check(cudnnBackendFinalize(d), what, "finalize");
  }

  // A tensor descriptor. uid < 0: the next virtual uid.
  Desc tensor(const std::string& name, cudnnDataType_t dtype, std::vector<int64_t> dims,
              std::vector<int64_t> strides, bool is_virtual, int64_t uid = -1, bool by_value = false) {
    const std::string what = "tensor " + name;
    Desc t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    if (uid < 0) uid = next_uid_++;
    const int64_t alignment = 16;
    const int64_t n = static_cast<int64_t>(dims.size());
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, what, "CUDNN_ATTR_TENSOR_DATA_TYPE");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data(), what, "CUDNN_ATTR_TENSOR_DIMENSIONS");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data(), what, "CUDNN_ATTR_TENSOR_STRIDES");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what,
        "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
    if (is_virtual) {
      const bool v = true;
      set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, what, "CUDNN_ATTR_TENSOR_IS_VIRTUAL");
    }
    if (by_value) {
      const bool v = true;
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &v, what, "CUDNN_ATTR_TENSOR_IS_BY_VALUE");
    }
    finalize(t, what);
    names_[t] = name;
    return t;
  }
  // A 1x1x1x1 fp32 scalar passed by value (a host pointer in the variant pack).
  Desc scalar(const std::string& name, int64_t uid) {
    return tensor(name, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, uid, true);
  }

  void matmul(const std::string& step, Desc a, Desc b, Desc c) {
    const std::string what = "matmul " + step;
    Desc m = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what, "CUDNN_ATTR_MATMUL_COMP_TYPE");
    finalize(m, what);
    Desc op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what,
        "CUDNN_ATTR_OPERATION_MATMUL_ADESC");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what,
        "CUDNN_ATTR_OPERATION_MATMUL_BDESC");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what,
        "CUDNN_ATTR_OPERATION_MATMUL_CDESC");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, what,
        "CUDNN_ATTR_OPERATION_MATMUL_DESC");
    add_op(op, what, "matmul(" + name(a) + "," + name(b) + ")->" + name(c));
  }

  // y = mode(x[, b[, t]]); prec is the math precision (FE's compute_data_type).
  void pointwise(const std::string& step, cudnnPointwiseMode_t mode, const char* mode_name, Desc x, Desc b,
                 Desc t, Desc y, cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    const std::string what = std::string("pointwise ") + mode_name + " " + step;
    Desc p = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what, "CUDNN_ATTR_POINTWISE_MODE");
    set(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what,
        "CUDNN_ATTR_POINTWISE_MATH_PREC");
    if (mode == CUDNN_POINTWISE_GEN_INDEX) {
      set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what, "CUDNN_ATTR_POINTWISE_AXIS");
    }
    finalize(p, what);
    Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, what,
        "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what,
        "CUDNN_ATTR_OPERATION_POINTWISE_XDESC");
    std::string args = name(x);
    if (b) {
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what,
          "CUDNN_ATTR_OPERATION_POINTWISE_BDESC");
      args += ',';
      args += name(b);
    }
    if (t) {
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what,
          "CUDNN_ATTR_OPERATION_POINTWISE_TDESC");
      args += ',';
      args += name(t);
    }
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what,
        "CUDNN_ATTR_OPERATION_POINTWISE_YDESC");
    std::string label = std::string("pointwise ") + mode_name;
    if (mode == CUDNN_POINTWISE_GEN_INDEX) label += " axis" + std::to_string(axis);
    add_op(op, what, label + "(" + args + ")->" + name(y));
  }

  void reduction(const std::string& step, cudnnReduceTensorOp_t mode, const char* mode_name, Desc x, Desc y) {
    const std::string what = std::string("reduction ") + mode_name + " " + step;
    Desc r = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what,
        "CUDNN_ATTR_REDUCTION_OPERATOR");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what, "CUDNN_ATTR_REDUCTION_COMP_TYPE");
    finalize(r, what);
    Desc op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what,
        "CUDNN_ATTR_OPERATION_REDUCTION_XDESC");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what,
        "CUDNN_ATTR_OPERATION_REDUCTION_YDESC");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, what,
        "CUDNN_ATTR_OPERATION_REDUCTION_DESC");
    add_op(op, what, std::string("reduction ") + mode_name + "(" + name(x) + ")->" + name(y));
  }

  void reshape(const std::string& step, Desc x, Desc y) {
    const std::string what = "reshape " + step;
    Desc op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what,
        "CUDNN_ATTR_OPERATION_RESHAPE_XDESC");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what,
        "CUDNN_ATTR_OPERATION_RESHAPE_YDESC");
    add_op(op, what, "reshape(" + name(x) + ")->" + name(y));
  }

  // The operation graph of every op added, on `handle` (null: host-only finalize).
  void finish(cudnnHandle_t handle) {
    const std::string what = "operation graph";
    graph_ = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what);
    if (handle != nullptr) {
      set(graph_, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, what,
          "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
    }
    set(graph_, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data(), what, "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    finalize(graph_, what);
  }

  void fail(const std::string& message) {
    if (ok()) error_ = message;
  }

 private:
  void check(cudnnStatus_t s, const std::string& what, const char* step) {
    if (s == CUDNN_STATUS_SUCCESS) return;
    error_ = what + ": " + step + ": " + cudnnGetErrorString(s);
    const std::string detail = last_error();
    if (!detail.empty()) error_ += " (" + detail + ")";
  }
  void add_op(Desc op, const std::string& what, const std::string& label) {
    finalize(op, what);
    if (!ok()) return;
    ops_.push_back(op);
    if (!summary_.empty()) summary_ += "; ";
    summary_ += label;
  }
  std::string name(Desc d) const {
    auto it = names_.find(d);
    return it == names_.end() ? "?" : it->second;
  }

  std::vector<Desc> owned_;
  std::vector<Desc> ops_;
  std::map<Desc, std::string> names_;
  std::string summary_, error_;
  Desc graph_ = nullptr;
  int64_t next_uid_ = kFirstVirtual;
};

using Dims = std::vector<int64_t>;

struct SdpaLayout {
  int64_t B, H, Hk, T, D;
  Dims q_dims() const { return {B, H, T, D}; }
  Dims q_strides() const { return {T * H * D, D, H * D, 1}; }  // Trident's [B, T, H, D]
  Dims kv_dims() const { return {B, Hk, T, D}; }
  Dims kv_strides() const { return {T * Hk * D, D, Hk * D, 1}; }
  Dims kvt_dims() const { return {B, Hk, D, T}; }  // K^T, V^T: dims and strides 2<->3
  Dims kvt_strides() const { return {T * Hk * D, D, 1, Hk * D}; }
  Dims s_dims() const { return {B, H, T, T}; }  // scores, row-major
  Dims s_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims st_strides() const { return {H * T * T, T * T, 1, T}; }  // a transposed score view
  Dims row_dims() const { return {B, H, T, 1}; }  // per-row statistics
  Dims row_strides() const { return {H * T, T, 1, 1}; }
};

Status validate_shape(const AttentionShape& s) {
  const std::string where = "cuDNN SDPA (" + shape_str(s) + "): ";
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.HD <= 0) {
    return Status::invalid_config(where + "every dimension must be positive (HD=" + std::to_string(s.HD) +
                                  ", T=" + std::to_string(s.T) + ")");
  }
  if (s.NH % s.NKV != 0) {
    return Status::invalid_config(where + "NH=" + std::to_string(s.NH) + " is not divisible by NKV=" +
                                  std::to_string(s.NKV));
  }
  if (s.HD % 8 != 0 || s.HD > 256) {
    return Status::invalid_config(where + "head dim HD=" + std::to_string(s.HD) +
                                  " must be a multiple of 8 and at most 256 (cuDNN flash attention)");
  }
  if (s.dtype != DType::kBF16) {
    return Status::invalid_config(where + "dtype " + std::string(dtype_name(s.dtype)) +
                                  " is not bf16 (cuDNN flash attention runs in bf16 only)");
  }
  return Status::ok();
}

std::string version_str(size_t v) {  // 91900 -> "9.19.0"
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

// What the loaded cuDNN can run of these graphs, from cudnn-frontend's checks for exactly
// this configuration (CompositeSDPABackwardNode::pre_validate_node, sdpa_support_surface.h).
// Only the execution paths ask: the graphs themselves build with any cuDNN 9.
Status check_runtime_support(const AttentionShape& s, size_t version) {
  const std::string where = "cuDNN SDPA (" + shape_str(s) + ", cuDNN " + version_str(version) + "): ";
  // First the rule of every version, so that the message does not depend on the runtime.
  if (s.T == 1) return Status::invalid_config(where + "T=1 is not supported (s_q = s_kv = 1)");
  if (version < 91002) {
    // Older releases want -FLT_MAX as the mask value (FE get_negative_inf_value) and 9.10.0/1
    // have backward bugs FE refuses.
    return Status::invalid_config(where + "needs cuDNN 9.10.2 or newer (the graphs are cudnn-frontend's for it)");
  }
  if (version < 91600 && s.T % 128 != 0) {
    // FE adds a "workaround padding mask" to the backward graph up to 9.15; not built here.
    return Status::invalid_config(where + "cuDNN before 9.16 needs T to be a multiple of 128 (T=" +
                                  std::to_string(s.T) + ")");
  }
  return Status::ok();
}

void build_forward(Graph& g, const SdpaLayout& L) {
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  auto q = g.tensor("Q", bf16, L.q_dims(), L.q_strides(), false, kQ);
  // expand_node: "the code below maps the K->KT" (dims and strides 2<->3).
  auto kt = g.tensor("KT", bf16, L.kvt_dims(), L.kvt_strides(), false, kK);
  auto v = g.tensor("V", bf16, L.kv_dims(), L.kv_strides(), false, kV);
  auto o = g.tensor("O", bf16, L.q_dims(), L.q_strides(), false, kO);
  auto stats = g.tensor("Stats", f32, L.row_dims(), L.row_strides(), false, kStats);
  auto scale = g.scalar("attn_scale", kScale);
  // get_negative_inf_value(): -inf from cuDNN 9.10 on.
  auto neg_inf = g.scalar("neg_inf", kNegInf);
  auto virt = [&](const char* name, cudnnDataType_t t, const Dims& d, const Dims& s) {
    return g.tensor(name, t, d, s, true);
  };
  // "bmm1": S = Q @ K^T, output [b, h_q, s_q, s_kv].
  auto s = virt("S", f32, L.s_dims(), L.s_strides());
  g.matmul("bmm1", q, kt, s);
  // "attn_scale": S * attn_scale.
  auto s1 = virt("S_scaled", f32, L.s_dims(), L.s_strides());
  g.pointwise("attn_scale", CUDNN_POINTWISE_MUL, "mul", s, scale, nullptr, s1);
  // CompositeDiagonalBandMaskNode "right_bound_diagonal_mask" (causal, top-left, right
  // bound 0): "gen_row_index" GEN_INDEX axis 2, "gen_col_index" GEN_INDEX axis 3 (INT32
  // outputs), "row>col" CMP_GE (BOOLEAN), "binary_select"(S, -inf, keep).
  auto row = virt("row", CUDNN_DATA_INT32, L.s_dims(), L.s_strides());
  g.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, "gen_index", s1, nullptr, nullptr, row, f32, 2);
  auto col = virt("col", CUDNN_DATA_INT32, L.s_dims(), L.s_strides());
  g.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, "gen_index", s1, nullptr, nullptr, col, f32, 3);
  auto keep = virt("keep", CUDNN_DATA_BOOLEAN, L.s_dims(), L.s_strides());
  g.pointwise("row>col", CUDNN_POINTWISE_CMP_GE, "cmp_ge", row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  auto s2 = virt("S_masked", f32, L.s_dims(), L.s_strides());
  g.pointwise("binary_select", CUDNN_POINTWISE_BINARY_SELECT, "binary_select", s1, neg_inf, keep, s2);
  // CompositeSoftmaxNode "softmax" with Stats: "Max", "sub", "exp", "sum", "log", "add",
  // "div".
  auto mx = virt("Max", f32, L.row_dims(), L.row_strides());
  g.reduction("Max", CUDNN_REDUCE_TENSOR_MAX, "max", s2, mx);
  auto sub = virt("sub_M", f32, L.s_dims(), L.s_strides());
  g.pointwise("sub", CUDNN_POINTWISE_SUB, "sub", s2, mx, nullptr, sub);
  auto ex = virt("exp_sub_M", f32, L.s_dims(), L.s_strides());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, "exp", sub, nullptr, nullptr, ex);
  auto sum = virt("SumExp", f32, L.row_dims(), L.row_strides());
  g.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, "add", ex, sum);
  auto lg = virt("log_SumExp", f32, L.row_dims(), L.row_strides());
  g.pointwise("log", CUDNN_POINTWISE_LOG, "log", sum, nullptr, nullptr, lg);
  g.pointwise("add", CUDNN_POINTWISE_ADD, "add", mx, lg, nullptr, stats);
  // "div": P = exp / sum, in the io dtype ("Requirement by cudnn backend to take in bmm2
  // aType as i/o type").
  auto p = virt("P", bf16, L.s_dims(), L.s_strides());
  g.pointwise("div", CUDNN_POINTWISE_DIV, "div", ex, sum, nullptr, p);
  // "bmm2": O = P @ V.
  g.matmul("bmm2", p, v, o);
}

void build_backward(Graph& g, const SdpaLayout& L) {
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const bool gqa = L.Hk != L.H;
  auto q = g.tensor("Q", bf16, L.q_dims(), L.q_strides(), false, kQ);
  // "maps the K->KT and V->VT".
  auto kt = g.tensor("KT", bf16, L.kvt_dims(), L.kvt_strides(), false, kK);
  auto vt = g.tensor("VT", bf16, L.kvt_dims(), L.kvt_strides(), false, kV);
  auto o = g.tensor("O", bf16, L.q_dims(), L.q_strides(), false, kO);
  auto dout = g.tensor("dO", bf16, L.q_dims(), L.q_strides(), false, kdO);
  auto stats = g.tensor("Stats", f32, L.row_dims(), L.row_strides(), false, kStats);
  auto dq = g.tensor("dQ", bf16, L.q_dims(), L.q_strides(), false, kdQ);
  auto dk = g.tensor("dK", bf16, L.kv_dims(), L.kv_strides(), false, kdK);
  auto dv = g.tensor("dV", bf16, L.kv_dims(), L.kv_strides(), false, kdV);
  auto scale = g.scalar("attn_scale", kScale);
  auto neg_inf = g.scalar("neg_inf", kNegInf);
  auto one = g.scalar("one", kOne);  // "one_tensor is needed for non-dropout graphs"
  auto virt = [&](const char* name, cudnnDataType_t t, const Dims& d, const Dims& s) {
    return g.tensor(name, t, d, s, true);
  };
  // --- "dO * o => softmax_sum" chain ---
  // "mul_dO_O": dO * O, dims {b, h_q, s_q, d_v}, strides {h_q*s_q*d_v, s_q*d_v, h_q*d_v, 1}.
  auto do_o = virt("dO_O", f32, L.q_dims(), {L.H * L.T * L.D, L.T * L.D, L.H * L.D, 1});
  g.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, "mul", dout, o, nullptr, do_o);
  // "reduce_dO_o": sum over d -> [b, h_q, s_q, 1].
  auto row_sum = virt("sum_dO_O", f32, L.row_dims(), L.row_strides());
  g.reduction("reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, "add", do_o, row_sum);
  // "scale_dropout_inv": * 1 -> softmax_sum, non-virtual fp32 [b, h_q, s_q, 1] (FE keeps it
  // in its workspace; here a buffer of ours).
  auto softmax_sum = g.tensor("softmax_sum", f32, L.row_dims(), L.row_strides(), false, kSoftmaxSum);
  g.pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL, "mul", row_sum, one, nullptr, softmax_sum);
  // --- "Q @ KT => exp_softmax => dV" chain ---
  // "matmul_Q_KT".
  auto s = virt("S", f32, L.s_dims(), L.s_strides());
  g.matmul("matmul_Q_KT", q, kt, s);
  // "mul_s_attn_scale".
  auto s1 = virt("S_scaled", f32, L.s_dims(), L.s_strides());
  g.pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, "mul", s, scale, nullptr, s1);
  // "sub_s_m": S - Stats.
  auto s2 = virt("S_minus_stats", f32, L.s_dims(), L.s_strides());
  g.pointwise("sub_s_m", CUDNN_POINTWISE_SUB, "sub", s1, stats, nullptr, s2);
  // Causal mask, as in the forward (CompositeDiagonalBandMaskNode).
  auto row = virt("row", CUDNN_DATA_INT32, L.s_dims(), L.s_strides());
  g.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, "gen_index", s2, nullptr, nullptr, row, f32, 2);
  auto col = virt("col", CUDNN_DATA_INT32, L.s_dims(), L.s_strides());
  g.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, "gen_index", s2, nullptr, nullptr, col, f32, 3);
  auto keep = virt("keep", CUDNN_DATA_BOOLEAN, L.s_dims(), L.s_strides());
  g.pointwise("row>col", CUDNN_POINTWISE_CMP_GE, "cmp_ge", row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  auto s3 = virt("S_masked", f32, L.s_dims(), L.s_strides());
  g.pointwise("binary_select", CUDNN_POINTWISE_BINARY_SELECT, "binary_select", s2, neg_inf, keep, s3);
  // "exp_s": P = exp(S - Stats).
  auto exp_s = virt("P", f32, L.s_dims(), L.s_strides());
  g.pointwise("exp_s", CUDNN_POINTWISE_EXP, "exp", s3, nullptr, nullptr, exp_s);
  // "reshape_p": P^T view {b, h_q, s_kv, s_q}, strides {.., 1, s_kv}, io dtype.
  auto pt = virt("PT", bf16, L.s_dims(), L.st_strides());
  g.reshape("reshape_p", exp_s, pt);
  // "matmul_pT_dO": dV = P^T @ dO; GQA: full-head dV then "red_dV_head" over each group.
  if (!gqa) {
    g.matmul("matmul_pT_dO", pt, dout, dv);
  } else {
    auto dv_full = virt("dV_fullhead", bf16, L.q_dims(), {L.H * L.T * L.D, L.T * L.D, L.D, 1});
    g.matmul("matmul_pT_dO", pt, dout, dv_full);
    g.reduction("red_dV_head", CUDNN_REDUCE_TENSOR_ADD, "add", dv_full, dv);
  }
  // --- "dO @ VT => dS_output => dK" chain ---
  // "matmul_dO_VT": dP = dO @ V^T.
  auto dp = virt("dP", f32, L.s_dims(), L.s_strides());
  g.matmul("matmul_dO_VT", dout, vt, dp);
  // "sub_dP_softmax_sum", "mul_dP_exp_s", "mul_dS_attn_scale" -> dS (fp32).
  auto dp1 = virt("dP_minus_sum", f32, L.s_dims(), L.s_strides());
  g.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, "sub", dp, softmax_sum, nullptr, dp1);
  auto dp2 = virt("dP_times_P", f32, L.s_dims(), L.s_strides());
  g.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, "mul", dp1, exp_s, nullptr, dp2);
  auto ds = virt("dS", f32, L.s_dims(), L.s_strides());
  g.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, "mul", dp2, scale, nullptr, ds);
  // "reshape_dS": dS^T view, io dtype; "matmul_dST_Q": dK = dS^T @ Q; GQA: "red_dK_head".
  auto dst = virt("dST", bf16, L.s_dims(), L.st_strides());
  g.reshape("reshape_dS", ds, dst);
  if (!gqa) {
    g.matmul("matmul_dST_Q", dst, q, dk);
  } else {
    auto dk_full = virt("dK_fullhead", bf16, L.q_dims(), {L.H * L.T * L.D, L.T * L.D, L.D, 1});
    g.matmul("matmul_dST_Q", dst, q, dk_full);
    g.reduction("red_dK_head", CUDNN_REDUCE_TENSOR_ADD, "add", dk_full, dk);
  }
  // --- "dp_scaled @ K => dQ" chain ---
  // "reshape_k": K^T back to K (dims and strides 2<->3). FE leaves its data type to the
  // graph's intermediate type: fp32, as its trace shows.
  auto k = virt("K", f32, L.kv_dims(), L.kv_strides());
  g.reshape("reshape_k", kt, k);
  // "matmul_dS_K": dQ = dS @ K, written directly (use_dp_workspace: deterministic).
  g.matmul("matmul_dS_K", ds, k, dq);
}

Status build(Graph& g, const AttentionShape& shape, bool backward, cudnnHandle_t handle) {
  TRIDENT_RETURN_IF_ERROR(validate_shape(shape));
  const SdpaLayout L{shape.B, shape.NH, shape.NKV, shape.T, shape.HD};
  if (backward) {
    build_backward(g, L);
  } else {
    build_forward(g, L);
  }
  g.finish(handle);
  if (!g.ok()) {
    return Status::internal(std::string("cuDNN SDPA ") + (backward ? "backward" : "forward") + " graph (" +
                            shape_str(shape) + "): " + g.error());
  }
  return Status::ok();
}

// An execution plan for a finalized graph: heuristics MODE_A then FALLBACK, the first
// engine config whose plan finalizes.
struct Plan {
  std::unique_ptr<Graph> graph;
  cudnnBackendDescriptor_t plan = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned;  // heuristics, configs, plan
  int64_t workspace = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
};

Result<std::unique_ptr<Plan>> make_plan(cudnnHandle_t handle, const AttentionShape& shape, bool backward) {
  auto plan = std::make_unique<Plan>();
  plan->graph = std::make_unique<Graph>();
  TRIDENT_RETURN_IF_ERROR(build(*plan->graph, shape, backward, handle));
  const std::string where =
      std::string("cuDNN SDPA ") + (backward ? "backward" : "forward") + " (" + shape_str(shape) + "): ";
  cudnnBackendDescriptor_t op_graph = plan->graph->graph();
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "MODE_A" : "FALLBACK";
    cudnnBackendDescriptor_t heur = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS) {
      return Status::internal(where + "create ENGINEHEUR: " + last_error());
    }
    plan->owned.push_back(heur);
    cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_graph);
    if (st == CUDNN_STATUS_SUCCESS) {
      st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    }
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += std::string(" ") + mode_name + ": heuristics " + cudnnGetErrorString(st) + " " + last_error() + ";";
      continue;
    }
    int64_t count = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                  nullptr);
    if (st != CUDNN_STATUS_SUCCESS || count <= 0) {
      tried += std::string(" ") + mode_name + ": 0 engine configs " + last_error() + ";";
      continue;
    }
    std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count), nullptr);
    for (auto& c : cfgs) {
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c) != CUDNN_STATUS_SUCCESS) {
        return Status::internal(where + "create ENGINECFG: " + last_error());
      }
      plan->owned.push_back(c);
    }
    int64_t got = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                  cfgs.data());
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += std::string(" ") + mode_name + ": reading results " + cudnnGetErrorString(st) + ";";
      continue;
    }
    for (int64_t i = 0; i < got; ++i) {
      cudnnBackendDescriptor_t p = nullptr;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) {
        return Status::internal(where + "create EXECUTION_PLAN: " + last_error());
      }
      st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &cfgs[static_cast<size_t>(i)]);
      }
      if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
      if (st != CUDNN_STATUS_SUCCESS) {
        tried += std::string(" ") + mode_name + " config " + std::to_string(i) + ": " + cudnnGetErrorString(st) +
                 " " + last_error() + ";";
        cudnnBackendDestroyDescriptor(p);
        continue;
      }
      plan->owned.push_back(p);
      int64_t ws = 0, n = 0;
      st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
      if (st != CUDNN_STATUS_SUCCESS) return Status::internal(where + "plan workspace size: " + last_error());
      plan->plan = p;
      plan->workspace = ws;
      return plan;
    }
  }
  return Status::internal(where + "no engine config finalizes an execution plan:" + tried);
}

class CudnnAttention final : public AttentionPath {
 public:
  CudnnAttention(Ops& ops, CUstream_st* stream, cudnnHandle_t handle)
      : ops_(ops), stream_(stream), handle_(handle) {}
  ~CudnnAttention() override {
    for (DevPtr* p : {&workspace_, &softmax_sum_, &dq_, &dk_, &dv_}) ops_.deallocate(*p);
    plans_.clear();
    if (handle_) cudnnDestroy(handle_);
  }

  const char* name() const override { return "cudnn"; }

  // Builds (or finds) both plans for s.
  Status prepare(const AttentionShape& s) override {
    TRIDENT_RETURN_IF_ERROR(validate_shape(s));
    for (bool backward : {false, true}) {
      auto plan = find_or_make(s, backward);
      if (!plan.is_ok()) return plan.status();
    }
    return Status::ok();
  }

  // The plans' workspace, the softmax sum (f32 [B, NH, T]) and the bf16 dq, dk, dv cuDNN
  // writes before they are accumulated (backward). 0 for a shape not prepared.
  size_t workspace_bytes(const AttentionShape& s) const override {
    int64_t ws = 0;
    for (bool backward : {false, true}) {
      auto it = plans_.find(key_of(s, backward));
      if (it == plans_.end()) return 0;
      ws = std::max(ws, it->second->workspace);
    }
    const size_t q = static_cast<size_t>(s.B) * s.T * s.NH * s.HD;
    const size_t kv = static_cast<size_t>(s.B) * s.T * s.NKV * s.HD;
    return static_cast<size_t>(ws) + static_cast<size_t>(s.B) * s.NH * s.T * sizeof(float) +
           (q + 2 * kv) * 2;
  }

  void forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, const AttentionShape& s) override {
    check_call(s, "forward", {out, q, k, v});
    TRIDENT_CHECK_MSG(!state.is_null(), "cuDNN attention forward: null state");
    Plan& p = plan_for(s, false);
    DevPtr ws = grow(workspace_, workspace_bytes_, static_cast<size_t>(p.workspace));
    float scale = 1.0f / std::sqrt(static_cast<float>(s.HD));
    float neg_inf = -std::numeric_limits<float>::infinity();
    std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
    std::vector<void*> ptrs = {q.raw(), k.raw(), v.raw(), out.raw(), state.raw(), &scale, &neg_inf};
    execute(p, uids, ptrs, ws, "forward", s);
  }

  void backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state, DevPtr q, DevPtr k,
                DevPtr v, const AttentionShape& s) override {
    check_call(s, "backward", {dq, dk, dv, dout, out, q, k, v});
    TRIDENT_CHECK_MSG(!state.is_null() && !dout.is_null() && !out.is_null(),
                      "cuDNN attention backward: null state, dout or out");
    if (dq.is_null() && dk.is_null() && dv.is_null()) return;
    Plan& p = plan_for(s, true);
    DevPtr ws = grow(workspace_, workspace_bytes_, static_cast<size_t>(p.workspace));
    const size_t q_elems = static_cast<size_t>(s.B) * s.T * s.NH * s.HD;
    const size_t kv_elems = static_cast<size_t>(s.B) * s.T * s.NKV * s.HD;
    DevPtr sum = grow(softmax_sum_, softmax_sum_bytes_, static_cast<size_t>(s.B) * s.NH * s.T * sizeof(float));
    // cuDNN overwrites its gradients; the contract accumulates: write into kept bf16
    // buffers, then add.
    DevPtr gq = grow(dq_, dq_bytes_, q_elems * 2).as(DType::kBF16);
    DevPtr gk = grow(dk_, dk_bytes_, kv_elems * 2).as(DType::kBF16);
    DevPtr gv = grow(dv_, dv_bytes_, kv_elems * 2).as(DType::kBF16);
    float scale = 1.0f / std::sqrt(static_cast<float>(s.HD));
    float neg_inf = -std::numeric_limits<float>::infinity();
    float one = 1.0f;
    std::vector<int64_t> uids = {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kScale, kNegInf, kOne, kSoftmaxSum};
    std::vector<void*> ptrs = {q.raw(),  k.raw(),  v.raw(),  out.raw(), dout.raw(), state.raw(), gq.raw(),
                               gk.raw(), gv.raw(), &scale,   &neg_inf,  &one,       sum.raw()};
    execute(p, uids, ptrs, ws, "backward", s);
    if (!dq.is_null()) ops_.accumulate(dq, gq, q_elems);
    if (!dk.is_null()) ops_.accumulate(dk, gk, kv_elems);
    if (!dv.is_null()) ops_.accumulate(dv, gv, kv_elems);
  }

 private:
  void check_call(const AttentionShape& s, const char* where, std::initializer_list<DevPtr> bufs) {
    TRIDENT_CHECK_MSG(s.dtype == DType::kBF16, std::string("cuDNN attention ") + where + ": call " +
                                                   shape_str(s) + " is " + dtype_name(s.dtype) +
                                                   ", not bf16");
    for (DevPtr b : bufs) {
      TRIDENT_CHECK_MSG(b.is_null() || b.dtype() == DType::kBF16,
                        std::string("cuDNN attention ") + where + ": a buffer is " + dtype_name(b.dtype()) +
                            ", not bf16");
    }
  }

  using Key = std::tuple<int, int, int, int, int, bool>;  // B, T, NH, NKV, HD, backward
  static Key key_of(const AttentionShape& s, bool backward) {
    return {s.B, s.T, s.NH, s.NKV, s.HD, backward};
  }
  // The cached plan for the shape, built on the first call of that shape.
  Result<Plan*> find_or_make(const AttentionShape& s, bool backward) {
    const Key key = key_of(s, backward);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    TRIDENT_RETURN_IF_ERROR(check_runtime_support(s, cudnnGetVersion()));
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<Plan> made, make_plan(handle_, s, backward));
    return plans_.emplace(key, std::move(made)).first->second.get();
  }
  // A call's plan; a shape without one is fatal here (the CUDA Ops prepares every shape it
  // sends to this path and sends the others to the plain path).
  Plan& plan_for(const AttentionShape& s, bool backward) {
    auto plan = find_or_make(s, backward);
    TRIDENT_CHECK_MSG(plan.is_ok(), plan.status().message());
    return *plan.value();
  }

  DevPtr grow(DevPtr& buf, size_t& bytes, size_t need) {
    if (need > bytes) {
      ops_.deallocate(buf);
      buf = ops_.allocate(need);
      bytes = need;
    }
    return buf;
  }

  void execute(Plan& p, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, DevPtr ws,
               const char* where, const AttentionShape& s) {
    const std::string what = std::string("cuDNN attention ") + where + " (" + shape_str(s) + "): ";
    cudnnStatus_t st = cudnnSetStream(handle_, stream_);
    TRIDENT_CHECK_MSG(st == CUDNN_STATUS_SUCCESS, what + "cudnnSetStream: " + cudnnGetErrorString(st));
    cudnnBackendDescriptor_t pack = nullptr;
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    TRIDENT_CHECK_MSG(st == CUDNN_STATUS_SUCCESS, what + "create VARIANT_PACK: " + cudnnGetErrorString(st));
    void* ws_ptr = ws.raw();
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                  static_cast<int64_t>(uids.size()), uids.data());
    if (st == CUDNN_STATUS_SUCCESS) {
      st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                    static_cast<int64_t>(ptrs.size()), ptrs.data());
    }
    if (st == CUDNN_STATUS_SUCCESS) {
      st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
    }
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle_, p.plan, pack);
    const std::string detail = st == CUDNN_STATUS_SUCCESS ? "" : last_error();
    cudnnBackendDestroyDescriptor(pack);
    TRIDENT_CHECK_MSG(st == CUDNN_STATUS_SUCCESS, what + "execute: " + cudnnGetErrorString(st) + " " + detail);
  }

  Ops& ops_;
  CUstream_st* stream_;
  cudnnHandle_t handle_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  DevPtr workspace_, softmax_sum_, dq_, dk_, dv_;
  size_t workspace_bytes_ = 0, softmax_sum_bytes_ = 0, dq_bytes_ = 0, dk_bytes_ = 0, dv_bytes_ = 0;
};

}  // namespace

Status build_cudnn_sdpa_graph(const AttentionShape& shape, bool backward, std::string* summary) {
  Graph g;
  TRIDENT_RETURN_IF_ERROR(build(g, shape, backward, /*handle=*/nullptr));
  if (summary != nullptr) *summary = g.summary();
  return Status::ok();
}

size_t cudnn_attention_state_bytes(const AttentionShape& s) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0) return 0;
  const size_t max = std::numeric_limits<size_t>::max();
  size_t n = static_cast<size_t>(s.B);
  for (size_t f : {static_cast<size_t>(s.NH), static_cast<size_t>(s.T), sizeof(float)}) {
    if (n > max / f) return max;
    n *= f;
  }
  return n;
}

Status cudnn_runtime_support(const AttentionShape& shape, size_t version) {
  return check_runtime_support(shape, version);
}

Result<std::unique_ptr<AttentionPath>> make_cudnn_attention(Ops& ops, CUstream_st* stream,
                                                            const AttentionShape& shape) {
  TRIDENT_RETURN_IF_ERROR(validate_shape(shape));
  TRIDENT_RETURN_IF_ERROR(check_runtime_support(shape, cudnnGetVersion()));
  cudnnHandle_t handle = nullptr;
  cudnnStatus_t st = cudnnCreate(&handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    return Status::internal(std::string("cuDNN attention: cudnnCreate failed: ") + cudnnGetErrorString(st) + " " +
                            last_error());
  }
  auto path = std::make_unique<CudnnAttention>(ops, stream, handle);
  Status prepared = path->prepare(shape);
  if (!prepared.is_ok()) return prepared;
  return std::unique_ptr<AttentionPath>(std::move(path));
}

}  // namespace trident::cuda
