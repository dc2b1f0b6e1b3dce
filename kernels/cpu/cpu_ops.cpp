// CpuOps: the Ops interface over the free functions of kernels/cpu/cpu_kernels.h.
//
// Every entry point runs inside a Call: it sets this thread's OpenMP thread count to the
// object's own (so two CpuOps objects with different counts can be used alternately from
// one thread; the OpenMP build of OpenBLAS follows omp_get_max_threads()), opens a
// DeviceAccessScope (the checked backend makes device memory accessible only inside one),
// and checks every argument's dtype (kernels/ops.h), CHECK-failing with the op and the
// argument's name.
//
// bf16 storage: the kernels are fp32 only. An F argument that is f32 reaches them as its
// own pointer (so all-f32 calls are bitwise the fp32 kernels); a bf16 one goes through an
// F32In (widened exactly into scratch before the kernel) or an F32Out (scratch the kernel
// writes, rounded to nearest even into the bf16 buffer once, when the F32Out goes out of
// scope; an updating output is widened first). Inputs are widened before any output is
// stored, so outputs that alias inputs (add, cross-entropy backward) stay correct. The
// scratch is grow-only and owned by the object: no allocation per call once warm.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device_access.h"
#include "core/tensor.h"
#include "kernels/cpu/checked_memory.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/sgemm_peak.h"
#include "kernels/ops.h"

namespace trident {
namespace {

void widen(float* dst, const bf16_t* src, size_t n) {
  cpu::parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) dst[i] = bf16_to_float(src[i]);
  });
}

void round_to_bf16(bf16_t* dst, const float* src, size_t n) {
  cpu::parallel_blocks(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) dst[i] = float_to_bf16(src[i]);
  });
}

// Grow-only fp32 buffers handed out in order within one call (reset by each Call).
class Scratch {
 public:
  void reset() { next_ = 0; }
  float* take(size_t n) {
    if (next_ == buffers_.size()) buffers_.emplace_back();
    std::vector<float>& b = buffers_[next_++];
    if (b.size() < n) b.resize(n);
    return b.data();
  }

 private:
  std::vector<std::vector<float>> buffers_;  // moved on growth; their data stays put
  size_t next_ = 0;
};

// One entry point's context: thread count, device access, dtype checks, scratch.
class Call {
 public:
  Call(int threads, Scratch& scratch, const char* op) : scratch_(scratch), op_(op) {
    omp_set_num_threads(threads);
    scratch_.reset();
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // A null pointer is "absent" and passes any check.
  void expect(DevPtr p, DType want, const char* arg) const {
    if (!p.is_null() && p.dtype() != want) wrong_dtype(p, dtype_name(want), arg);
  }
  void expect_float(DevPtr p, const char* arg) const {
    if (!p.is_null() && !is_float_dtype(p.dtype())) wrong_dtype(p, "f32 or bf16", arg);
  }
  float* f32(DevPtr p, const char* arg) const {
    expect(p, DType::kF32, arg);
    return static_cast<float*>(p.raw());
  }
  const int32_t* i32(DevPtr p, const char* arg) const {
    expect(p, DType::kI32, arg);
    return static_cast<const int32_t*>(p.raw());
  }
  int32_t* i32_out(DevPtr p, const char* arg) const {
    expect(p, DType::kI32, arg);
    return static_cast<int32_t*>(p.raw());
  }
  double* f64(DevPtr p, const char* arg) const {
    expect(p, DType::kF64, arg);
    return static_cast<double*>(p.raw());
  }
  void* bytes(DevPtr p, const char* arg) const {
    expect(p, DType::kU8, arg);
    return p.raw();
  }
  float* take(size_t n) { return scratch_.take(n); }

 private:
  [[noreturn]] void wrong_dtype(DevPtr p, const char* want, const char* arg) const {
    check_failed("argument dtype",
                 std::string("cpu ") + op_ + ": argument " + arg + " has dtype " +
                     dtype_name(p.dtype()) + ", want " + want,
                 __FILE__, __LINE__);
  }

  Scratch& scratch_;
  const char* op_;
  DeviceAccessScope scope_;  // open for the whole call, outputs' rounding included
};

// An F input of n elements as const float*: the buffer itself (f32) or a widened copy.
class F32In {
 public:
  F32In(Call& call, DevPtr p, size_t n, const char* arg) {
    call.expect_float(p, arg);
    if (p.is_null() || p.dtype() == DType::kF32) {
      ptr_ = static_cast<const float*>(p.raw());
    } else {
      float* w = call.take(n);
      widen(w, static_cast<const bf16_t*>(p.raw()), n);
      ptr_ = w;
    }
  }
  F32In(const F32In&) = delete;
  F32In& operator=(const F32In&) = delete;
  operator const float*() const { return ptr_; }

 private:
  const float* ptr_ = nullptr;
};

// How an F output is written: overwritten, or read-modify-written (accumulating
// gradients, in-place ops).
enum class Store { kOverwrite, kUpdate };

// An F output of n elements as float*: the buffer itself (f32), or scratch rounded into
// the bf16 buffer once, at destruction (widened first for kUpdate).
class F32Out {
 public:
  F32Out(Call& call, DevPtr p, size_t n, const char* arg, Store store) : n_(n) {
    call.expect_float(p, arg);
    if (p.is_null() || p.dtype() == DType::kF32) {
      ptr_ = static_cast<float*>(p.raw());
    } else {
      bf16_ = static_cast<bf16_t*>(p.raw());
      ptr_ = call.take(n);
      if (store == Store::kUpdate) widen(ptr_, bf16_, n);
    }
  }
  ~F32Out() {
    if (bf16_ != nullptr) round_to_bf16(bf16_, ptr_, n_);
  }
  F32Out(const F32Out&) = delete;
  F32Out& operator=(const F32Out&) = delete;
  operator float*() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
  bf16_t* bf16_ = nullptr;  // non-null: round ptr_ into it at the end
  size_t n_;
};

size_t elems(int a, int b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }
size_t elems(int a, int b, int c, int d) { return elems(a, b) * elems(c, d); }

// The positions [0, keys) of each of B sequences of a [B, capacity, width] key/value cache
// as f32 rows: the buffer itself (`capacity` rows per sequence), or just those positions
// widened into scratch (`keys` rows per sequence), so a bf16 cache costs the positions
// read, not its capacity.
struct CacheRows {
  const float* data;
  int rows_per_sequence;
};
CacheRows cache_rows(Call& call, DevPtr p, int B, int keys, int capacity, int width,
                     const char* arg) {
  call.expect_float(p, arg);
  if (p.dtype() == DType::kF32) return {static_cast<const float*>(p.raw()), capacity};
  const size_t used = elems(keys, width);
  float* w = call.take(elems(B, 1) * used);
  for (int b = 0; b < B; ++b) {
    widen(w + static_cast<size_t>(b) * used,
          static_cast<const bf16_t*>(p.raw()) + static_cast<size_t>(b) * elems(capacity, width),
          used);
  }
  return {w, keys};
}

class CpuOps final : public Ops {
 public:
  CpuOps(int threads, bool checked)
      : threads_(threads > 0 ? threads : omp_get_num_procs()), checked_(checked) {
    omp_set_num_threads(threads_);
  }
  const char* name() const override { return "cpu"; }
  // The GEMM kernels OpenBLAS picked for this CPU (a DYNAMIC_ARCH build chooses per CPU
  // model): fp32 results differ in their last bits between kernel sets, so a bitwise
  // comparison with a run elsewhere holds only on the same kernels.
  std::string description() const override {
    return std::string("cpu (OpenBLAS ") + openblas_get_corename() + " kernels, " +
           std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
  }
  double peak_flops() const override {
    if (peak_flops_ == 0) {  // measured once, at this object's thread count
      omp_set_num_threads(threads_);
      peak_flops_ = measure_sgemm_peak_gflops() * 1e9;
    }
    return peak_flops_;
  }

  void zero(DevPtr dst, size_t bytes) override {
    Call c = call("zero");
    // The large fills (the gradient buffer, activation gradients before a backward
    // accumulates into them) are memory-bound, and two cores write faster than one. The
    // split cannot change a result: every byte becomes 0 whoever writes it.
    constexpr size_t kChunk = size_t{1} << 18;
    char* p = static_cast<char*>(dst.raw());
    const long chunks = static_cast<long>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks >= 4)
    for (long i = 0; i < chunks; ++i) {
      const size_t b = static_cast<size_t>(i) * kChunk;
      std::memset(p + b, 0, std::min(kChunk, bytes - b));
    }
  }
  void copy(DevPtr dst, DevPtr src, size_t bytes) override {
    Call c = call("copy");
    if (bytes > 0) std::memmove(dst.raw(), src.raw(), bytes);
  }
  void cast(DevPtr dst, DevPtr src, size_t n) override {
    Call c = call("cast");
    c.expect_float(dst, "dst");
    c.expect_float(src, "src");
    if (n == 0) return;
    if (dst.dtype() == src.dtype()) {
      std::memmove(dst.raw(), src.raw(), n * dtype_size(dst.dtype()));
    } else if (dst.dtype() == DType::kBF16) {
      round_to_bf16(static_cast<bf16_t*>(dst.raw()), static_cast<const float*>(src.raw()), n);
    } else {
      widen(static_cast<float*>(dst.raw()), static_cast<const bf16_t*>(src.raw()), n);
    }
  }

  void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T, int C,
                         int vocab_begin, int vocab_local) override {
    Call c = call("embedding_forward");
    F32In wte_f(c, wte, elems(vocab_local, C), "wte");
    F32In wpe_f(c, wpe, elems(T, C), "wpe");
    F32Out out_f(c, out, elems(B * T, C), "out", Store::kOverwrite);
    cpu::embedding_forward(out_f, c.i32(tokens, "tokens"), wte_f, wpe_f, B, T, C, vocab_begin,
                           vocab_local);
  }
  void embedding_backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B, int T, int C,
                          int vocab_begin, int vocab_local) override {
    Call c = call("embedding_backward");
    F32In dout_f(c, dout, elems(B * T, C), "dout");
    cpu::embedding_backward(c.f32(dwte, "dwte"), c.f32(dwpe, "dwpe"), dout_f,
                            c.i32(tokens, "tokens"), B, T, C, vocab_begin, vocab_local);
  }

  void layernorm_forward(DevPtr out, DevPtr mean, DevPtr rstd, DevPtr inp, DevPtr weight,
                         DevPtr bias, int N, int C, float eps) override {
    Call c = call("layernorm_forward");
    F32In inp_f(c, inp, elems(N, C), "inp");
    F32In weight_f(c, weight, static_cast<size_t>(C), "weight");
    F32In bias_f(c, bias, static_cast<size_t>(C), "bias");
    F32Out out_f(c, out, elems(N, C), "out", Store::kOverwrite);
    cpu::layernorm_forward(out_f, c.f32(mean, "mean"), c.f32(rstd, "rstd"), inp_f, weight_f, bias_f,
                           N, C, eps);
  }
  void layernorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                          DevPtr weight, DevPtr mean, DevPtr rstd, int N, int C) override {
    Call c = call("layernorm_backward");
    F32In dout_f(c, dout, elems(N, C), "dout");
    F32In inp_f(c, inp, elems(N, C), "inp");
    F32In weight_f(c, weight, static_cast<size_t>(C), "weight");
    F32Out dinp_f(c, dinp, elems(N, C), "dinp", Store::kUpdate);
    cpu::layernorm_backward(dinp_f, c.f32(dweight, "dweight"), c.f32(dbias, "dbias"), dout_f, inp_f,
                            weight_f, c.f32(mean, "mean"), c.f32(rstd, "rstd"), N, C);
  }
  void rmsnorm_forward(DevPtr out, DevPtr rstd, DevPtr inp, DevPtr weight, int N, int C,
                       float eps) override {
    Call c = call("rmsnorm_forward");
    F32In inp_f(c, inp, elems(N, C), "inp");
    F32In weight_f(c, weight, static_cast<size_t>(C), "weight");
    F32Out out_f(c, out, elems(N, C), "out", Store::kOverwrite);
    cpu::rmsnorm_forward(out_f, c.f32(rstd, "rstd"), inp_f, weight_f, N, C, eps);
  }
  void rmsnorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dout, DevPtr inp, DevPtr weight,
                        DevPtr rstd, int N, int C) override {
    Call c = call("rmsnorm_backward");
    F32In dout_f(c, dout, elems(N, C), "dout");
    F32In inp_f(c, inp, elems(N, C), "inp");
    F32In weight_f(c, weight, static_cast<size_t>(C), "weight");
    F32Out dinp_f(c, dinp, elems(N, C), "dinp", Store::kUpdate);
    cpu::rmsnorm_backward(dinp_f, c.f32(dweight, "dweight"), dout_f, inp_f, weight_f,
                          c.f32(rstd, "rstd"), N, C);
  }

  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    Call c = call("matmul_forward");
    F32In inp_f(c, inp, elems(N, IC), "inp");
    F32In weight_f(c, weight, elems(OC, IC), "weight");
    F32In bias_f(c, bias, static_cast<size_t>(OC), "bias");
    F32Out out_f(c, out, elems(N, OC), "out", Store::kOverwrite);
    cpu::matmul_forward(out_f, inp_f, weight_f, bias_f, N, IC, OC);
  }
  using Ops::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    Call c = call("matmul_backward");
    F32In dout_f(c, dout, elems(N, OC), "dout");
    F32In inp_f(c, inp, elems(N, IC), "inp");
    F32In weight_f(c, weight, elems(OC, IC), "weight");
    const bool set = dinp_write == GradWrite::kSet;
    F32Out dinp_f(c, dinp, elems(N, IC), "dinp", set ? Store::kOverwrite : Store::kUpdate);
    cpu::matmul_backward(dinp_f, c.f32(dweight, "dweight"), c.f32(dbias, "dbias"), dout_f, inp_f,
                         weight_f, N, IC, OC, set);
  }

  void rope_forward(DevPtr x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Call c = call("rope_forward");
    F32Out x_f(c, x, elems(B, T, H, HD), "x", Store::kUpdate);
    cpu::rope_forward(x_f, B, T, H, HD, theta, pos_offset);
  }
  void rope_backward(DevPtr dx, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Call c = call("rope_backward");
    F32Out dx_f(c, dx, elems(B, T, H, HD), "dx", Store::kUpdate);
    cpu::rope_backward(dx_f, B, T, H, HD, theta, pos_offset);
  }
  void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset) override {
    Call c = call("qkv_split");
    TRIDENT_CHECK_MSG(HD % 2 == 0, "qkv_split: head_dim " + std::to_string(HD) + " is odd");
    const size_t rows = elems(B, T);
    F32In qkv_f(c, qkv, rows * static_cast<size_t>((NH + 2 * NKV) * HD), "qkv");
    F32Out q_f(c, q, elems(B, T, NH, HD), "q", Store::kOverwrite);
    F32Out k_f(c, k, elems(B, T, NKV, HD), "k", Store::kOverwrite);
    F32Out v_f(c, v, elems(B, T, NKV, HD), "v", Store::kOverwrite);
    cpu::qkv_split(q_f, k_f, v_f, qkv_f, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset) override {
    Call c = call("qkv_merge");
    TRIDENT_CHECK_MSG(HD % 2 == 0, "qkv_merge: head_dim " + std::to_string(HD) + " is odd");
    const size_t rows = elems(B, T);
    F32In dq_f(c, dq, elems(B, T, NH, HD), "dq");
    F32In dk_f(c, dk, elems(B, T, NKV, HD), "dk");
    F32In dv_f(c, dv, elems(B, T, NKV, HD), "dv");
    F32Out dqkv_f(c, dqkv, rows * static_cast<size_t>((NH + 2 * NKV) * HD), "dqkv",
                  Store::kOverwrite);
    cpu::qkv_merge(dqkv_f, dq_f, dk_f, dv_f, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  // The state is the softmax probabilities [B, NH, T, T] as fp32 (upper triangle 0), the
  // exact arithmetic of cpu::attention_forward / _backward; `out` is not needed by
  // backward.
  // The probabilities [B, NH, T, T], f32 whatever the io dtype (the CPU's attention
  // computes in f32: kernels/cpu/attention.cpp).
  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD, DType) const override {
    (void)NKV;
    (void)HD;
    size_t floats = 0;
    if (__builtin_mul_overflow(static_cast<size_t>(B) * static_cast<size_t>(NH),
                               static_cast<size_t>(T), &floats) ||
        __builtin_mul_overflow(floats, static_cast<size_t>(T), &floats) ||
        __builtin_mul_overflow(floats, sizeof(float), &floats)) {
      return SIZE_MAX;
    }
    return floats;
  }
  void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T,
                         int NH, int NKV, int HD) override {
    Call c = call("attention_forward");
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0,
                      "attention NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    F32In q_f(c, q, elems(B, T, NH, HD), "q");
    F32In k_f(c, k, elems(B, T, NKV, HD), "k");
    F32In v_f(c, v, elems(B, T, NKV, HD), "v");
    F32Out out_f(c, out, elems(B, T, NH, HD), "out", Store::kOverwrite);
    cpu::attention_forward(out_f, static_cast<float*>(c.bytes(state, "state")), q_f, k_f, v_f, B, T,
                           NH, NKV, HD);
  }
  void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                          DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH, int NKV,
                          int HD) override {
    Call c = call("attention_backward");
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0,
                      "attention NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    c.expect_float(out, "out");  // not read: the state holds the probabilities
    F32In dout_f(c, dout, elems(B, T, NH, HD), "dout");
    F32In q_f(c, q, elems(B, T, NH, HD), "q");
    F32In k_f(c, k, elems(B, T, NKV, HD), "k");
    F32In v_f(c, v, elems(B, T, NKV, HD), "v");
    F32Out dq_f(c, dq, elems(B, T, NH, HD), "dq", Store::kUpdate);
    F32Out dk_f(c, dk, elems(B, T, NKV, HD), "dk", Store::kUpdate);
    F32Out dv_f(c, dv, elems(B, T, NKV, HD), "dv", Store::kUpdate);
    cpu::attention_backward(dq_f, dk_f, dv_f, dout_f, q_f, k_f, v_f,
                            static_cast<const float*>(c.bytes(state, "state")), B, T, NH, NKV, HD);
  }

  void attention_cached_forward(DevPtr out, DevPtr q, DevPtr k_cache, DevPtr v_cache, int B,
                                int Tq, int pos, int capacity, int NH, int NKV,
                                int HD) override {
    Call c = call("attention_cached_forward");
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0 && B >= 1 && Tq >= 1 && pos >= 0 &&
                          pos <= capacity - Tq,
                      "attention_cached_forward B=" + std::to_string(B) + " Tq=" +
                          std::to_string(Tq) + " pos=" + std::to_string(pos) + " capacity=" +
                          std::to_string(capacity) + " NH=" + std::to_string(NH) +
                          " NKV=" + std::to_string(NKV));
    for (const DevPtr& p : {q, k_cache, v_cache}) {
      TRIDENT_CHECK_MSG(p.dtype() == out.dtype(),
                        std::string("cpu attention_cached_forward: q, the caches and out must "
                                    "share one dtype (out is ") +
                            dtype_name(out.dtype()) + ", an input " + dtype_name(p.dtype()) + ")");
    }
    check_extent(out, elems(B, Tq, NH, HD), "attention_cached_forward", "out");
    check_extent(q, elems(B, Tq, NH, HD), "attention_cached_forward", "q");
    check_extent(k_cache, elems(B, capacity, NKV, HD), "attention_cached_forward", "k_cache");
    check_extent(v_cache, elems(B, capacity, NKV, HD), "attention_cached_forward", "v_cache");
    const int keys = pos + Tq;
    F32In q_f(c, q, elems(B, Tq, NH, HD), "q");
    const CacheRows k = cache_rows(c, k_cache, B, keys, capacity, NKV * HD, "k_cache");
    const CacheRows v = cache_rows(c, v_cache, B, keys, capacity, NKV * HD, "v_cache");
    F32Out out_f(c, out, elems(B, Tq, NH, HD), "out", Store::kOverwrite);
    cpu::attention_cached_forward(out_f, q_f, k.data, v.data, B, Tq, pos, k.rows_per_sequence,
                                  NH, NKV, HD);
  }

  // Block attention: every buffer is the span from its pointer to the block's last row
  // (rows at a stride, kernels/ops.h), widened and rounded as one. A strided F output is
  // updated, not overwritten, so that the rows between the block's, widened and rounded
  // back unchanged, keep their bits.
  void attention_block_forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                               const AttentionBlock& s) override {
    Call c = call("attention_block_forward");
    const BlockSpans n = block_spans(s, "attention_block_forward", true);
    check_extents("attention_block_forward", {{out, n.q, "out"}, {lse, n.lse, "lse"},
                                              {q, n.q, "q"}, {k, n.kv, "k"}, {v, n.kv, "v"}});
    F32In q_f(c, q, n.q, "q");
    F32In k_f(c, k, n.kv, "k");
    F32In v_f(c, v, n.kv, "v");
    F32Out out_f(c, out, n.q, "out", n.strided_q ? Store::kUpdate : Store::kOverwrite);
    cpu::attention_block_forward(out_f, c.f32(lse, "lse"), q_f, k_f, v_f, n.shape);
  }
  void attention_block_merge(DevPtr out, DevPtr lse, DevPtr block_out, DevPtr block_lse,
                             const AttentionBlock& s) override {
    Call c = call("attention_block_merge");
    const BlockSpans n = block_spans(s, "attention_block_merge", false);
    check_extents("attention_block_merge", {{out, n.q, "out"}, {lse, n.lse, "lse"},
                                            {block_out, n.q, "block_out"},
                                            {block_lse, n.lse, "block_lse"}});
    F32In block_f(c, block_out, n.q, "block_out");
    F32Out out_f(c, out, n.q, "out", Store::kUpdate);
    cpu::attention_block_merge(out_f, c.f32(lse, "lse"), block_f, c.f32(block_lse, "block_lse"),
                               s.B, s.Tq, n.shape.q_rows, s.NH, s.HD);
  }
  void attention_block_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                const AttentionBlock& s) override {
    Call c = call("attention_block_backward");
    const BlockSpans n = block_spans(s, "attention_block_backward", true);
    check_extents("attention_block_backward",
                  {{dq, n.q, "dq"}, {dout, n.q, "dout"}, {out, n.q, "out"}, {q, n.q, "q"},
                   {dk, n.kv, "dk"}, {dv, n.kv, "dv"}, {k, n.kv, "k"}, {v, n.kv, "v"},
                   {lse, n.lse, "lse"}});
    F32In dout_f(c, dout, n.q, "dout");
    F32In out_f(c, out, n.q, "out");
    F32In q_f(c, q, n.q, "q");
    F32In k_f(c, k, n.kv, "k");
    F32In v_f(c, v, n.kv, "v");
    F32Out dq_f(c, dq, n.q, "dq", Store::kUpdate);
    F32Out dk_f(c, dk, n.kv, "dk", Store::kUpdate);
    F32Out dv_f(c, dv, n.kv, "dv", Store::kUpdate);
    cpu::attention_block_backward(dq_f, dk_f, dv_f, dout_f, out_f, c.f32(lse, "lse"), q_f, k_f,
                                  v_f, n.shape);
  }

  void gelu_forward(DevPtr out, DevPtr inp, size_t n) override {
    Call c = call("gelu_forward");
    F32In inp_f(c, inp, n, "inp");
    F32Out out_f(c, out, n, "out", Store::kOverwrite);
    cpu::gelu_forward(out_f, inp_f, n);
  }
  void gelu_backward(DevPtr dinp, DevPtr dout, DevPtr inp, size_t n) override {
    Call c = call("gelu_backward");
    F32In dout_f(c, dout, n, "dout");
    F32In inp_f(c, inp, n, "inp");
    F32Out dinp_f(c, dinp, n, "dinp", Store::kUpdate);
    cpu::gelu_backward(dinp_f, dout_f, inp_f, n);
  }
  void swiglu_forward(DevPtr out, DevPtr gate, DevPtr up, size_t n) override {
    Call c = call("swiglu_forward");
    F32In gate_f(c, gate, n, "gate");
    F32In up_f(c, up, n, "up");
    F32Out out_f(c, out, n, "out", Store::kOverwrite);
    cpu::swiglu_forward(out_f, gate_f, up_f, n);
  }
  void swiglu_backward(DevPtr dgate, DevPtr dup, DevPtr dout, DevPtr gate, DevPtr up,
                       size_t n) override {
    Call c = call("swiglu_backward");
    F32In dout_f(c, dout, n, "dout");
    F32In gate_f(c, gate, n, "gate");
    F32In up_f(c, up, n, "up");
    F32Out dgate_f(c, dgate, n, "dgate", Store::kUpdate);
    F32Out dup_f(c, dup, n, "dup", Store::kUpdate);
    cpu::swiglu_backward(dgate_f, dup_f, dout_f, gate_f, up_f, n);
  }
  void moe_route_forward(DevPtr weights, DevPtr experts, DevPtr probs, DevPtr lse, DevPtr stats,
                         DevPtr logits, int N, int E, int K) override {
    Call c = call("moe_route_forward");
    TRIDENT_CHECK_MSG(K >= 1 && K <= E, "cpu moe_route_forward: K " + std::to_string(K) +
                                            " is not in [1, E = " + std::to_string(E) + "]");
    F32In logits_f(c, logits, elems(N, E), "logits");
    cpu::moe_route_forward(c.f32(weights, "weights"), c.i32_out(experts, "experts"),
                           c.f32(probs, "probs"), c.f32(lse, "lse"), c.f32(stats, "stats"),
                           logits_f, N, E, K);
  }
  void moe_route_backward(DevPtr dlogits, DevPtr dweights, DevPtr weights, DevPtr probs,
                          DevPtr lse, DevPtr experts, DevPtr prob_grad, float z_scale, int N,
                          int E, int K) override {
    Call c = call("moe_route_backward");
    F32Out dlogits_f(c, dlogits, elems(N, E), "dlogits", Store::kUpdate);
    cpu::moe_route_backward(dlogits_f, c.f32(dweights, "dweights"), c.f32(weights, "weights"),
                            c.f32(probs, "probs"), c.f32(lse, "lse"), c.i32(experts, "experts"),
                            c.f32(prob_grad, "prob_grad"), z_scale, N, E, K);
  }
  void moe_dispatch(DevPtr order, DevPtr position, DevPtr experts, int N, int K,
                    int E) override {
    Call c = call("moe_dispatch");
    cpu::moe_dispatch(c.i32_out(order, "order"), c.i32_out(position, "position"),
                      c.i32(experts, "experts"), N, K, E);
  }
  void moe_gather_forward(DevPtr out, DevPtr inp, DevPtr order, int N, int K, int C) override {
    Call c = call("moe_gather_forward");
    F32In inp_f(c, inp, elems(N, C), "inp");
    F32Out out_f(c, out, elems(N * K, C), "out", Store::kOverwrite);
    cpu::moe_gather_forward(out_f, inp_f, c.i32(order, "order"), N, K, C);
  }
  void moe_gather_backward(DevPtr dinp, DevPtr dout, DevPtr position, int N, int K,
                           int C) override {
    Call c = call("moe_gather_backward");
    F32In dout_f(c, dout, elems(N * K, C), "dout");
    F32Out dinp_f(c, dinp, elems(N, C), "dinp", Store::kUpdate);
    cpu::moe_gather_backward(dinp_f, dout_f, c.i32(position, "position"), N, K, C);
  }
  void moe_combine_forward(DevPtr out, DevPtr inp, DevPtr weights, DevPtr position, int N, int K,
                           int C) override {
    Call c = call("moe_combine_forward");
    F32In inp_f(c, inp, elems(N * K, C), "inp");
    F32Out out_f(c, out, elems(N, C), "out", Store::kOverwrite);
    cpu::moe_combine_forward(out_f, inp_f, c.f32(weights, "weights"),
                             c.i32(position, "position"), N, K, C);
  }
  void moe_combine_backward(DevPtr dinp, DevPtr dweights, DevPtr dout, DevPtr inp, DevPtr weights,
                            DevPtr position, int N, int K, int C) override {
    Call c = call("moe_combine_backward");
    F32In dout_f(c, dout, elems(N, C), "dout");
    F32In inp_f(c, inp, elems(N * K, C), "inp");
    F32Out dinp_f(c, dinp, elems(N * K, C), "dinp", Store::kUpdate);
    cpu::moe_combine_backward(dinp_f, c.f32(dweights, "dweights"), dout_f, inp_f,
                              c.f32(weights, "weights"), c.i32(position, "position"), N, K, C);
  }
  void add(DevPtr out, DevPtr a, DevPtr b, size_t n) override {
    Call c = call("add");
    F32In a_f(c, a, n, "a");
    F32In b_f(c, b, n, "b");
    F32Out out_f(c, out, n, "out", Store::kOverwrite);
    cpu::add(out_f, a_f, b_f, n);
  }
  void accumulate(DevPtr dst, DevPtr src, size_t n) override {
    Call c = call("accumulate");
    F32In src_f(c, src, n, "src");
    F32Out dst_f(c, dst, n, "dst", Store::kUpdate);
    cpu::accumulate(dst_f, src_f, n);
  }
  void scale(DevPtr x, float s, size_t n) override {
    Call c = call("scale");
    F32Out x_f(c, x, n, "x", Store::kUpdate);
    cpu::scale(x_f, s, n);
  }

  void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                             int Vp) override {
    Call c = call("cross_entropy_forward");
    F32In logits_f(c, logits, elems(N, Vp), "logits");
    cpu::cross_entropy_forward(c.f32(losses, "losses"), logits_f, c.i32(targets, "targets"), N, V,
                               Vp);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    Call c = call("cross_entropy_backward");
    F32In logits_f(c, logits, elems(N, Vp), "logits");
    F32Out dlogits_f(c, dlogits, elems(N, Vp), "dlogits", Store::kOverwrite);
    cpu::cross_entropy_backward(dlogits_f, logits_f, c.i32(targets, "targets"), dloss, N, V, Vp);
  }
  void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    Call c = call("xent_local_max");
    F32In logits_f(c, logits, elems(N, Vp_local), "logits");
    cpu::xent_local_max(c.f32(row_max, "row_max"), logits_f, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                       DevPtr targets, int N, int Vp_local, int vocab_begin, int V) override {
    Call c = call("xent_local_sums");
    F32In logits_f(c, logits, elems(N, Vp_local), "logits");
    cpu::xent_local_sums(c.f32(sum_exp, "sum_exp"), c.f32(target_logit, "target_logit"), logits_f,
                         c.f32(row_max, "row_max"), c.i32(targets, "targets"), N, Vp_local,
                         vocab_begin, V);
  }
  void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                           DevPtr targets, float dloss, int N, int Vp_local, int vocab_begin,
                           int V) override {
    Call c = call("xent_local_backward");
    F32In logits_f(c, logits, elems(N, Vp_local), "logits");
    F32Out dlogits_f(c, dlogits, elems(N, Vp_local), "dlogits", Store::kOverwrite);
    cpu::xent_local_backward(dlogits_f, logits_f, c.f32(row_max, "row_max"),
                             c.f32(sum_exp, "sum_exp"), c.i32(targets, "targets"), dloss, N,
                             Vp_local, vocab_begin, V);
  }
  void xent_finish(DevPtr losses, DevPtr row_max, DevPtr sum_exp, DevPtr target_logit,
                   int N) override {
    Call c = call("xent_finish");
    cpu::xent_finish(c.f32(losses, "losses"), c.f32(row_max, "row_max"), c.f32(sum_exp, "sum_exp"),
                     c.f32(target_logit, "target_logit"), N);
  }
  void loss_accumulate(DevPtr acc, DevPtr losses, int N) override {
    Call c = call("loss_accumulate");
    cpu::loss_accumulate(c.f64(acc, "acc"), c.f32(losses, "losses"), N);
  }

  void adamw_update(DevPtr param, DevPtr grad, DevPtr m, DevPtr v, DevPtr compute_copy, size_t n,
                    const AdamWParams& p) override {
    Call c = call("adamw_update");
    float* param_f = c.f32(param, "param");
    c.expect(compute_copy, DType::kBF16, "compute_copy");
    cpu::adamw_update(param_f, c.f32(grad, "grad"), c.f32(m, "m"), c.f32(v, "v"), n, p);
    if (!compute_copy.is_null()) {
      round_to_bf16(static_cast<bf16_t*>(compute_copy.raw()), param_f, n);
    }
  }
  void sum_squares_accumulate(DevPtr acc, DevPtr x, size_t n) override {
    Call c = call("sum_squares_accumulate");
    double* acc_d = c.f64(acc, "acc");
    F32In x_f(c, x, n, "x");
    *acc_d += cpu::sum_squares(x_f, n);
  }

 protected:
  DevPtr do_allocate(size_t bytes) override {
    if (checked_) return DevPtr::wrap(cpu::checked_allocate(bytes), DType::kU8);
    const size_t rounded = (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0);
    void* p = std::aligned_alloc(64, rounded);
    TRIDENT_CHECK_MSG(p != nullptr, "cpu allocate of " + std::to_string(bytes) + " bytes failed");
    std::memset(p, 0, rounded);
    return DevPtr::wrap(p, DType::kU8);
  }
  void do_deallocate(DevPtr ptr) override {
    if (checked_) {
      cpu::checked_free(ptr.raw());
    } else {
      std::free(ptr.raw());
    }
  }
  void do_upload(DevPtr dst, const void* host_src, size_t bytes) override {
    Call c = call("upload");
    if (bytes > 0) std::memcpy(dst.raw(), host_src, bytes);
  }
  void do_download(void* host_dst, DevPtr src, size_t bytes) override {
    Call c = call("download");
    if (bytes > 0) std::memcpy(host_dst, src.raw(), bytes);
  }

 private:
  Call call(const char* op) { return Call(threads_, scratch_, op); }
  // The checked backend verifies that a buffer holds as many elements as the call's shapes
  // say: inside a call every checked allocation is accessible, so a read past a too-short
  // buffer (a cache allocated for fewer positions than `capacity`) would not fault.
  void check_extent(DevPtr p, size_t elements, const char* op, const char* arg) const {
    if (!checked_ || p.is_null()) return;
    const size_t bytes = elements * dtype_size(p.dtype());
    TRIDENT_CHECK_MSG(device_access_hook() != nullptr &&
                          device_access_hook()->is_device_range(p.raw(), bytes),
                      std::string("cpu-checked ") + op + ": argument " + arg + " is not " +
                          std::to_string(bytes) + " bytes of one device allocation");
  }

  struct Extent {
    DevPtr p;
    size_t elements;
    const char* arg;
  };
  void check_extents(const char* op, std::initializer_list<Extent> bufs) const {
    for (const Extent& e : bufs) check_extent(e.p, e.elements, op, e.arg);
  }
  // The checked shape of a block attention call and the elements of its spans: the q-side
  // buffers (q, out, dq, dout, block_out), the kv-side ones and lse.
  struct BlockSpans {
    cpu::BlockShape shape;
    size_t q = 0, kv = 0, lse = 0;
    bool strided_q = false;
  };
  static BlockSpans block_spans(const AttentionBlock& s, const char* op, bool keys) {
    BlockSpans n;
    n.shape = {s.B, s.Tq, s.Tk, s.q_stride(), s.kv_stride(), s.q_pos, s.k_pos, s.NH, s.NKV, s.HD};
    const cpu::BlockShape& b = n.shape;
    TRIDENT_CHECK_MSG(b.B >= 1 && b.Tq >= 1 && b.q_rows >= b.Tq && b.NH >= 1 && b.HD >= 1 &&
                          (!keys || (b.Tk >= 1 && b.kv_rows >= b.Tk && b.NKV >= 1 &&
                                     b.NH % b.NKV == 0)),
                      std::string("cpu ") + op + ": B=" + std::to_string(b.B) + " Tq=" +
                          std::to_string(b.Tq) + " Tk=" + std::to_string(b.Tk) + " q_rows=" +
                          std::to_string(b.q_rows) + " kv_rows=" + std::to_string(b.kv_rows) +
                          " NH=" + std::to_string(b.NH) + " NKV=" + std::to_string(b.NKV) +
                          " HD=" + std::to_string(b.HD));
    const size_t last_q_row = elems(b.B - 1, b.q_rows) + static_cast<size_t>(b.Tq);
    n.q = last_q_row * elems(b.NH, b.HD);
    n.kv = (elems(b.B - 1, b.kv_rows) + static_cast<size_t>(b.Tk)) * elems(b.NKV, b.HD);
    n.lse = elems(b.B * b.NH - 1, b.q_rows) + static_cast<size_t>(b.Tq);
    n.strided_q = b.q_rows != b.Tq;
    return n;
  }

  int threads_;
  bool checked_;
  Scratch scratch_;                // widened / unrounded bf16 arguments of the current call
  mutable double peak_flops_ = 0;  // 0 = not measured yet (one thread per Ops: no lock)
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int threads, bool checked) {
  return std::make_unique<CpuOps>(threads, checked);
}

}  // namespace trident
