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
  double peak_flops() const override { return inner_.peak_flops(); }

  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* ptr) override { inner_.deallocate(ptr); }
  void zero(void* dst, size_t bytes) override { inner_.zero(dst, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  // Counted by this Ops (Ops::upload/download) and again by the inner one.
  void do_upload(void* dst, const void* host_src, size_t bytes) override {
    inner_.upload(dst, host_src, bytes);
  }
  void do_download(void* host_dst, const void* src, size_t bytes) override {
    inner_.download(host_dst, src, bytes);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int vocab_begin, int vocab_local) override {
    inner_.embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C, int vocab_begin, int vocab_local) override {
    inner_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_local);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         float eps) override {
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                       int C, float eps) override {
    inner_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    inner_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                      int N, int IC, int OC) override {
    inner_.matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }

  void rope_forward(float* x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    inner_.rope_forward(x, B, T, H, HD, theta, pos_offset);
  }
  void rope_backward(float* dx, int B, int T, int H, int HD, float theta,
                     int pos_offset) override {
    inner_.rope_backward(dx, B, T, H, HD, theta, pos_offset);
  }
  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD) const override {
    return inner_.attention_state_bytes(B, T, NH, NKV, HD);
  }
  void attention_forward(float* out, void* state, const float* q, const float* k, const float* v,
                         int B, int T, int NH, int NKV, int HD) override {
    inner_.attention_forward(out, state, q, k, v, B, T, NH, NKV, HD);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const void* state, const float* q, const float* k, const float* v,
                          int B, int T, int NH, int NKV, int HD) override {
    inner_.attention_backward(dq, dk, dv, dout, out, state, q, k, v, B, T, NH, NKV, HD);
  }

  void gelu_forward(float* out, const float* inp, size_t n) override {
    inner_.gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    inner_.gelu_backward(dinp, dout, inp, n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    inner_.swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, size_t n) override {
    inner_.swiglu_backward(dgate, dup, dout, gate, up, n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    inner_.add(out, a, b, n);
  }
  void accumulate(float* dst, const float* src, size_t n) override {
    inner_.accumulate(dst, src, n);
  }
  void scale(float* x, float s, size_t n) override { inner_.scale(x, s, n); }

  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V, int Vp) override {
    inner_.cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              float dloss, int N, int V, int Vp) override {
    inner_.cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void xent_local_max(float* row_max, const float* logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    inner_.xent_local_max(row_max, logits, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(float* sum_exp, float* target_logit, const float* logits,
                       const float* row_max, const int32_t* targets, int N, int Vp_local,
                       int vocab_begin, int V) override {
    inner_.xent_local_sums(sum_exp, target_logit, logits, row_max, targets, N, Vp_local,
                           vocab_begin, V);
  }
  void xent_local_backward(float* dlogits, const float* logits, const float* row_max,
                           const float* sum_exp, const int32_t* targets, float dloss, int N,
                           int Vp_local, int vocab_begin, int V) override {
    inner_.xent_local_backward(dlogits, logits, row_max, sum_exp, targets, dloss, N, Vp_local,
                               vocab_begin, V);
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                    const AdamWParams& p) override {
    inner_.adamw_update(param, grad, m, v, n, p);
  }
  void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                   const float* target_logit, int N) override {
    inner_.xent_finish(losses, row_max, sum_exp, target_logit, N);
  }
  void loss_accumulate(double* acc, const float* losses, int N) override {
    inner_.loss_accumulate(acc, losses, N);
  }
  void sum_squares_accumulate(double* acc, const float* x, size_t n) override {
    inner_.sum_squares_accumulate(acc, x, n);
  }

 protected:
  Ops& inner_;
};

}  // namespace trident::testing
