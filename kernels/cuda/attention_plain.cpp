// The "plain" attention path (contract: attention.h): materialised scores through
// cuBLASLt, a causal softmax kernel, and their backward. The CUDA fallback and the
// GPU-side reference in tests.
//
// Layout. q, k, v are permuted to [B, H, T, HD]; there the G = NH / NKV query heads of kv
// head kv are the adjacent heads kv*G .. kv*G+G-1, so one kv group is one batch entry of
// the batched GEMMs with M = G*T rows against that group's T keys (llm.c attention.cuh
// for MHA; GQA without repeating k and v). Scores S and probabilities P are
// [B*NH*T, ld] with ld = T rounded up to 8 (16-byte rows for bf16, as cuBLASLt's
// alignment rule wants).
//
// Forward: S = Qg Kg^T (f32 D), P = causal_softmax(S / sqrt(HD)) in the io dtype (the
// state; with shape.recompute kept scratch instead, and backward recomputes S and P from
// q and k first: the same kernels on the same inputs, so the same bits), Og = P Vg,
// out = permute(Og).
// Backward: dVg = P^T dOg (the G*T rows of a group sum over its query heads), dP = dOg Vg^T,
// dS = P (dP - rowsum(P dP)) / sqrt(HD) in the io dtype, dQg = dS Kg, dKg = dS^T Qg; each
// gradient in f32, permuted back, then ops.accumulate into dq / dk / dv (one rounding of
// the sum for bf16 gradients).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_plain.h"
#include "kernels/cuda/gemm.h"
#include "kernels/ops.h"

namespace trident::cuda {

namespace {

int64_t padded_ld(int T) { return plain_attention_ld(T); }

// Per group (batch B*NKV): [G*T, ld] = [G*T, HD] @ [T, HD]^T, f32 D. Serves S = Qg Kg^T
// and dP = dOg Vg^T.
GemmDesc scores_desc(const AttentionShape& s, DType dt) {
  const int G = s.NH / s.NKV;
  GemmDesc g;
  g.M = G * s.T;
  g.N = s.T;
  g.K = s.HD;
  g.trans_b = true;
  g.ab_dtype = dt;
  g.d_dtype = DType::kF32;
  g.lda = s.HD;
  g.ldb = s.HD;
  g.ldd = padded_ld(s.T);
  g.batch = s.B * s.NKV;
  g.stride_a = static_cast<int64_t>(G) * s.T * s.HD;
  g.stride_b = static_cast<int64_t>(s.T) * s.HD;
  g.stride_d = static_cast<int64_t>(G) * s.T * padded_ld(s.T);
  return g;
}

// Per group: [G*T, HD] = [G*T, ld(T)] @ [T, HD]. Serves Og = P Vg and dQg = dS Kg.
GemmDesc pv_desc(const AttentionShape& s, DType dt, DType d_dtype) {
  const int G = s.NH / s.NKV;
  GemmDesc g;
  g.M = G * s.T;
  g.N = s.HD;
  g.K = s.T;
  g.ab_dtype = dt;
  g.d_dtype = d_dtype;
  g.lda = padded_ld(s.T);
  g.ldb = s.HD;
  g.ldd = s.HD;
  g.batch = s.B * s.NKV;
  g.stride_a = static_cast<int64_t>(G) * s.T * padded_ld(s.T);
  g.stride_b = static_cast<int64_t>(s.T) * s.HD;
  g.stride_d = static_cast<int64_t>(G) * s.T * s.HD;
  return g;
}

// Per group: [T, HD] = [G*T, ld(T)]^T @ [G*T, HD], f32 D. Serves dVg = P^T dOg and
// dKg = dS^T Qg; K = G*T sums over the group's query heads.
GemmDesc grad_kv_desc(const AttentionShape& s, DType dt) {
  const int G = s.NH / s.NKV;
  GemmDesc g;
  g.M = s.T;
  g.N = s.HD;
  g.K = G * s.T;
  g.trans_a = true;
  g.ab_dtype = dt;
  g.d_dtype = DType::kF32;
  g.lda = padded_ld(s.T);
  g.ldb = s.HD;
  g.ldd = s.HD;
  g.batch = s.B * s.NKV;
  g.stride_a = static_cast<int64_t>(G) * s.T * padded_ld(s.T);
  g.stride_b = static_cast<int64_t>(G) * s.T * s.HD;
  g.stride_d = static_cast<int64_t>(s.T) * s.HD;
  return g;
}

// a * b, or SIZE_MAX when it would wrap.
size_t mul_sat(size_t a, size_t b) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a) return std::numeric_limits<size_t>::max();
  return a * b;
}

// A kept scratch buffer that grows (reallocates through the Ops) only when a call needs
// more than any call before.
class Scratch {
 public:
  DevPtr get(Ops& ops, size_t bytes, DType dtype) {
    if (bytes > bytes_) {
      ops.deallocate(ptr_);
      ptr_ = ops.allocate(bytes);
      bytes_ = bytes;
    }
    return ptr_.as(dtype);
  }
  void release(Ops& ops) {
    ops.deallocate(ptr_);
    ptr_ = DevPtr();
    bytes_ = 0;
  }

 private:
  DevPtr ptr_;
  size_t bytes_ = 0;
};

class PlainAttention final : public AttentionPath {
 public:
  PlainAttention(Ops& ops, GemmEngine& gemm, CUstream_st* stream) : ops_(ops), gemm_(gemm), stream_(stream) {}
  ~PlainAttention() override {
    for (Scratch* s : {&q_, &k_, &v_, &o_, &scores_, &ds_, &grad_, &grad_out_, &probs_}) s->release(ops_);
  }

  const char* name() const override { return "plain"; }

  Status prepare(const AttentionShape& s) override {
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.HD <= 0 || s.NH % s.NKV != 0 ||
        !is_float_dtype(s.dtype)) {
      return Status::invalid_input("plain attention: bad shape B=" + std::to_string(s.B) + " T=" +
                                   std::to_string(s.T) + " NH=" + std::to_string(s.NH) + " NKV=" +
                                   std::to_string(s.NKV) + " HD=" + std::to_string(s.HD) + " " +
                                   dtype_name(s.dtype));
    }
    return Status::ok();
  }

  // The kept scratch a call of this shape grows: q, k, v, out/dout permuted (io dtype),
  // the scores / dP (f32) and dS (io dtype), two f32 gradients, and with recompute the
  // probabilities (io dtype).
  size_t workspace_bytes(const AttentionShape& s) const override {
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.HD <= 0) return 0;
    const size_t e = dtype_size(s.dtype);
    const size_t rows = mul_sat(mul_sat(static_cast<size_t>(s.B), static_cast<size_t>(s.NH)),
                                static_cast<size_t>(s.T));
    const size_t q = mul_sat(rows, static_cast<size_t>(s.HD));
    const size_t kv = mul_sat(mul_sat(mul_sat(static_cast<size_t>(s.B), static_cast<size_t>(s.NKV)),
                                      static_cast<size_t>(s.T)),
                              static_cast<size_t>(s.HD));
    const size_t scores = mul_sat(rows, static_cast<size_t>(padded_ld(s.T)));
    size_t total = 0;
    for (size_t part : {mul_sat(q, 2 * e), mul_sat(kv, 2 * e), mul_sat(scores, sizeof(float)),
                        mul_sat(scores, e), mul_sat(q, 2 * sizeof(float)),
                        s.recompute ? mul_sat(scores, e) : size_t{0}}) {
      if (total > std::numeric_limits<size_t>::max() - part) return std::numeric_limits<size_t>::max();
      total += part;
    }
    return total;
  }

  void forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, const AttentionShape& s) override {
    check_shape(s, "forward");
    const DType dt = s.dtype;
    check_dtypes("forward", dt, {{out, "out"}, {q, "q"}, {k, "k"}, {v, "v"}});
    TRIDENT_CHECK_MSG(!state.is_null(), "plain attention forward: null state");
    const Dims d = dims(s);
    DevPtr qp = q_.get(ops_, d.q_elems * d.esize, dt);
    DevPtr kp = k_.get(ops_, d.kv_elems * d.esize, dt);
    DevPtr vp = v_.get(ops_, d.kv_elems * d.esize, dt);
    DevPtr op = o_.get(ops_, d.q_elems * d.esize, dt);
    DevPtr scores = scores_.get(ops_, d.score_elems * sizeof(float), DType::kF32);
    DevPtr probs = s.recompute ? probs_.get(ops_, d.score_elems * d.esize, dt) : state.as(dt);
    permute_bthd_to_bhtd(qp.raw(), q.raw(), dt, s.B, s.T, s.NH, s.HD, stream_);
    permute_bthd_to_bhtd(kp.raw(), k.raw(), dt, s.B, s.T, s.NKV, s.HD, stream_);
    permute_bthd_to_bhtd(vp.raw(), v.raw(), dt, s.B, s.T, s.NKV, s.HD, stream_);
    gemm_.run(scores_desc(s, dt), qp, kp, scores);  // S = Qg Kg^T
    causal_softmax_forward(probs.raw(), dt, scores.raw_as<float>(), d.rows, s.T, d.ld, d.scale, stream_);
    gemm_.run(pv_desc(s, dt, dt), probs, vp, op);  // Og = P Vg
    permute_bhtd_to_bthd(out.raw(), op.raw(), dt, s.B, s.T, s.NH, s.HD, stream_);
  }

  void backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state, DevPtr q, DevPtr k,
                DevPtr v, const AttentionShape& s) override {
    (void)out;  // the probabilities are kept; the flash path needs out, this one does not
    check_shape(s, "backward");
    const DType dt = s.dtype;
    check_dtypes("backward", dt, {{dq, "dq"}, {dk, "dk"}, {dv, "dv"}, {dout, "dout"}, {q, "q"}, {k, "k"},
                                  {v, "v"}});
    TRIDENT_CHECK_MSG(!state.is_null() && !dout.is_null(), "plain attention backward: null state or dout");
    if (dq.is_null() && dk.is_null() && dv.is_null()) return;
    const Dims d = dims(s);
    DevPtr qp = q_.get(ops_, d.q_elems * d.esize, dt);
    DevPtr kp = k_.get(ops_, d.kv_elems * d.esize, dt);
    DevPtr vp = v_.get(ops_, d.kv_elems * d.esize, dt);
    DevPtr dop = o_.get(ops_, d.q_elems * d.esize, dt);
    DevPtr probs = state.as(dt);
    if (s.recompute) {  // P again, as forward computed it
      DevPtr scores = scores_.get(ops_, d.score_elems * sizeof(float), DType::kF32);
      probs = probs_.get(ops_, d.score_elems * d.esize, dt);
      permute_bthd_to_bhtd(qp.raw(), q.raw(), dt, s.B, s.T, s.NH, s.HD, stream_);
      permute_bthd_to_bhtd(kp.raw(), k.raw(), dt, s.B, s.T, s.NKV, s.HD, stream_);
      gemm_.run(scores_desc(s, dt), qp, kp, scores);
      causal_softmax_forward(probs.raw(), dt, scores.raw_as<float>(), d.rows, s.T, d.ld, d.scale, stream_);
    }
    DevPtr grad = grad_.get(ops_, d.q_elems * sizeof(float), DType::kF32);          // [B, H, T, HD]
    DevPtr grad_out = grad_out_.get(ops_, d.q_elems * sizeof(float), DType::kF32);  // [B, T, H, HD]
    permute_bthd_to_bhtd(dop.raw(), dout.raw(), dt, s.B, s.T, s.NH, s.HD, stream_);
    if (!dv.is_null()) {  // dVg[T, HD] = P^T dOg, summed over the group's G*T rows
      gemm_.run(grad_kv_desc(s, dt), probs, dop, grad);
      accumulate_from(dv, grad, grad_out, s.NKV, s);
    }
    if (dq.is_null() && dk.is_null()) return;
    DevPtr dp = scores_.get(ops_, d.score_elems * sizeof(float), DType::kF32);
    DevPtr ds = ds_.get(ops_, d.score_elems * d.esize, dt);
    permute_bthd_to_bhtd(vp.raw(), v.raw(), dt, s.B, s.T, s.NKV, s.HD, stream_);
    gemm_.run(scores_desc(s, dt), dop, vp, dp);  // dP = dOg Vg^T
    causal_softmax_backward(ds.raw(), probs.raw(), dt, dp.raw_as<float>(), d.rows, s.T, d.ld, d.scale, stream_);
    if (!dq.is_null()) {  // dQg = dS Kg
      permute_bthd_to_bhtd(kp.raw(), k.raw(), dt, s.B, s.T, s.NKV, s.HD, stream_);
      gemm_.run(pv_desc(s, dt, DType::kF32), ds, kp, grad);
      accumulate_from(dq, grad, grad_out, s.NH, s);
    }
    if (!dk.is_null()) {  // dKg = dS^T Qg, summed over the group's G*T rows
      permute_bthd_to_bhtd(qp.raw(), q.raw(), dt, s.B, s.T, s.NH, s.HD, stream_);
      gemm_.run(grad_kv_desc(s, dt), ds, qp, grad);
      accumulate_from(dk, grad, grad_out, s.NKV, s);
    }
  }

 private:
  struct Dims {
    size_t esize;
    int64_t ld, rows;
    size_t q_elems, kv_elems, score_elems;
    float scale;
  };

  static Dims dims(const AttentionShape& s) {
    Dims d;
    d.esize = dtype_size(s.dtype);
    d.ld = padded_ld(s.T);
    d.rows = static_cast<int64_t>(s.B) * s.NH * s.T;
    d.q_elems = static_cast<size_t>(d.rows) * s.HD;
    d.kv_elems = static_cast<size_t>(s.B) * s.NKV * s.T * s.HD;
    d.score_elems = static_cast<size_t>(d.rows) * static_cast<size_t>(d.ld);
    d.scale = 1.0f / std::sqrt(static_cast<float>(s.HD));
    return d;
  }

  static void check_shape(const AttentionShape& s, const char* where) {
    TRIDENT_CHECK_MSG(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HD > 0 && s.NH % s.NKV == 0,
                      std::string("plain attention ") + where + ": bad shape B=" + std::to_string(s.B) +
                          " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                          " NKV=" + std::to_string(s.NKV) + " HD=" + std::to_string(s.HD));
    TRIDENT_CHECK_MSG(is_float_dtype(s.dtype), std::string("plain attention ") + where + ": dtype " +
                                                   dtype_name(s.dtype) + " is not f32 or bf16");
  }

  struct Named {
    DevPtr p;
    const char* name;
  };
  static void check_dtypes(const char* where, DType dt, std::initializer_list<Named> args) {
    for (const Named& a : args) {
      TRIDENT_CHECK_MSG(a.p.is_null() || a.p.dtype() == dt,
                        std::string("plain attention ") + where + ": " + a.name + " is " +
                            dtype_name(a.p.dtype()) + ", the call's dtype is " + dtype_name(dt));
    }
  }

  // dst[B, T, H, HD] += permute(grad[B, H, T, HD]) (f32 grad, dst in the call's dtype).
  void accumulate_from(DevPtr dst, DevPtr grad, DevPtr tmp, int H, const AttentionShape& s) {
    permute_bhtd_to_bthd(tmp.raw(), grad.raw(), DType::kF32, s.B, s.T, H, s.HD, stream_);
    ops_.accumulate(dst, tmp, static_cast<size_t>(s.B) * s.T * H * s.HD);
  }

  Ops& ops_;
  GemmEngine& gemm_;
  CUstream_st* stream_;
  // Kept scratch: permuted q, k, v, the permuted out / dout, scores or dP (f32), dS, the
  // f32 gradient before and after its permute, and the probabilities under recompute.
  Scratch q_, k_, v_, o_, scores_, ds_, grad_, grad_out_, probs_;
};

}  // namespace

size_t plain_attention_state_bytes(const AttentionShape& s) {
  if (s.recompute || s.B <= 0 || s.T <= 0 || s.NH <= 0) return 0;
  const size_t rows = mul_sat(mul_sat(static_cast<size_t>(s.B), static_cast<size_t>(s.NH)),
                              static_cast<size_t>(s.T));
  return mul_sat(mul_sat(rows, static_cast<size_t>(padded_ld(s.T))), dtype_size(s.dtype));
}

PlainAttentionGemms plain_attention_gemms(const AttentionShape& shape) {
  return {scores_desc(shape, shape.dtype), pv_desc(shape, shape.dtype, shape.dtype),
          pv_desc(shape, shape.dtype, DType::kF32), grad_kv_desc(shape, shape.dtype)};
}

std::unique_ptr<AttentionPath> make_plain_attention(Ops& ops, GemmEngine& gemm, CUstream_st* stream) {
  return std::make_unique<PlainAttention>(ops, gemm, stream);
}

}  // namespace trident::cuda
