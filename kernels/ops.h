// The ops interface: the only boundary between model code and a compute backend
// (CPU here; CUDA implements the same interface later). Model code allocates, zeroes,
// copies and computes only through an Ops object and never touches device memory.
//
// Conventions (every backend follows them):
// - fp32, row-major, contiguous; N = B*T rows of a [B, T, C] activation.
// - Linear weights are (out, in): out[N, OC] = inp[N, IC] @ weight[OC, IC]^T + bias[OC].
// - Backward functions ACCUMULATE (+=) into every gradient they produce, inputs and
//   parameters alike; a null gradient pointer means "not needed". The exceptions are
//   cross_entropy_backward and xent_local_backward, which overwrite (so dlogits may
//   alias logits).
// - Functions are synchronous with respect to later calls on the same Ops object.
// - Thread safety: one Ops object per thread of control (it owns scratch memory).
// - Host synchronisation: only download() reads device memory back to the host (a sync on
//   a device backend). A training step needs two: the loss and the gradient norm's sum of
//   squares, both accumulated on the device (loss_accumulate, sum_squares_accumulate).
//   Every upload/download is counted (transfer_counts) so tests can hold that budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace trident {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * weight_decay * param
  int step = 1;               // 1-based, for bias correction
};

// Host <-> device transfers made through one Ops object since it was created.
struct TransferCounts {
  uint64_t uploads = 0, upload_bytes = 0;
  uint64_t downloads = 0, download_bytes = 0;  // device -> host reads
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  // Peak FLOP/s of the device this object runs on, the denominator of MFU. The CPU
  // backend measures its sgemm rate on the first call (under a second) and caches it.
  virtual double peak_flops() const = 0;

  // ---- memory -------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;  // aligned to 64 bytes, zero-filled
  virtual void deallocate(void* ptr) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;         // device -> device
  // host -> device and device -> host; counted here, moved by the backend's do_upload /
  // do_download.
  void upload(void* dst, const void* host_src, size_t bytes) {
    ++transfers_.uploads;
    transfers_.upload_bytes += bytes;
    do_upload(dst, host_src, bytes);
  }
  void download(void* host_dst, const void* src, size_t bytes) {
    ++transfers_.downloads;
    transfers_.download_bytes += bytes;
    do_download(host_dst, src, bytes);
  }
  const TransferCounts& transfer_counts() const { return transfers_; }

  // ---- embeddings ---------------------------------------------------------------
  // out[B*T, C] = wte[tokens[n] - vocab_begin] (+ wpe[n % T] when wpe != null).
  // wte holds rows [vocab_begin, vocab_begin + vocab_local) of the table; a token
  // outside that range contributes zero (vocab-parallel embedding).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C, int vocab_begin,
                                 int vocab_local) = 0;
  // dwte[vocab_local, C] += scatter of dout; dwpe[T, C] += sum over batch (if non-null).
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C, int vocab_begin,
                                  int vocab_local) = 0;

  // ---- normalisation ------------------------------------------------------------
  // out = (inp - mean) * rstd * weight + bias (bias may be null); saves mean[N], rstd[N].
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  // out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps); saves rstd[N].
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                               int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int N, int C) = 0;

  // ---- linear -------------------------------------------------------------------
  // out[N, OC] = inp[N, IC] @ weight[OC, IC]^T + bias[OC] (bias may be null). Overwrites out.
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int IC, int OC) = 0;
  // dinp[N, IC] += dout @ weight; dweight[OC, IC] += dout^T @ inp; dbias[OC] += sum_n dout.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int IC,
                               int OC) = 0;

  // ---- attention ----------------------------------------------------------------
  // Rotary embedding in place on x[B, T, H, HD], GPT-NeoX / HF "rotate half" pairing:
  // for i < HD/2, (x[i], x[i + HD/2]) is rotated by angle pos * theta^(-2i/HD),
  // pos = t + pos_offset.
  virtual void rope_forward(float* x, int B, int T, int H, int HD, float theta,
                            int pos_offset) = 0;
  // The transpose rotation, in place on the gradient dx[B, T, H, HD].
  virtual void rope_backward(float* dx, int B, int T, int H, int HD, float theta,
                             int pos_offset) = 0;
  // Causal softmax attention with scale 1/sqrt(HD). q[B, T, NH, HD], k and v
  // [B, T, NKV, HD]; query head h reads kv head h / (NH / NKV). out[B, T, NH, HD]
  // (overwritten).
  //
  // The state saved for backward is opaque and its size is the backend's choice: the
  // CPU keeps the softmax probabilities [B, NH, T, T] (float); a flash backend keeps
  // the row log-sum-exp [B, NH, T] and recomputes the probabilities in backward.
  // - attention_state_bytes: the bytes one call with these shapes needs. It is
  //   non-decreasing in B and T, so a buffer sized for the largest call serves every
  //   smaller one; it saturates at SIZE_MAX instead of wrapping. A pure query (no
  //   device work), also used by the memory plan before anything is allocated.
  // - The caller owns the state: it allocates at least attention_state_bytes through
  //   this Ops object (64-byte aligned, as allocate() returns) and never reads, writes
  //   or interprets it; only attention_forward writes it and attention_backward reads it.
  // - Between a forward and its backward, `state`, `out`, q, k and v stay valid and
  //   unmodified; backward receives the forward's `out` (a flash backward needs
  //   rowsum(dout * out)), the same shapes, and may run any number of times.
  // - dq, dk, dv ACCUMULATE (+=) like every backward; any of them may be null (not
  //   needed).
  virtual size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD) const = 0;
  virtual void attention_forward(float* out, void* state, const float* q, const float* k,
                                 const float* v, int B, int T, int NH, int NKV, int HD) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const void* state, const float* q,
                                  const float* k, const float* v, int B, int T, int NH,
                                  int NKV, int HD) = 0;

  // ---- pointwise ----------------------------------------------------------------
  // GELU, tanh approximation (GPT-2).
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) = 0;
  // out = silu(gate) * up.
  virtual void swiglu_forward(float* out, const float* gate, const float* up, size_t n) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, size_t n) = 0;
  // out = a + b (out may alias a or b).
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;
  // dst += src.
  virtual void accumulate(float* dst, const float* src, size_t n) = 0;
  // x *= s.
  virtual void scale(float* x, float s, size_t n) = 0;

  // ---- loss ---------------------------------------------------------------------
  // losses[n] = -log softmax(logits[n, :V])[targets[n]]. logits is [N, Vp]; the padded
  // columns V..Vp-1 are excluded from the softmax.
  virtual void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                                     int N, int V, int Vp) = 0;
  // dlogits[n, v] = dloss * (softmax[n, v] - [v == targets[n]]) for v < V, 0 for padded
  // columns. OVERWRITES dlogits, which may alias logits.
  virtual void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      float dloss, int N, int V, int Vp) = 0;

  // Vocab-parallel cross-entropy (tensor parallelism), in three local steps around two
  // all-reduces, so the full logits are never gathered. logits[N, Vp_local] hold the
  // global columns [vocab_begin, vocab_begin + Vp_local); only global columns < V are
  // real (a rank may hold no real column at all). targets[N] are global ids in [0, V).
  // The model computes loss[n] = log(sum_exp[n]) + row_max[n] - target_logit[n] from the
  // reduced values. With one rank (vocab_begin 0, Vp_local = Vp) the results equal
  // cross_entropy_forward / _backward.
  //
  // row_max[N] = max over this rank's real columns; -FLT_MAX for a rank without any.
  // Then: all-reduce max.
  virtual void xent_local_max(float* row_max, const float* logits, int N, int Vp_local,
                              int vocab_begin, int V) = 0;
  // With the global row_max[N]: sum_exp[N] = sum over local real columns of
  // exp(logits - row_max); target_logit[N] = logits[n, targets[n] - vocab_begin] when the
  // target is in this rank's range, else 0. Both overwritten. Then: all-reduce sum of both.
  virtual void xent_local_sums(float* sum_exp, float* target_logit, const float* logits,
                               const float* row_max, const int32_t* targets, int N,
                               int Vp_local, int vocab_begin, int V) = 0;
  // dlogits[N, Vp_local] = dloss * (exp(logits - row_max) / sum_exp - [column == target])
  // for local real columns, 0 for padded ones; row_max and sum_exp are the global values.
  // OVERWRITES dlogits, which may alias logits.
  virtual void xent_local_backward(float* dlogits, const float* logits, const float* row_max,
                                   const float* sum_exp, const int32_t* targets, float dloss,
                                   int N, int Vp_local, int vocab_begin, int V) = 0;
  // The final combine, on the device: losses[N] = log(sum_exp) + row_max - target_logit,
  // from the all-reduced values (fp32, as cross_entropy_forward). Overwrites losses.
  virtual void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                           const float* target_logit, int N) = 0;
  // One micro-batch's mean loss into a device accumulator: acc[0] (double) +=
  // float(sum_n losses[n] / N), the sum in double in row order, the mean rounded to fp32
  // (the order the host loop used, so reported losses stay bitwise the same).
  virtual void loss_accumulate(double* acc, const float* losses, int N) = 0;

  // ---- optimizer ----------------------------------------------------------------
  // AdamW on n elements: m, v updated in place; param -= lr * (mhat / (sqrt(vhat) + eps)
  // + weight_decay * param), with bias-corrected mhat and vhat.
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                            const AdamWParams& p) = 0;
  // acc[0] (double, device) += sum of x[i]^2 in double, over a summation tree that
  // depends only on n (not on threads). A step's gradient norm is one download of acc.
  virtual void sum_squares_accumulate(double* acc, const float* x, size_t n) = 0;
  // Convenience (tests, tools): the sum of squares of x on the host; one download.
  double sum_squares(const float* x, size_t n);

 protected:
  virtual void do_upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void do_download(void* host_dst, const void* src, size_t bytes) = 0;

 private:
  TransferCounts transfers_;
};

// The CPU backend (OpenBLAS sgemm + OpenMP). Always built. `threads` <= 0 means all cores.
// Tests and benchmarks call it directly; the trainer asks make_ops (kernels/backend.h).
std::unique_ptr<Ops> make_cpu_ops(int threads = 0);

// Owns one allocation made through an Ops object. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Ops& ops, size_t bytes) : ops_(&ops), ptr_(ops.allocate(bytes)), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ops_(o.ops_), ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (ptr_ != nullptr) ops_->deallocate(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Ops* ops_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline double Ops::sum_squares(const float* x, size_t n) {
  DeviceBuffer acc(*this, sizeof(double));  // zero-filled
  sum_squares_accumulate(acc.as<double>(), x, n);
  double host = 0.0;
  download(&host, acc.get(), sizeof(double));
  return host;
}

}  // namespace trident
