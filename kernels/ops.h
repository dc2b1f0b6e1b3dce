// The ops interface: the only boundary between model code and a compute backend (the CPU
// one in kernels/cpu/, its checked variant, and the CUDA plugin in kernels/cuda/, all
// behind make_ops, kernels/backend.h). Model code allocates, zeroes,
// copies and computes only through an Ops object and never touches device memory.
//
// Conventions (every backend follows them):
// - Row-major, contiguous; N = B*T rows of a [B, T, C] activation.
// - Buffer arguments (docs/ARCHITECTURE.md "Memory, dtypes and streams"): every device buffer is a
//   DevPtr (core/memory.h) carrying its dtype; host buffers are plain typed pointers and
//   appear only in upload/download. A null DevPtr is "absent" (bias, wpe, a gradient not
//   needed) whatever its dtype.
// - Dtypes. "F" = f32 or bf16, chosen per argument independently: activations and their
//   gradients (out, inp, dinp, dout, q/k/v and dq/dk/dv, logits, dlogits, x, a, b, dst,
//   src, gate, up), and the forward weights (weight, bias, wte, wpe). Fixed f32:
//   parameter gradients (dweight, dbias, dwte, dwpe), AdamW state (param master, grad, m,
//   v), normalisation statistics (mean, rstd), cross-entropy statistics (losses, row_max,
//   sum_exp, target_logit). i32: tokens, targets. f64: the accumulators of
//   loss_accumulate and sum_squares_accumulate. u8: the opaque attention state. A wrong
//   dtype is a programming error: the backend CHECK-fails naming the op and argument.
// - Precision: arithmetic is fp32 inside every op. A bf16 input is widened exactly; a
//   bf16 output is rounded to nearest even once, where a GPU kernel would store it. An
//   accumulating bf16 output (dinp += ...) is read, the op's fp32 contribution added in
//   fp32, and the sum rounded once. With every argument f32 the results are bitwise the
//   fp32 results (the CPU backend passes f32 buffers straight to its kernels).
// - Linear weights are (out, in): out[N, OC] = inp[N, IC] @ weight[OC, IC]^T + bias[OC].
// - Backward functions ACCUMULATE (+=) into every gradient they produce, inputs and
//   parameters alike; a null gradient pointer means "not needed". The exceptions are
//   cross_entropy_backward and xent_local_backward, which overwrite (so dlogits may
//   alias logits), and matmul_backward's input gradient when asked to set it (GradWrite).
// - Functions are synchronous with respect to later calls on the same Ops object.
// - Thread safety: one Ops object per thread of control (it owns scratch memory).
// - Host synchronisation: only download() reads device memory back to the host (a sync on
//   a device backend). A training step needs two: the loss and the gradient norm's sum of
//   squares, both accumulated on the device (loss_accumulate, sum_squares_accumulate); a
//   mixture-of-experts model one more per MoE layer and micro-batch (moe_route_forward's
//   statistics: the experts' row counts size their GEMMs).
//   Every upload/download is counted (transfer_counts) so tests can hold that budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <unordered_map>

#include "core/memory.h"

namespace trident {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * weight_decay * param
  int step = 1;               // 1-based, for bias correction
};

// How matmul_backward writes its input gradient: kAdd accumulates (dinp += ...), kSet
// overwrites (dinp = ..., beta = 0), for the first writer of a gradient, which then needs
// no zero-fill before it.
enum class GradWrite { kAdd, kSet };

// Host <-> device transfers made through one Ops object since it was created.
struct TransferCounts {
  uint64_t uploads = 0, upload_bytes = 0;
  uint64_t downloads = 0, download_bytes = 0;  // device -> host reads
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  // One line for the start-up banner: the backend and what it runs on (CUDA: the GPU,
  // driver, runtime, cuBLASLt and cuDNN versions, the attention path). Default: name().
  virtual std::string description() const { return name(); }
  // Peak FLOP/s of the device this object runs on, the denominator of MFU. The CPU
  // backend measures its sgemm rate on the first call (under a second) and caches it.
  virtual double peak_flops() const = 0;
  // The backend's compute stream (CUDA: its cudaStream_t), for communicators that order
  // their device collectives on it (comm/nccl_world.h); null = none (CPU: every op is
  // synchronous).
  virtual void* native_stream() const { return nullptr; }
  // The memory of the device this object allocates on, for the memory plan: none
  // (nullopt) when device memory is host memory (CPU). CUDA: cudaMemGetInfo's free and
  // total bytes, and the pinned host memory the backend keeps for transfers.
  struct DeviceMemory {
    size_t free_bytes = 0, total_bytes = 0;
    size_t pinned_host_bytes = 0;
    std::string source;  // where the figures come from, e.g. "cudaMemGetInfo"
  };
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }

  // ---- memory -------------------------------------------------------------------
  // 64-byte aligned, zero-filled, returned as u8 (callers .as() their dtype). Counted
  // here (allocation_counts), made by the backend's do_allocate.
  DevPtr allocate(size_t bytes);
  // Frees an allocate() result; a null pointer is ignored. Counted, then do_deallocate.
  void deallocate(DevPtr ptr);
  // Allocations through this object since it was created; live_bytes counts requested
  // bytes of the allocations not yet freed, peak_live_bytes its maximum.
  struct AllocationCounts {
    uint64_t allocations = 0, deallocations = 0;
    uint64_t live_bytes = 0, peak_live_bytes = 0;
  };
  const AllocationCounts& allocation_counts() const { return allocs_; }
  virtual void zero(DevPtr dst, size_t bytes) = 0;
  virtual void copy(DevPtr dst, DevPtr src, size_t bytes) = 0;  // device -> device, memmove
  // host -> device and device -> host; counted here, moved by the backend's do_upload /
  // do_download.
  void upload(DevPtr dst, const void* host_src, size_t bytes) {
    ++transfers_.uploads;
    transfers_.upload_bytes += bytes;
    do_upload(dst, host_src, bytes);
  }
  void download(void* host_dst, DevPtr src, size_t bytes) {
    ++transfers_.downloads;
    transfers_.download_bytes += bytes;
    do_download(host_dst, src, bytes);
  }
  const TransferCounts& transfer_counts() const { return transfers_; }
  // dst[i] = src[i] for n elements: f32 -> bf16 rounds to nearest even (NaN stays NaN),
  // bf16 -> f32 is exact, equal dtypes copy. Only F dtypes.
  virtual void cast(DevPtr dst, DevPtr src, size_t n) = 0;

  // ---- embeddings ---------------------------------------------------------------
  // out[B*T, C] = wte[tokens[n] - vocab_begin] (+ wpe[n % T] when wpe != null).
  // wte holds rows [vocab_begin, vocab_begin + vocab_local) of the table; a token
  // outside that range contributes zero (vocab-parallel embedding).
  virtual void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T,
                                 int C, int vocab_begin, int vocab_local) = 0;
  // dwte[vocab_local, C] += scatter of dout; dwpe[T, C] += sum over batch (if non-null).
  virtual void embedding_backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B,
                                  int T, int C, int vocab_begin, int vocab_local) = 0;

  // ---- normalisation ------------------------------------------------------------
  // out = (inp - mean) * rstd * weight + bias (bias may be null); saves mean[N], rstd[N].
  virtual void layernorm_forward(DevPtr out, DevPtr mean, DevPtr rstd, DevPtr inp, DevPtr weight,
                                 DevPtr bias, int N, int C, float eps) = 0;
  virtual void layernorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout,
                                  DevPtr inp, DevPtr weight, DevPtr mean, DevPtr rstd, int N,
                                  int C) = 0;
  // out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps); saves rstd[N].
  virtual void rmsnorm_forward(DevPtr out, DevPtr rstd, DevPtr inp, DevPtr weight, int N, int C,
                               float eps) = 0;
  virtual void rmsnorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dout, DevPtr inp, DevPtr weight,
                                DevPtr rstd, int N, int C) = 0;

  // ---- linear -------------------------------------------------------------------
  // out[N, OC] = inp[N, IC] @ weight[OC, IC]^T + bias[OC] (bias may be null). Overwrites out.
  virtual void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                              int OC) = 0;
  // dinp[N, IC] += dout @ weight; dweight[OC, IC] += dout^T @ inp; dbias[OC] += sum_n dout.
  // With GradWrite::kSet, dinp = dout @ weight instead (beta = 0: dinp is written, never
  // read, so it need not be zeroed first): for the first writer of an input gradient.
  // The weight and bias gradients always accumulate.
  virtual void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                               DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) = 0;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, GradWrite::kAdd);
  }

  // ---- attention ----------------------------------------------------------------
  // Rotary embedding in place on x[B, T, H, HD], GPT-NeoX / HF "rotate half" pairing:
  // for i < HD/2, (x[i], x[i + HD/2]) is rotated by angle pos * theta^(-2i/HD),
  // pos = t + pos_offset.
  virtual void rope_forward(DevPtr x, int B, int T, int H, int HD, float theta, int pos_offset) = 0;
  // The transpose rotation, in place on the gradient dx[B, T, H, HD].
  virtual void rope_backward(DevPtr dx, int B, int T, int H, int HD, float theta,
                             int pos_offset) = 0;
  // The fused q/k/v projection: qkv[B, T, W], W = (NH + 2 NKV) * HD, each row q | k | v
  // (one GEMM against the three weights stacked). qkv_split writes its parts to
  // q[B, T, NH, HD], k and v [B, T, NKV, HD] (overwritten), q and k rotated as
  // rope_forward when `rotate` (bit for bit what copies of the parts and rope_forward give).
  // qkv_merge is its transpose: dqkv[B, T, W] = (dq | dk | dv) (overwritten), dq and dk
  // rotated back as rope_backward when `rotate`; dq, dk and dv are read only. HD is even
  // (the CUDA kernels move pairs of elements).
  virtual void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV,
                         int HD, bool rotate, float theta, int pos_offset) = 0;
  virtual void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH,
                         int NKV, int HD, bool rotate, float theta, int pos_offset) = 0;
  // Causal softmax attention with scale 1/sqrt(HD). q[B, T, NH, HD], k and v
  // [B, T, NKV, HD]; query head h reads kv head h / (NH / NKV). out[B, T, NH, HD]
  // (overwritten).
  //
  // The state saved for backward is opaque and its size is the backend's choice: the
  // CPU keeps the softmax probabilities [B, NH, T, T] (float); a flash backend keeps
  // the row log-sum-exp [B, NH, T] and recomputes the probabilities in backward.
  // - attention_state_bytes: the bytes calls with these shapes and `dtype` (the dtype of
  //   q, k, v and out) need. A buffer of that size serves every call with the same heads
  //   and dtype and a B and T no larger (the size itself need not grow with B and T: a
  //   backend may pick another algorithm per shape, CUDA: cuDNN or plain); it saturates
  //   at SIZE_MAX instead of wrapping. Allocates nothing and touches no device memory
  //   (a backend may decide and cache its algorithm for the shape here); also used by
  //   the memory plan before anything is allocated.
  // - The caller owns the state: it allocates at least attention_state_bytes through
  //   this Ops object (64-byte aligned, as allocate() returns) and never reads, writes
  //   or interprets it; only attention_forward writes it and attention_backward reads it.
  // - Between a forward and its backward, `state`, `out`, q, k and v stay valid and
  //   unmodified; backward receives the forward's `out` (a flash backward needs
  //   rowsum(dout * out)), the same shapes, and may run any number of times.
  // - dq, dk, dv ACCUMULATE (+=) like every backward; any of them may be null (not
  //   needed).
  virtual size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD,
                                       DType dtype) const = 0;
  // Device memory the backend itself allocates for attention calls of these shapes
  // (scratch and library workspaces, kept across calls; not the state): part of the
  // memory plan. Default 0 (the CPU's scratch is counted by the model).
  virtual size_t attention_workspace_bytes(int B, int T, int NH, int NKV, int HD,
                                           DType dtype) const {
    (void)B, (void)T, (void)NH, (void)NKV, (void)HD, (void)dtype;
    return 0;
  }
  virtual void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B,
                                 int T, int NH, int NKV, int HD) = 0;
  virtual void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                  DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH,
                                  int NKV, int HD) = 0;
  // Forward-only attention of new queries over a key/value cache (inference: the model's
  // cache mode, model/transformer.h). q[B, Tq, NH, HD] holds the queries at absolute
  // positions pos .. pos+Tq-1 of each sequence; k_cache and v_cache [B, capacity, NKV, HD]
  // hold each sequence's keys and values by absolute position, of which positions
  // 0 .. pos+Tq-1 are read (the caller has written the new ones, pos .. pos+Tq-1, before
  // the call) and the rest never are. The mask is causal by absolute position: query row
  // i (position pos + i) attends to key positions 0 .. pos + i. `pos` is thus an offset of
  // the query positions against the key/value positions, the same offset a
  // context-parallel rank's causal mask needs for its block of queries. Scale 1/sqrt(HD);
  // query head h reads kv head h / (NH / NKV). out[B, Tq, NH, HD] (overwritten). q, the
  // caches and out share one F dtype; the softmax is computed in fp32. No state and no
  // backward. Requires Tq >= 1, pos >= 0, pos + Tq <= capacity, NH % NKV == 0.
  // With pos = 0, Tq = capacity = T the result is attention_forward's out on the same q,
  // k, v (bitwise on the CPU, whose two ops share one kernel).
  virtual void attention_cached_forward(DevPtr out, DevPtr q, DevPtr k_cache, DevPtr v_cache,
                                        int B, int Tq, int pos, int capacity, int NH, int NKV,
                                        int HD) = 0;

  // Block attention: one block of queries over one block of keys and values, the pieces
  // ring attention is made of (context parallelism, parallel/context_parallel.h). A rank
  // attends its queries to one block of keys at a time, folds the partial results
  // together by their row log-sum-exp (attention_block_merge), and runs a flash-style
  // backward per block from the final out and lse (attention_block_backward).
  // - Rows. Sequence b's query row i (0 <= i < Tq) is row b * q_rows + i of q, out, dq and
  //   dout ([B, q_rows, NH, HD] buffers, q_rows >= Tq), and (b, h, i) is element
  //   (b * NH + h) * q_rows + i of lse ([B, NH, q_rows], f32). Key row j (0 <= j < Tk) is row
  //   b * kv_rows + j of k, v, dk and dv ([B, kv_rows, NKV, HD], kv_rows >= Tk). Every
  //   pointer points at the block's row 0 of sequence 0, so a block of rows inside a larger
  //   buffer needs no copy: the second chunk of a rank's [B, 2c, NH, HD] queries is
  //   `q + c * NH * HD` with Tq = c, q_rows = 2c, and its lse `lse + c`. Rows outside
  //   [0, Tq) and [0, Tk) of a sequence are never read or written.
  // - Mask. Query row i sits at position q_pos + i and key row j at k_pos + j; i attends
  //   to j iff k_pos + j <= q_pos + i. So q_pos = k_pos (Tq = Tk) is a causal diagonal
  //   block, q_pos >= k_pos + Tk - 1 full attention, q_pos + Tq <= k_pos masks every row,
  //   and only q_pos - k_pos matters (the positions may be virtual: a rank's two chunks
  //   side by side). Scale 1/sqrt(HD); query head h reads kv head h / (NH / NKV).
  // - A row that sees no key has lse = -inf and out = 0, and contributes nothing to a
  //   merge or a backward (no NaN).
  // - Dtypes: q, k, v, out, dout, dq, dk, dv, block_out are F (each its own); lse and
  //   block_lse f32. fp32 arithmetic inside.
  struct AttentionBlock {
    int B = 1, Tq = 1, Tk = 1;
    int q_rows = 0, kv_rows = 0;  // row strides per sequence; 0 = Tq, Tk (contiguous)
    int q_pos = 0, k_pos = 0;
    int NH = 1, NKV = 1, HD = 1;
    int q_stride() const { return q_rows > 0 ? q_rows : Tq; }
    int kv_stride() const { return kv_rows > 0 ? kv_rows : Tk; }
  };
  // out = softmax(scale q k^T, masked) v over the block's keys, lse[b, h, i] = the row's
  // log(sum_j exp(scale q_i . k_j)) over the keys it sees. Overwrites out and lse (only
  // the block's rows). With q_pos = k_pos, Tq = Tk = T and contiguous rows, out is
  // attention_forward's (bitwise on the CPU, which runs one kernel for both).
  virtual void attention_block_forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                       const AttentionBlock& s) = 0;
  // Folds a block's (block_out, block_lse) into the running (out, lse) of the same rows
  // (B, Tq, q_rows, NH, HD of `s`; the key fields are ignored), the log-sum-exp rule:
  //   lse' = log(exp(lse) + exp(block_lse)),
  //   out' = exp(lse - lse') * out + exp(block_lse - lse') * block_out.
  // A running (out, lse) of (0, -inf) is the empty set: the merge copies the block. Rows
  // where both are -inf become (0, -inf). out and lse updated in place.
  virtual void attention_block_merge(DevPtr out, DevPtr lse, DevPtr block_out, DevPtr block_lse,
                                     const AttentionBlock& s) = 0;
  // The block's share of attention's backward, given the FINAL out and lse of its query
  // rows (merged over every key block): D_i = rowsum(dout_i * out_i), P_ij = exp(scale
  // q_i . k_j - lse_i) for the keys row i sees (0 elsewhere and on rows with lse = -inf),
  // dS = P * (dout v^T - D); dq += scale dS k, dk += scale dS^T q, dv += P^T dout, each
  // ACCUMULATED and any of them null (not needed). Summed over the key blocks of a
  // sequence this is attention_backward's dq, and each block's dk, dv are those of its
  // keys.
  virtual void attention_block_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                        DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                        const AttentionBlock& s) = 0;

  // ---- pointwise ----------------------------------------------------------------
  // GELU, tanh approximation (GPT-2).
  virtual void gelu_forward(DevPtr out, DevPtr inp, size_t n) = 0;
  virtual void gelu_backward(DevPtr dinp, DevPtr dout, DevPtr inp, size_t n) = 0;
  // out = silu(gate) * up.
  virtual void swiglu_forward(DevPtr out, DevPtr gate, DevPtr up, size_t n) = 0;
  virtual void swiglu_backward(DevPtr dgate, DevPtr dup, DevPtr dout, DevPtr gate, DevPtr up,
                               size_t n) = 0;
  // Mixture-of-experts routing and dispatch (model/transformer.h, "Mixture of experts"):
  // N tokens, E experts, top K of them per token; assignment a = n * K + j is token n's
  // j-th choice. The dispatch is dropless and its order fixed: the assignments of each
  // expert are gathered in token order into consecutive rows (expert 0's first), so one
  // GEMM per expert runs over a row slice, and the combine sums a token's K results in
  // j order. Nothing depends on the thread count or the backend's reduction tree.
  //
  // The router on logits[N, E] (F): probs = softmax in fp32 (f32 [N, E], kept for
  // backward), lse[N] (f32) its log-sum-exp; experts[N, K] (i32) the K largest probs in
  // descending order, a tie going to the lowest expert index (torch.topk on the CPU);
  // weights[N, K] (f32) their probs renormalised to sum to 1 (Mixtral). stats[2E + 1]
  // (f32): [e] the assignments of expert e (exact below 2^24), [E + e] the sum over
  // tokens of probs[n, e], [2E] the sum of lse^2, the sums in double in row order,
  // rounded once. All outputs overwritten. Requires 1 <= K <= E.
  virtual void moe_route_forward(DevPtr weights, DevPtr experts, DevPtr probs, DevPtr lse,
                                 DevPtr stats, DevPtr logits, int N, int E, int K) = 0;
  // dlogits[N, E] (F) += the gradient through the softmax of: dweights[N, K] (f32)
  // through the renormalisation (the top-k choice itself has none), prob_grad[E] (f32,
  // may be null) added to every row's dL/dprobs (the load-balancing loss, whose token
  // fractions are constants), and z_scale * lse[n]^2 per token (the router z-loss; 0:
  // none). weights, probs, lse and experts are the forward's.
  virtual void moe_route_backward(DevPtr dlogits, DevPtr dweights, DevPtr weights, DevPtr probs,
                                  DevPtr lse, DevPtr experts, DevPtr prob_grad, float z_scale,
                                  int N, int E, int K) = 0;
  // The fixed order: order[N * K] (i32) the assignments sorted by expert, then by token
  // (a stable counting sort of experts[N, K]); position[N * K] (i32) its inverse, the row
  // of assignment a. Both overwritten; expert e's rows start at the sum of the counts of
  // the experts before it.
  virtual void moe_dispatch(DevPtr order, DevPtr position, DevPtr experts, int N, int K,
                            int E) = 0;
  // out[p, :] = inp[order[p] / K, :] for p < N * K (F, C columns; overwritten).
  virtual void moe_gather_forward(DevPtr out, DevPtr inp, DevPtr order, int N, int K, int C) = 0;
  // dinp[n, :] += sum over j (in order) of dout[position[n * K + j], :].
  virtual void moe_gather_backward(DevPtr dinp, DevPtr dout, DevPtr position, int N, int K,
                                   int C) = 0;
  // out[n, :] = sum over j (in order) of weights[n, j] * inp[position[n * K + j], :]
  // (out, inp F; weights f32; overwritten).
  virtual void moe_combine_forward(DevPtr out, DevPtr inp, DevPtr weights, DevPtr position,
                                   int N, int K, int C) = 0;
  // dinp[position[a], :] += weights[a] * dout[n, :] (F); dweights[a] (f32) += the dot of
  // dout[n, :] and inp[position[a], :], a = n * K + j. Either gradient may be null.
  virtual void moe_combine_backward(DevPtr dinp, DevPtr dweights, DevPtr dout, DevPtr inp,
                                    DevPtr weights, DevPtr position, int N, int K, int C) = 0;
  // out = a + b (out may alias a or b).
  virtual void add(DevPtr out, DevPtr a, DevPtr b, size_t n) = 0;
  // dst += src.
  virtual void accumulate(DevPtr dst, DevPtr src, size_t n) = 0;
  // x *= s.
  virtual void scale(DevPtr x, float s, size_t n) = 0;

  // ---- loss ---------------------------------------------------------------------
  // losses[n] = -log softmax(logits[n, :V])[targets[n]]. logits is [N, Vp]; the padded
  // columns V..Vp-1 are excluded from the softmax.
  virtual void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                                     int Vp) = 0;
  // dlogits[n, v] = dloss * (softmax[n, v] - [v == targets[n]]) for v < V, 0 for padded
  // columns. OVERWRITES dlogits, which may alias logits.
  virtual void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss,
                                      int N, int V, int Vp) = 0;

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
  virtual void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                              int V) = 0;
  // With the global row_max[N]: sum_exp[N] = sum over local real columns of
  // exp(logits - row_max); target_logit[N] = logits[n, targets[n] - vocab_begin] when the
  // target is in this rank's range, else 0. Both overwritten. Then: all-reduce sum of both.
  virtual void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                               DevPtr targets, int N, int Vp_local, int vocab_begin, int V) = 0;
  // dlogits[N, Vp_local] = dloss * (exp(logits - row_max) / sum_exp - [column == target])
  // for local real columns, 0 for padded ones; row_max and sum_exp are the global values.
  // OVERWRITES dlogits, which may alias logits.
  virtual void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                                   DevPtr targets, float dloss, int N, int Vp_local,
                                   int vocab_begin, int V) = 0;
  // The final combine, on the device: losses[N] = log(sum_exp) + row_max - target_logit,
  // from the all-reduced values (fp32, as cross_entropy_forward). Overwrites losses.
  virtual void xent_finish(DevPtr losses, DevPtr row_max, DevPtr sum_exp, DevPtr target_logit,
                           int N) = 0;
  // One micro-batch's mean loss into a device accumulator: acc[0] (double) +=
  // float(sum_n losses[n] / N), the sum in double in row order, the mean rounded to fp32
  // (the order the host loop used, so reported losses stay bitwise the same).
  virtual void loss_accumulate(DevPtr acc, DevPtr losses, int N) = 0;

  // ---- optimizer ----------------------------------------------------------------
  // AdamW on n f32 elements: m, v updated in place; param -= lr * (mhat / (sqrt(vhat) +
  // eps) + weight_decay * param), with bias-corrected mhat and vhat. Then, when
  // compute_copy is not null (bf16), compute_copy[i] = bf16(param[i]) (round to nearest
  // even): the bf16 compute weights of mixed precision.
  virtual void adamw_update(DevPtr param, DevPtr grad, DevPtr m, DevPtr v, DevPtr compute_copy,
                            size_t n, const AdamWParams& p) = 0;
  // acc[0] (f64, device) += sum of x[i]^2 (x F) in double, over a summation tree that
  // depends only on n (not on threads). A step's gradient norm is one download of acc.
  virtual void sum_squares_accumulate(DevPtr acc, DevPtr x, size_t n) = 0;
  // Convenience (tests, tools): the sum of squares of x on the host; one download.
  double sum_squares(DevPtr x, size_t n);
  // Host f32 values to and from a device buffer of an F dtype: for bf16 the host rounds
  // to nearest even (float_to_bf16, the rounding every bf16 store uses) before the
  // upload, and widens exactly after the download. One transfer each; for loading,
  // tests and tools, not for the step.
  void upload_floats(DevPtr dst, const float* host, size_t n);
  void download_floats(float* host, DevPtr src, size_t n);

 protected:
  virtual DevPtr do_allocate(size_t bytes) = 0;  // 64-byte aligned, zero-filled, u8
  virtual void do_deallocate(DevPtr ptr) = 0;
  virtual void do_upload(DevPtr dst, const void* host_src, size_t bytes) = 0;
  virtual void do_download(void* host_dst, DevPtr src, size_t bytes) = 0;

 private:
  TransferCounts transfers_;
  AllocationCounts allocs_;
  std::unordered_map<void*, size_t> live_;  // address -> requested bytes
};

// The CPU backend (OpenBLAS sgemm + OpenMP). Always built. `threads` <= 0 means all cores.
// `checked`: device memory comes from kernels/cpu/checked_memory.h, inaccessible to host
// code outside an Ops call (tests; make_ops turns it on with TRIDENT_CHECK_DEVICE_ACCESS=1).
// Tests and benchmarks call it directly; the trainer asks make_ops (kernels/backend.h).
std::unique_ptr<Ops> make_cpu_ops(int threads = 0, bool checked = false);

// Owns one allocation made through an Ops object. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Ops& ops, size_t bytes) : ops_(&ops), ptr_(ops.allocate(bytes)), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ops_(o.ops_), ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = DevPtr();
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = DevPtr();
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (!ptr_.is_null()) ops_->deallocate(ptr_);
    ptr_ = DevPtr();
    bytes_ = 0;
  }
  DevPtr get() const { return ptr_; }  // u8
  // The allocation seen as `dtype` (no conversion).
  DevPtr as(DType dtype) const { return ptr_.as(dtype); }
  size_t bytes() const { return bytes_; }

 private:
  Ops* ops_ = nullptr;
  DevPtr ptr_;
  size_t bytes_ = 0;
};

inline DevPtr Ops::allocate(size_t bytes) {
  DevPtr p = do_allocate(bytes);
  ++allocs_.allocations;
  allocs_.live_bytes += bytes;
  if (allocs_.live_bytes > allocs_.peak_live_bytes) allocs_.peak_live_bytes = allocs_.live_bytes;
  live_[p.raw()] = bytes;
  return p;
}

inline void Ops::deallocate(DevPtr ptr) {
  if (ptr.is_null()) return;
  auto it = live_.find(ptr.raw());
  if (it != live_.end()) {  // (an address this object did not hand out is the backend's to judge)
    allocs_.live_bytes -= it->second;
    live_.erase(it);
  }
  ++allocs_.deallocations;
  do_deallocate(ptr);
}

inline void Ops::upload_floats(DevPtr dst, const float* host, size_t n) {
  if (dst.dtype() == DType::kF32) {
    upload(dst, host, n * sizeof(float));
    return;
  }
  std::vector<bf16_t> narrow(n);
  for (size_t i = 0; i < n; ++i) narrow[i] = float_to_bf16(host[i]);
  upload(dst.as(DType::kBF16), narrow.data(), n * sizeof(bf16_t));
}

inline void Ops::download_floats(float* host, DevPtr src, size_t n) {
  if (src.dtype() == DType::kF32) {
    download(host, src, n * sizeof(float));
    return;
  }
  std::vector<bf16_t> narrow(n);
  download(narrow.data(), src.as(DType::kBF16), n * sizeof(bf16_t));
  for (size_t i = 0; i < n; ++i) host[i] = bf16_to_float(narrow[i]);
}

inline double Ops::sum_squares(DevPtr x, size_t n) {
  DeviceBuffer acc(*this, sizeof(double));  // zero-filled
  sum_squares_accumulate(acc.as(DType::kF64), x, n);
  double host = 0.0;
  download(&host, acc.get(), sizeof(double));
  return host;
}

}  // namespace trident
