// ProfilingOps: an Ops that times every call of an inner, synchronous Ops (the CPU
// backend) and keeps, per op: calls, wall time, and the work done — floating-point
// operations for the GEMM-shaped ops, bytes read and written for the memory-bound ones —
// so a benchmark can print where a training step's time goes (llm.c's kernel-by-kernel
// habit). Host wall clock around each call: valid only for a backend whose calls return
// when their work is done (the CPU; a CUDA profile needs events).
//
// Work conventions (per call): matmul forward 2*N*IC*OC; backward 2*N*IC*OC for each of
// dinp and dweight that is asked for; attention 4*B*NH*T^2*HD forward and twice that
// backward (the full T x T products, as model-FLOP counts do, though only the causal half
// is needed). Bytes (the MB/step column): every buffer argument's elements read or written
// once, in its dtype, an accumulated output (+=) read and written, and a kernel that makes
// several passes over a buffer (the cross-entropy's row statistics) counted once per pass;
// the GEMMs count their operands once (the least traffic they can have); attention's bytes
// are not counted.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/timer.h"
#include "kernels/forwarding_ops.h"

namespace trident::bench {

class ProfilingOps : public testing::ForwardingOps {
 public:
  struct Entry {
    long calls = 0;
    double seconds = 0, flops = 0, bytes = 0;
  };
  explicit ProfilingOps(Ops& inner) : ForwardingOps(inner) {}

  void reset() { entries_.clear(); }
  // GEMMs with `out_features` output columns are timed as "<name>_forward/_backward"
  // instead of matmul_*: the router of a mixture-of-experts model (E columns, a width no
  // other GEMM of the bench models has), so that its share of the step shows.
  void name_gemms(int out_features, std::string name) {
    named_oc_ = out_features;
    named_forward_ = name + "_forward";
    named_backward_ = name + "_backward";
  }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  double total_seconds() const {
    double s = 0;
    for (const auto& [name, e] : entries_) s += e.seconds;
    return s;
  }
  // The table: ops by time, each with its share of `step_seconds` (the measured step, so
  // the rest of the step, outside any op, shows as the "(outside ops)" line), per-step
  // milliseconds over `steps` steps, and GFLOP/s or GB/s.
  void print(double step_seconds, int steps) const;

  void zero(DevPtr dst, size_t bytes) override {
    Scope s(this, "zero", 0, static_cast<double>(bytes));
    inner_.zero(dst, bytes);
  }
  void copy(DevPtr dst, DevPtr src, size_t bytes) override {
    Scope s(this, "copy", 0, 2.0 * static_cast<double>(bytes));
    inner_.copy(dst, src, bytes);
  }
  void cast(DevPtr dst, DevPtr src, size_t n) override {
    Scope s(this, "cast", 0, bytes_of(n, {dst, src}));
    inner_.cast(dst, src, n);
  }
  void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T, int C,
                         int vocab_begin, int vocab_local) override {
    const size_t nC = static_cast<size_t>(B) * T * C;
    Scope s(this, "embedding_forward", 0, bytes_of(nC, {out, wte, wpe}));
    inner_.embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
  }
  void embedding_backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B, int T,
                          int C, int vocab_begin, int vocab_local) override {
    const size_t nC = static_cast<size_t>(B) * T * C;
    Scope s(this, "embedding_backward", 0, bytes_of(nC, {dout, dwte, dwte, dwpe, dwpe}));
    inner_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_local);
  }
  void layernorm_forward(DevPtr out, DevPtr mean, DevPtr rstd, DevPtr inp, DevPtr weight,
                         DevPtr bias, int N, int C, float eps) override {
    Scope s(this, "layernorm_forward", 0, bytes_of(static_cast<size_t>(N) * C, {out, inp}));
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                          DevPtr weight, DevPtr mean, DevPtr rstd, int N, int C) override {
    Scope s(this, "layernorm_backward", 0,
            bytes_of(static_cast<size_t>(N) * C, {dinp, dinp, dout, inp}));
    inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(DevPtr out, DevPtr rstd, DevPtr inp, DevPtr weight, int N, int C,
                       float eps) override {
    Scope s(this, "rmsnorm_forward", 0, bytes_of(static_cast<size_t>(N) * C, {out, inp}));
    inner_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dout, DevPtr inp, DevPtr weight,
                        DevPtr rstd, int N, int C) override {
    Scope s(this, "rmsnorm_backward", 0,
            bytes_of(static_cast<size_t>(N) * C, {dinp, dinp, dout, inp}));
    inner_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    const size_t n = static_cast<size_t>(N), ic = static_cast<size_t>(IC),
                 oc = static_cast<size_t>(OC);
    Scope s(this, OC == named_oc_ ? named_forward_.c_str() : "matmul_forward", 2.0 * N * IC * OC,
            bytes_of(n * ic, {inp}) + bytes_of(oc * ic, {weight}) + bytes_of(n * oc, {out}) +
                bytes_of(oc, {bias}));
    inner_.matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  using ForwardingOps::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    const double one = 2.0 * N * IC * OC;
    const size_t n = static_cast<size_t>(N), ic = static_cast<size_t>(IC),
                 oc = static_cast<size_t>(OC);
    // Each operand once; an accumulated gradient (beta = 1) is read and written, a set
    // input gradient (beta = 0) only written.
    const double dinp_passes = dinp_write == GradWrite::kSet ? 1 : 2;
    const double bytes = bytes_of(n * oc, {dout}) + bytes_of(oc * ic, {dweight, dweight}) +
                         bytes_of(oc, {dbias, dbias}) +
                         (dinp.is_null() ? 0 : bytes_of(oc * ic, {weight}) +
                                                   dinp_passes * bytes_of(n * ic, {dinp})) +
                         (dweight.is_null() ? 0 : bytes_of(n * ic, {inp}));
    Scope s(this, OC == named_oc_ ? named_backward_.c_str() : "matmul_backward",
            (dinp.is_null() ? 0 : one) + (dweight.is_null() ? 0 : one), bytes);
    inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, dinp_write);
  }
  void rope_forward(DevPtr x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Scope s(this, "rope_forward", 0, bytes_of(static_cast<size_t>(B) * T * H * HD, {x, x}));
    inner_.rope_forward(x, B, T, H, HD, theta, pos_offset);
  }
  void rope_backward(DevPtr dx, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Scope s(this, "rope_backward", 0, bytes_of(static_cast<size_t>(B) * T * H * HD, {dx, dx}));
    inner_.rope_backward(dx, B, T, H, HD, theta, pos_offset);
  }
  // A read of the fused rows and a write of q, k and v (or the reverse).
  void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset) override {
    const size_t rows = static_cast<size_t>(B) * T;
    Scope s(this, "qkv_split", 0,
            bytes_of(rows * (NH + 2 * NKV) * HD, {qkv}) + bytes_of(rows * NH * HD, {q}) +
                bytes_of(rows * NKV * HD, {k, v}));
    inner_.qkv_split(q, k, v, qkv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset) override {
    const size_t rows = static_cast<size_t>(B) * T;
    Scope s(this, "qkv_merge", 0,
            bytes_of(rows * (NH + 2 * NKV) * HD, {dqkv}) + bytes_of(rows * NH * HD, {dq}) +
                bytes_of(rows * NKV * HD, {dk, dv}));
    inner_.qkv_merge(dqkv, dq, dk, dv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T,
                         int NH, int NKV, int HD) override {
    Scope s(this, "attention_forward", 4.0 * B * NH * static_cast<double>(T) * T * HD, 0);
    inner_.attention_forward(out, state, q, k, v, B, T, NH, NKV, HD);
  }
  void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                          DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH, int NKV,
                          int HD) override {
    Scope s(this, "attention_backward", 8.0 * B * NH * static_cast<double>(T) * T * HD, 0);
    inner_.attention_backward(dq, dk, dv, dout, out, state, q, k, v, B, T, NH, NKV, HD);
  }
  // The Tq x (pos + Tq) products, as attention_forward's count.
  void attention_cached_forward(DevPtr out, DevPtr q, DevPtr k_cache, DevPtr v_cache, int B,
                                int Tq, int pos, int capacity, int NH, int NKV,
                                int HD) override {
    Scope s(this, "attention_cached_forward",
            4.0 * B * NH * static_cast<double>(Tq) * (pos + Tq) * HD, 0);
    inner_.attention_cached_forward(out, q, k_cache, v_cache, B, Tq, pos, capacity, NH, NKV, HD);
  }
  // The Tq x Tk products (masked ones included), as attention_forward's count; the
  // backward's five products of flash attention (the scores again, dV, dP, dQ, dK).
  void attention_block_forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                               const AttentionBlock& b) override {
    Scope s(this, "attention_block_forward", block_flops(b, 4.0), 0);
    inner_.attention_block_forward(out, lse, q, k, v, b);
  }
  void attention_block_merge(DevPtr out, DevPtr lse, DevPtr block_out, DevPtr block_lse,
                             const AttentionBlock& b) override {
    const size_t rows = static_cast<size_t>(b.B) * b.Tq * b.NH, n = rows * b.HD;
    Scope s(this, "attention_block_merge", 0,
            bytes_of(n, {out, out, block_out}) + bytes_of(rows, {lse, lse, block_lse}));
    inner_.attention_block_merge(out, lse, block_out, block_lse, b);
  }
  void attention_block_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                const AttentionBlock& b) override {
    Scope s(this, "attention_block_backward", block_flops(b, 10.0), 0);
    inner_.attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, b);
  }
  void gelu_forward(DevPtr out, DevPtr inp, size_t n) override {
    Scope s(this, "gelu_forward", 0, bytes_of(n, {out, inp}));
    inner_.gelu_forward(out, inp, n);
  }
  void gelu_backward(DevPtr dinp, DevPtr dout, DevPtr inp, size_t n) override {
    Scope s(this, "gelu_backward", 0, bytes_of(n, {dinp, dinp, dout, inp}));
    inner_.gelu_backward(dinp, dout, inp, n);
  }
  void swiglu_forward(DevPtr out, DevPtr gate, DevPtr up, size_t n) override {
    Scope s(this, "swiglu_forward", 0, bytes_of(n, {out, gate, up}));
    inner_.swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(DevPtr dgate, DevPtr dup, DevPtr dout, DevPtr gate, DevPtr up,
                       size_t n) override {
    Scope s(this, "swiglu_backward", 0, bytes_of(n, {dgate, dgate, dup, dup, dout, gate, up}));
    inner_.swiglu_backward(dgate, dup, dout, gate, up, n);
  }
  void moe_route_forward(DevPtr weights, DevPtr experts, DevPtr probs, DevPtr lse, DevPtr stats,
                         DevPtr logits, int N, int E, int K) override {
    Scope s(this, "moe_route_forward", 0, bytes_of(static_cast<size_t>(N) * E, {logits, probs}));
    inner_.moe_route_forward(weights, experts, probs, lse, stats, logits, N, E, K);
  }
  void moe_route_backward(DevPtr dlogits, DevPtr dweights, DevPtr weights, DevPtr probs,
                          DevPtr lse, DevPtr experts, DevPtr prob_grad, float z_scale, int N,
                          int E, int K) override {
    Scope s(this, "moe_route_backward", 0,
            bytes_of(static_cast<size_t>(N) * E, {dlogits, dlogits, probs}));
    inner_.moe_route_backward(dlogits, dweights, weights, probs, lse, experts, prob_grad, z_scale,
                              N, E, K);
  }
  void moe_dispatch(DevPtr order, DevPtr position, DevPtr experts, int N, int K,
                    int E) override {
    Scope s(this, "moe_dispatch", 0, bytes_of(static_cast<size_t>(N) * K, {order, position, experts}));
    inner_.moe_dispatch(order, position, experts, N, K, E);
  }
  void moe_gather_forward(DevPtr out, DevPtr inp, DevPtr order, int N, int K, int C) override {
    Scope s(this, "moe_gather_forward", 0, bytes_of(static_cast<size_t>(N) * K * C, {out, inp}));
    inner_.moe_gather_forward(out, inp, order, N, K, C);
  }
  void moe_gather_backward(DevPtr dinp, DevPtr dout, DevPtr position, int N, int K,
                           int C) override {
    Scope s(this, "moe_gather_backward", 0,
            bytes_of(static_cast<size_t>(N) * K * C, {dinp, dinp, dout}));
    inner_.moe_gather_backward(dinp, dout, position, N, K, C);
  }
  void moe_combine_forward(DevPtr out, DevPtr inp, DevPtr weights, DevPtr position, int N, int K,
                           int C) override {
    Scope s(this, "moe_combine_forward", 0, bytes_of(static_cast<size_t>(N) * K * C, {out, inp}));
    inner_.moe_combine_forward(out, inp, weights, position, N, K, C);
  }
  void moe_combine_backward(DevPtr dinp, DevPtr dweights, DevPtr dout, DevPtr inp, DevPtr weights,
                            DevPtr position, int N, int K, int C) override {
    Scope s(this, "moe_combine_backward", 0,
            bytes_of(static_cast<size_t>(N) * K * C, {dinp, dinp, dout, inp}));
    inner_.moe_combine_backward(dinp, dweights, dout, inp, weights, position, N, K, C);
  }
  void add(DevPtr out, DevPtr a, DevPtr b, size_t n) override {
    Scope s(this, "add", 0, bytes_of(n, {out, a, b}));
    inner_.add(out, a, b, n);
  }
  void accumulate(DevPtr dst, DevPtr src, size_t n) override {
    Scope s(this, "accumulate", 0, bytes_of(n, {dst, dst, src}));
    inner_.accumulate(dst, src, n);
  }
  void scale(DevPtr x, float f, size_t n) override {
    Scope s(this, "scale", 0, bytes_of(n, {x, x}));
    inner_.scale(x, f, n);
  }
  void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                             int Vp) override {
    // Two passes over the logits: the row max, then the sum of exponentials.
    Scope s(this, "cross_entropy_forward", 0,
            bytes_of(static_cast<size_t>(N) * Vp, {logits, logits}));
    inner_.cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    // The row statistics again (two passes), then a read and a write per element.
    Scope s(this, "cross_entropy_backward", 0,
            bytes_of(static_cast<size_t>(N) * Vp, {logits, logits, logits, dlogits}));
    inner_.cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    Scope s(this, "xent_local_max", 0, bytes_of(static_cast<size_t>(N) * Vp_local, {logits}));
    inner_.xent_local_max(row_max, logits, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                       DevPtr targets, int N, int Vp_local, int vocab_begin, int V) override {
    Scope s(this, "xent_local_sums", 0, bytes_of(static_cast<size_t>(N) * Vp_local, {logits}));
    inner_.xent_local_sums(sum_exp, target_logit, logits, row_max, targets, N, Vp_local,
                           vocab_begin, V);
  }
  void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                           DevPtr targets, float dloss, int N, int Vp_local, int vocab_begin,
                           int V) override {
    Scope s(this, "xent_local_backward", 0,
            bytes_of(static_cast<size_t>(N) * Vp_local, {dlogits, logits}));
    inner_.xent_local_backward(dlogits, logits, row_max, sum_exp, targets, dloss, N, Vp_local,
                               vocab_begin, V);
  }
  void xent_finish(DevPtr losses, DevPtr row_max, DevPtr sum_exp, DevPtr target_logit,
                   int N) override {
    Scope s(this, "xent_finish", 0, bytes_of(static_cast<size_t>(N), {losses, row_max, sum_exp, target_logit}));
    inner_.xent_finish(losses, row_max, sum_exp, target_logit, N);
  }
  void loss_accumulate(DevPtr acc, DevPtr losses, int N) override {
    Scope s(this, "loss_accumulate", 0, bytes_of(static_cast<size_t>(N), {losses}));
    inner_.loss_accumulate(acc, losses, N);
  }
  void adamw_update(DevPtr param, DevPtr grad, DevPtr m, DevPtr v, DevPtr compute_copy, size_t n,
                    const AdamWParams& p) override {
    Scope s(this, "adamw_update", 0,
            bytes_of(n, {param, param, grad, m, m, v, v, compute_copy}));
    inner_.adamw_update(param, grad, m, v, compute_copy, n, p);
  }
  void sum_squares_accumulate(DevPtr acc, DevPtr x, size_t n) override {
    Scope s(this, "sum_squares_accumulate", 0, bytes_of(n, {x}));
    inner_.sum_squares_accumulate(acc, x, n);
  }

 private:
  // Times one call into entries_[name].
  struct Scope {
    Scope(ProfilingOps* ops, const char* name, double flops, double bytes)
        : entry(ops->entries_[name]) {
      entry.calls++;
      entry.flops += flops;
      entry.bytes += bytes;
    }
    ~Scope() { entry.seconds += timer.elapsed_s(); }
    Entry& entry;
    Timer timer;
  };
  // `per` FLOPs per (query row, key row, head, head-dim element) of a block.
  static double block_flops(const AttentionBlock& b, double per) {
    return per * b.B * b.NH * static_cast<double>(b.Tq) * b.Tk * b.HD;
  }
  // n elements of each buffer (null ones skipped), in its dtype.
  static double bytes_of(size_t n, std::initializer_list<DevPtr> buffers) {
    double total = 0;
    for (DevPtr p : buffers) {
      if (!p.is_null()) total += static_cast<double>(n) * dtype_size(p.dtype());
    }
    return total;
  }

  std::map<std::string, Entry> entries_;
  int named_oc_ = -1;  // name_gemms
  std::string named_forward_, named_backward_;
};

inline void ProfilingOps::print(double step_seconds, int steps) const {
  std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::printf("#   %-24s %7s %9s %7s %12s %14s\n", "op", "calls", "ms/step", "share", "MB/step",
              "rate");
  double bytes = 0;
  for (const auto& [name, e] : rows) {
    char rate[32];
    if (e.flops > 0) {
      std::snprintf(rate, sizeof(rate), "%7.1f GFLOP/s", e.flops / e.seconds / 1e9);
    } else {
      std::snprintf(rate, sizeof(rate), "%7.2f GB/s", e.bytes / e.seconds / 1e9);
    }
    std::printf("    %-24s %7ld %9.3f %6.1f%% %12.2f %14s\n", name.c_str(), e.calls / steps,
                1e3 * e.seconds / steps, 100.0 * e.seconds / step_seconds,
                e.bytes / steps / 1e6, rate);
    bytes += e.bytes;
  }
  const double outside = step_seconds - total_seconds();
  std::printf("    %-24s %7s %9.3f %6.1f%%\n", "(outside ops)", "", 1e3 * outside / steps,
              100.0 * outside / step_seconds);
  std::printf("    %-24s %7s %9s %7s %12.2f\n", "(bytes of all ops)", "", "", "",
              bytes / steps / 1e6);
}

}  // namespace trident::bench
