// ForwardingOps: an Ops that forwards every call to an inner Ops. Tests derive from it
// and override only the calls they perturb (e.g. the attention state, to prove a caller
// treats it as opaque). A new Ops virtual needs one forwarding line here.
#pragma once

#include "kernels/ops.h"

namespace trident::testing {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(Ops& inner) : inner_(inner) {}

  const char* name() const override { return inner_.name(); }
  std::string description() const override { return inner_.description(); }
  double peak_flops() const override { return inner_.peak_flops(); }

  // Counted by this Ops (Ops::allocate/deallocate/upload/download) and again by the inner
  // one.
  DevPtr do_allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void do_deallocate(DevPtr ptr) override { inner_.deallocate(ptr); }
  void zero(DevPtr dst, size_t bytes) override { inner_.zero(dst, bytes); }
  void copy(DevPtr dst, DevPtr src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void cast(DevPtr dst, DevPtr src, size_t n) override { inner_.cast(dst, src, n); }
  void do_upload(DevPtr dst, const void* host_src, size_t bytes) override {
    inner_.upload(dst, host_src, bytes);
  }
  void do_download(void* host_dst, DevPtr src, size_t bytes) override {
    inner_.download(host_dst, src, bytes);
  }

  void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T, int C,
                         int vocab_begin, int vocab_local) override {
    inner_.embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
  }
  void embedding_backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B, int T, int C,
                          int vocab_begin, int vocab_local) override {
    inner_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_local);
  }

  void layernorm_forward(DevPtr out, DevPtr mean, DevPtr rstd, DevPtr inp, DevPtr weight,
                         DevPtr bias, int N, int C, float eps) override {
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                          DevPtr weight, DevPtr mean, DevPtr rstd, int N, int C) override {
    inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(DevPtr out, DevPtr rstd, DevPtr inp, DevPtr weight, int N, int C,
                       float eps) override {
    inner_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dout, DevPtr inp, DevPtr weight,
                        DevPtr rstd, int N, int C) override {
    inner_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }

  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    inner_.matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  using Ops::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, dinp_write);
  }

  void rope_forward(DevPtr x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    inner_.rope_forward(x, B, T, H, HD, theta, pos_offset);
  }
  void rope_backward(DevPtr dx, int B, int T, int H, int HD, float theta, int pos_offset) override {
    inner_.rope_backward(dx, B, T, H, HD, theta, pos_offset);
  }
  void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset) override {
    inner_.qkv_split(q, k, v, qkv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset) override {
    inner_.qkv_merge(dqkv, dq, dk, dv, B, T, NH, NKV, HD, rotate, theta, pos_offset);
  }
  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD,
                               DType dtype) const override {
    return inner_.attention_state_bytes(B, T, NH, NKV, HD, dtype);
  }
  size_t attention_workspace_bytes(int B, int T, int NH, int NKV, int HD,
                                   DType dtype) const override {
    return inner_.attention_workspace_bytes(B, T, NH, NKV, HD, dtype);
  }
  std::optional<DeviceMemory> device_memory() const override { return inner_.device_memory(); }
  void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T,
                         int NH, int NKV, int HD) override {
    inner_.attention_forward(out, state, q, k, v, B, T, NH, NKV, HD);
  }
  void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                          DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH, int NKV,
                          int HD) override {
    inner_.attention_backward(dq, dk, dv, dout, out, state, q, k, v, B, T, NH, NKV, HD);
  }
  void attention_cached_forward(DevPtr out, DevPtr q, DevPtr k_cache, DevPtr v_cache, int B,
                                int Tq, int pos, int capacity, int NH, int NKV,
                                int HD) override {
    inner_.attention_cached_forward(out, q, k_cache, v_cache, B, Tq, pos, capacity, NH, NKV, HD);
  }
  void attention_block_forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                               const AttentionBlock& s) override {
    inner_.attention_block_forward(out, lse, q, k, v, s);
  }
  void attention_block_merge(DevPtr out, DevPtr lse, DevPtr block_out, DevPtr block_lse,
                             const AttentionBlock& s) override {
    inner_.attention_block_merge(out, lse, block_out, block_lse, s);
  }
  void attention_block_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                const AttentionBlock& s) override {
    inner_.attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
  }

  void gelu_forward(DevPtr out, DevPtr inp, size_t n) override { inner_.gelu_forward(out, inp, n); }
  void gelu_backward(DevPtr dinp, DevPtr dout, DevPtr inp, size_t n) override {
    inner_.gelu_backward(dinp, dout, inp, n);
  }
  void swiglu_forward(DevPtr out, DevPtr gate, DevPtr up, size_t n) override {
    inner_.swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(DevPtr dgate, DevPtr dup, DevPtr dout, DevPtr gate, DevPtr up,
                       size_t n) override {
    inner_.swiglu_backward(dgate, dup, dout, gate, up, n);
  }
  void moe_route_forward(DevPtr weights, DevPtr experts, DevPtr probs, DevPtr lse, DevPtr stats,
                         DevPtr logits, int N, int E, int K) override {
    inner_.moe_route_forward(weights, experts, probs, lse, stats, logits, N, E, K);
  }
  void moe_route_backward(DevPtr dlogits, DevPtr dweights, DevPtr weights, DevPtr probs,
                          DevPtr lse, DevPtr experts, DevPtr prob_grad, float z_scale, int N,
                          int E, int K) override {
    inner_.moe_route_backward(dlogits, dweights, weights, probs, lse, experts, prob_grad, z_scale,
                              N, E, K);
  }
  void moe_dispatch(DevPtr order, DevPtr position, DevPtr experts, int N, int K,
                    int E) override {
    inner_.moe_dispatch(order, position, experts, N, K, E);
  }
  void moe_gather_forward(DevPtr out, DevPtr inp, DevPtr order, int N, int K, int C) override {
    inner_.moe_gather_forward(out, inp, order, N, K, C);
  }
  void moe_gather_backward(DevPtr dinp, DevPtr dout, DevPtr position, int N, int K,
                           int C) override {
    inner_.moe_gather_backward(dinp, dout, position, N, K, C);
  }
  void moe_combine_forward(DevPtr out, DevPtr inp, DevPtr weights, DevPtr position, int N, int K,
                           int C) override {
    inner_.moe_combine_forward(out, inp, weights, position, N, K, C);
  }
  void moe_combine_backward(DevPtr dinp, DevPtr dweights, DevPtr dout, DevPtr inp, DevPtr weights,
                            DevPtr position, int N, int K, int C) override {
    inner_.moe_combine_backward(dinp, dweights, dout, inp, weights, position, N, K, C);
  }
  void add(DevPtr out, DevPtr a, DevPtr b, size_t n) override { inner_.add(out, a, b, n); }
  void accumulate(DevPtr dst, DevPtr src, size_t n) override { inner_.accumulate(dst, src, n); }
  void scale(DevPtr x, float s, size_t n) override { inner_.scale(x, s, n); }

  void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                             int Vp) override {
    inner_.cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    inner_.cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    inner_.xent_local_max(row_max, logits, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                       DevPtr targets, int N, int Vp_local, int vocab_begin, int V) override {
    inner_.xent_local_sums(sum_exp, target_logit, logits, row_max, targets, N, Vp_local,
                           vocab_begin, V);
  }
  void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                           DevPtr targets, float dloss, int N, int Vp_local, int vocab_begin,
                           int V) override {
    inner_.xent_local_backward(dlogits, logits, row_max, sum_exp, targets, dloss, N, Vp_local,
                               vocab_begin, V);
  }

  void adamw_update(DevPtr param, DevPtr grad, DevPtr m, DevPtr v, DevPtr compute_copy, size_t n,
                    const AdamWParams& p) override {
    inner_.adamw_update(param, grad, m, v, compute_copy, n, p);
  }
  void xent_finish(DevPtr losses, DevPtr row_max, DevPtr sum_exp, DevPtr target_logit,
                   int N) override {
    inner_.xent_finish(losses, row_max, sum_exp, target_logit, N);
  }
  void loss_accumulate(DevPtr acc, DevPtr losses, int N) override {
    inner_.loss_accumulate(acc, losses, N);
  }
  void sum_squares_accumulate(DevPtr acc, DevPtr x, size_t n) override {
    inner_.sum_squares_accumulate(acc, x, n);
  }

 protected:
  Ops& inner_;
};

}  // namespace trident::testing
