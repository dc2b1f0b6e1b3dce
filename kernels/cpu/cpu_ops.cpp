// CpuOps: the Ops interface over the free functions of kernels/cpu/cpu_kernels.h.
// Every call first sets this thread's OpenMP thread count to the object's own, so two
// CpuOps objects with different counts can be used alternately from one thread (the
// OpenMP build of OpenBLAS follows omp_get_max_threads()).
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/sgemm_peak.h"
#include "kernels/ops.h"

namespace trident {
namespace {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads) : threads_(threads > 0 ? threads : omp_get_num_procs()) {
    omp_set_num_threads(threads_);
  }
  const char* name() const override { return "cpu"; }
  double peak_flops() const override {
    if (peak_flops_ == 0) {  // measured once, at this object's thread count
      bind();
      peak_flops_ = measure_sgemm_peak_gflops() * 1e9;
    }
    return peak_flops_;
  }

  void* allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0);
    void* p = std::aligned_alloc(64, rounded);
    TRIDENT_CHECK_MSG(p != nullptr, "cpu allocate of " + std::to_string(bytes) + " bytes failed");
    std::memset(p, 0, rounded);
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int vocab_begin, int vocab_local) override {
    bind();
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C, int vocab_begin, int vocab_local) override {
    bind();
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_local);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         float eps) override {
    bind();
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    bind();
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                       int C, float eps) override {
    bind();
    cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    bind();
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                      int N, int IC, int OC) override {
    bind();
    cpu::matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    bind();
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }

  void rope_forward(float* x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    bind();
    cpu::rope_forward(x, B, T, H, HD, theta, pos_offset);
  }
  void rope_backward(float* dx, int B, int T, int H, int HD, float theta,
                     int pos_offset) override {
    bind();
    cpu::rope_backward(dx, B, T, H, HD, theta, pos_offset);
  }
  // The state is the softmax probabilities [B, NH, T, T] (upper triangle 0), the exact
  // arithmetic of cpu::attention_forward / _backward; `out` is not needed by backward.
  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD) const override {
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
  void attention_forward(float* out, void* state, const float* q, const float* k, const float* v,
                         int B, int T, int NH, int NKV, int HD) override {
    bind();
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0,
                      "attention NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    cpu::attention_forward(out, static_cast<float*>(state), q, k, v, B, T, NH, NKV, HD);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const void* state, const float* q, const float* k, const float* v,
                          int B, int T, int NH, int NKV, int HD) override {
    (void)out;
    bind();
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0,
                      "attention NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, static_cast<const float*>(state), B, T,
                            NH, NKV, HD);
  }

  void gelu_forward(float* out, const float* inp, size_t n) override {
    bind();
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    bind();
    cpu::gelu_backward(dinp, dout, inp, n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    bind();
    cpu::swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, size_t n) override {
    bind();
    cpu::swiglu_backward(dgate, dup, dout, gate, up, n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    bind();
    cpu::add(out, a, b, n);
  }
  void accumulate(float* dst, const float* src, size_t n) override {
    bind();
    cpu::accumulate(dst, src, n);
  }
  void scale(float* x, float s, size_t n) override {
    bind();
    cpu::scale(x, s, n);
  }

  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V, int Vp) override {
    bind();
    cpu::cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              float dloss, int N, int V, int Vp) override {
    bind();
    cpu::cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void xent_local_max(float* row_max, const float* logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    bind();
    cpu::xent_local_max(row_max, logits, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(float* sum_exp, float* target_logit, const float* logits,
                       const float* row_max, const int32_t* targets, int N, int Vp_local,
                       int vocab_begin, int V) override {
    bind();
    cpu::xent_local_sums(sum_exp, target_logit, logits, row_max, targets, N, Vp_local,
                         vocab_begin, V);
  }
  void xent_local_backward(float* dlogits, const float* logits, const float* row_max,
                           const float* sum_exp, const int32_t* targets, float dloss, int N,
                           int Vp_local, int vocab_begin, int V) override {
    bind();
    cpu::xent_local_backward(dlogits, logits, row_max, sum_exp, targets, dloss, N, Vp_local,
                             vocab_begin, V);
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                    const AdamWParams& p) override {
    bind();
    cpu::adamw_update(param, grad, m, v, n, p);
  }
  void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                   const float* target_logit, int N) override {
    bind();
    cpu::xent_finish(losses, row_max, sum_exp, target_logit, N);
  }
  void loss_accumulate(double* acc, const float* losses, int N) override {
    cpu::loss_accumulate(acc, losses, N);
  }
  void sum_squares_accumulate(double* acc, const float* x, size_t n) override {
    bind();
    *acc += cpu::sum_squares(x, n);
  }

 protected:
  void do_upload(void* dst, const void* host_src, size_t bytes) override {
    copy(dst, host_src, bytes);
  }
  void do_download(void* host_dst, const void* src, size_t bytes) override {
    copy(host_dst, src, bytes);
  }

 private:
  // Cheap (sets an ICV); makes the thread count a property of this object.
  void bind() const { omp_set_num_threads(threads_); }

  int threads_;
  mutable double peak_flops_ = 0;  // 0 = not measured yet (one thread per Ops: no lock)
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<CpuOps>(threads); }

}  // namespace trident
