// CudaOps: kernels/ops.h on one CUDA device (contract: kernels/cuda/cuda_ops.h). Plain
// C++: the kernels are behind the launchers of cuda_kernels.h, the GEMMs behind
// GemmEngine, attention behind AttentionPath.
//
// Attention path, decided per shape (B, T, NH, NKV, HD, dtype) the first time the shape is
// seen — normally when the model asks attention_state_bytes, before it plans its arena —
// and kept for that shape (so backward always runs the path its forward ran):
// - bf16, TRIDENT_ATTENTION unset or "cudnn": cuDNN when it builds both plans for the
//   shape (cuDNN's flash attention; the default for bf16 training), else plain, with one
//   warning line per shape naming cuDNN's reason (T = 1, a short last batch below cuDNN
//   9.16's T % 128 rule, a head dim it lacks). Forcing "cudnn" falls back the same way:
//   a run never aborts over a shape cuDNN rejects.
// - TRIDENT_ATTENTION=plain, or f32 (cuDNN's path is bf16 only): plain.
// The state is a 64-byte tag (byte 0: the path, attention_state_tag) and then the path.s
// state: cuDNN the row log-sum-exp, plain the probabilities in the io dtype. A shape first
// seen at a call (not asked for) runs in a buffer sized for a larger shape, so a plain
// fallback there keeps nothing and recomputes the probabilities in backward (the tag
// says so). With TRIDENT_CUDA_SYNC=1 backward reads the tag back and CHECK-fails when it
// is not the path forward wrote (without it, reading it would cost a synchronisation per
// layer).
#include "kernels/cuda/cuda_ops.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "core/check.h"
#include "core/log.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe_kernels.h"
#include "kernels/cuda/peak_table.h"

namespace trident::cuda {

const char* attention_choice_name(AttentionChoice choice) {
  switch (choice) {
    case AttentionChoice::kCudnn:
      return "cudnn";
    case AttentionChoice::kPlain:
      return "plain";
    case AttentionChoice::kAuto:
      break;
  }
  return "auto";
}

Result<AttentionChoice> attention_choice_from_env(const char* value) {
  if (value == nullptr || *value == '\0') return AttentionChoice::kAuto;
  if (std::strcmp(value, "plain") == 0) return AttentionChoice::kPlain;
  if (std::strcmp(value, "cudnn") == 0) return AttentionChoice::kCudnn;
  return Status::invalid_config(std::string("TRIDENT_ATTENTION: expected plain or cudnn, got '") +
                                value + "'");
}

bool attention_tries_cudnn(AttentionChoice choice, DType dtype) {
  return choice != AttentionChoice::kPlain && dtype == DType::kBF16;
}

char attention_state_tag(AttentionStatePath path) {
  switch (path) {
    case AttentionStatePath::kCudnn:
      return 'C';
    case AttentionStatePath::kPlainRecompute:
      return 'R';
    case AttentionStatePath::kPlain:
      break;
  }
  return 'P';
}

size_t attention_state_total_bytes(AttentionStatePath path, AttentionShape shape) {
  size_t payload = 0;
  if (path == AttentionStatePath::kCudnn) {
    payload = cudnn_attention_state_bytes(shape);
  } else {
    shape.recompute = path == AttentionStatePath::kPlainRecompute;
    payload = plain_attention_state_bytes(shape);
  }
  return payload > SIZE_MAX - kAttentionStateTagBytes ? SIZE_MAX : payload + kAttentionStateTagBytes;
}

std::string attention_fallback_message(AttentionChoice choice, const AttentionShape& shape,
                                       const Status& why) {
  return std::string("cuda attention: ") +
         (choice == AttentionChoice::kCudnn ? "TRIDENT_ATTENTION=cudnn, but " : "") +
         "cuDNN cannot serve B=" + std::to_string(shape.B) + " T=" + std::to_string(shape.T) +
         " NH=" + std::to_string(shape.NH) + " NKV=" + std::to_string(shape.NKV) +
         " HD=" + std::to_string(shape.HD) + " (" + why.message() +
         "); the plain path runs this shape";
}

AttentionStatePath AttentionPlanner::decide(const AttentionShape& s, bool asked,
                                            const PrepareCudnn& prepare_cudnn) {
  const auto key = std::make_tuple(s.B, s.T, s.NH, s.NKV, s.HD, s.dtype);
  auto it = decisions_.find(key);
  if (it != decisions_.end()) return it->second;
  AttentionStatePath path = AttentionStatePath::kPlain;
  if (attention_tries_cudnn(choice_, s.dtype)) {
    const Status ready = prepare_cudnn(s);
    if (ready.is_ok()) {
      path = AttentionStatePath::kCudnn;
    } else {
      log::warn("{}", attention_fallback_message(choice_, s, ready));
      ++fallbacks_;
      if (!asked) path = AttentionStatePath::kPlainRecompute;
    }
  }
  decisions_.emplace(key, path);
  return path;
}

GemmDesc linear_gemm_desc(LinearGemm which, int N, int IC, int OC) {
  GemmDesc d;
  switch (which) {
    case LinearGemm::kForward:
      d.M = N;
      d.N = OC;
      d.K = IC;
      d.trans_b = true;
      break;
    case LinearGemm::kDinp:
    case LinearGemm::kDinpSet:
      d.M = N;
      d.N = IC;
      d.K = OC;
      d.accumulate = which == LinearGemm::kDinp;
      break;
    case LinearGemm::kDweight:
      d.M = OC;
      d.N = IC;
      d.K = N;
      d.trans_a = true;
      d.accumulate = true;
      break;
  }
  return d;
}

namespace {

size_t elems(int a, int b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }

// CUDA's encoding, 1000 * major + 10 * minor: 13010 -> "13.1".
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// cuBLASLt's and cuDNN's, 10000 * major + 100 * minor + patch: 91900 -> "9.19.0".
std::string library_version_text(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

class CudaOps final : public Ops {
 public:
  CudaOps(int device, AttentionChoice choice) : device_(device), choice_(choice), planner_(choice) {}

  // Everything that can fail cleanly (no device, no cuBLASLt) is here, not in the
  // constructor. Called once by make_cuda_ops.
  Status init() {
    const cudaError_t err = cudaSetDevice(device_);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear it
      return Status::invalid_config("runtime.device: cuda: cudaSetDevice(" +
                                    std::to_string(device_) + "): " + cudaGetErrorString(err));
    }
    cudaDeviceProp prop{};
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Keep freed memory in the pool (the default threshold 0 returns it to the driver at
    // every synchronisation, and the next allocation pays for it again).
    cudaMemPool_t pool = nullptr;
    TRIDENT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t threshold = UINT64_MAX;
    TRIDENT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    const char* sync = std::getenv("TRIDENT_CUDA_SYNC");
    sync_ = sync != nullptr && std::strcmp(sync, "1") == 0;

    Result<std::unique_ptr<GemmEngine>> gemm = GemmEngine::create(stream_);
    if (!gemm.is_ok()) {
      return Status::invalid_config("runtime.device: cuda: cuBLASLt: " + gemm.status().message());
    }
    gemm_ = std::move(gemm).value();
    plain_ = make_plain_attention(*this, *gemm_, stream_);
    TRIDENT_CHECK(plain_ != nullptr);
    return Status::ok();
  }

  ~CudaOps() override {
    if (stream_ == nullptr) return;  // init() failed before the stream existed
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudnn_.reset();  // the paths free their scratch through this Ops
    plain_.reset();
    for (Scratch& s : scratch_) {
      deallocate(s.ptr);
      s = Scratch{};
    }
    gemm_.reset();
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (staging_ != nullptr) TRIDENT_CUDA_CHECK(cudaFreeHost(staging_));
    TRIDENT_CUDA_CHECK(cudaStreamDestroy(stream_));
  }

  const char* name() const override { return "cuda"; }

  std::string description() const override {
    int driver = 0, runtime = 0;
    TRIDENT_CUDA_CHECK(cudaDriverGetVersion(&driver));
    TRIDENT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    std::string attention = choice_ == AttentionChoice::kAuto
                                ? "cudnn for bf16 shapes it plans, else plain"
                                : std::string(attention_choice_name(choice_)) +
                                      " (TRIDENT_ATTENTION)";
    if (choice_ == AttentionChoice::kCudnn) attention += ", plain for f32 and shapes cuDNN rejects";
    return "cuda device " + std::to_string(device_) + ": " + device_name_ + " | driver " +
           cuda_version_text(driver) + ", runtime " + cuda_version_text(runtime) +
           " | cuBLASLt " + library_version_text(cublasLtGetVersion()) + " | cuDNN " +
           library_version_text(cudnnGetVersion()) + " | attention " + attention +
           (sync_ ? " | TRIDENT_CUDA_SYNC=1" : "");
  }

  void* native_stream() const override { return stream_; }
  std::optional<DeviceMemory> device_memory() const override {
    DeviceMemory m;
    TRIDENT_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
    m.pinned_host_bytes = kStagingBytes;  // the most staging_for holds (one chunk)
    m.source = "cudaMemGetInfo, device " + std::to_string(device_);
    return m;
  }
  double peak_flops() const override {
    const double peak = peak_bf16_flops_for(device_name_);
    if (peak <= 0 && !peak_logged_) {
      log::warn("cuda: no peak FLOP/s known for '{}': MFU is not reported; set "
                "runtime.peak_tflops",
                device_name_);
      peak_logged_ = true;
    }
    return peak;
  }

  // ---- memory -------------------------------------------------------------------
  void zero(DevPtr dst, size_t bytes) override {
    Op op(*this, "zero");
    if (bytes > 0) TRIDENT_CUDA_CHECK(cudaMemsetAsync(dst.raw(), 0, bytes, stream_));
  }
  void copy(DevPtr dst, DevPtr src, size_t bytes) override {
    Op op(*this, "copy");
    move_bytes(dst.raw(), src.raw(), bytes);
  }
  void cast(DevPtr dst, DevPtr src, size_t n) override {
    Op op(*this, "cast");
    const FArg d = f(op, dst, "dst"), s = f(op, src, "src");
    if (n == 0) return;
    if (dst.dtype() == src.dtype()) {
      move_bytes(dst.raw(), src.raw(), n * dtype_size(dst.dtype()));
    } else {
      cuda::cast(d, s, n, stream_);
    }
  }

  // ---- embeddings ---------------------------------------------------------------
  void embedding_forward(DevPtr out, DevPtr tokens, DevPtr wte, DevPtr wpe, int B, int T, int C,
                         int vocab_begin, int vocab_local) override {
    Op op(*this, "embedding_forward");
    cuda::embedding_forward(f(op, out, "out"), i32(op, tokens, "tokens"), f(op, wte, "wte"),
                            f(op, wpe, "wpe"), B, T, C, vocab_begin, vocab_local, stream_);
  }
  void embedding_backward(DevPtr dwte, DevPtr dwpe, DevPtr dout, DevPtr tokens, int B, int T, int C,
                          int vocab_begin, int vocab_local) override {
    Op op(*this, "embedding_backward");
    cuda::embedding_backward(f32(op, dwte, "dwte"), f32(op, dwpe, "dwpe"), f(op, dout, "dout"),
                             i32(op, tokens, "tokens"), B, T, C, vocab_begin, vocab_local, stream_);
  }

  // ---- normalisation ------------------------------------------------------------
  void layernorm_forward(DevPtr out, DevPtr mean, DevPtr rstd, DevPtr inp, DevPtr weight,
                         DevPtr bias, int N, int C, float eps) override {
    Op op(*this, "layernorm_forward");
    cuda::layernorm_forward(f(op, out, "out"), f32(op, mean, "mean"), f32(op, rstd, "rstd"),
                            f(op, inp, "inp"), f(op, weight, "weight"), f(op, bias, "bias"), N, C,
                            eps, stream_);
  }
  void layernorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                          DevPtr weight, DevPtr mean, DevPtr rstd, int N, int C) override {
    Op op(*this, "layernorm_backward");
    cuda::layernorm_backward(f(op, dinp, "dinp"), f32(op, dweight, "dweight"),
                             f32(op, dbias, "dbias"), f(op, dout, "dout"), f(op, inp, "inp"),
                             f(op, weight, "weight"), f32(op, mean, "mean"), f32(op, rstd, "rstd"),
                             N, C, column_partials(N, C, 2), stream_);
  }
  void rmsnorm_forward(DevPtr out, DevPtr rstd, DevPtr inp, DevPtr weight, int N, int C,
                       float eps) override {
    Op op(*this, "rmsnorm_forward");
    cuda::rmsnorm_forward(f(op, out, "out"), f32(op, rstd, "rstd"), f(op, inp, "inp"),
                          f(op, weight, "weight"), N, C, eps, stream_);
  }
  void rmsnorm_backward(DevPtr dinp, DevPtr dweight, DevPtr dout, DevPtr inp, DevPtr weight,
                        DevPtr rstd, int N, int C) override {
    Op op(*this, "rmsnorm_backward");
    cuda::rmsnorm_backward(f(op, dinp, "dinp"), f32(op, dweight, "dweight"), f(op, dout, "dout"),
                           f(op, inp, "inp"), f(op, weight, "weight"), f32(op, rstd, "rstd"), N, C,
                           column_partials(N, C, 1), stream_);
  }

  // ---- linear -------------------------------------------------------------------
  // out[N, OC] = inp[N, IC] @ weight[OC, IC]^T + bias: D[M=N, N=OC] = A[N, IC] @ B^T.
  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    Op op(*this, "matmul_forward");
    f(op, out, "out");
    f(op, inp, "inp");
    f(op, weight, "weight");
    f(op, bias, "bias");
    TRIDENT_CHECK_MSG(N >= 0 && IC > 0 && OC >= 0, "cuda matmul_forward: N " + std::to_string(N) +
                                                       " IC " + std::to_string(IC) + " OC " +
                                                       std::to_string(OC));
    gemm(linear_gemm_desc(LinearGemm::kForward, N, IC, OC), inp, weight, out, bias);
  }
  using Ops::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    Op op(*this, "matmul_backward");
    f(op, dinp, "dinp");
    f32(op, dweight, "dweight");
    f32(op, dbias, "dbias");
    f(op, dout, "dout");
    f(op, inp, "inp");
    f(op, weight, "weight");
    if (!dinp.is_null()) {  // dinp[N, IC] (+)= dout[N, OC] @ weight[OC, IC]
      const LinearGemm which =
          dinp_write == GradWrite::kSet ? LinearGemm::kDinpSet : LinearGemm::kDinp;
      gemm(linear_gemm_desc(which, N, IC, OC), dout, weight, dinp, DevPtr());
    }
    if (!dweight.is_null())  // dweight[OC, IC] += dout^T @ inp (K = the N rows)
      gemm(linear_gemm_desc(LinearGemm::kDweight, N, IC, OC), dout, inp, dweight, DevPtr());
    if (!dbias.is_null()) {
      cuda::column_sum_accumulate(dbias.raw_as<float>(), farg(dout), N, OC,
                                  column_partials(N, OC, 1), stream_);
    }
  }

  // ---- attention ----------------------------------------------------------------
  void rope_forward(DevPtr x, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Op op(*this, "rope_forward");
    void* table = scratch(kRope, cuda::rope_table_bytes(T, HD)).raw();
    cuda::rope(f(op, x, "x"), table, B, T, H, HD, theta, pos_offset, 1.0f, stream_);
  }
  void rope_backward(DevPtr dx, int B, int T, int H, int HD, float theta, int pos_offset) override {
    Op op(*this, "rope_backward");
    void* table = scratch(kRope, cuda::rope_table_bytes(T, HD)).raw();
    cuda::rope(f(op, dx, "dx"), table, B, T, H, HD, theta, pos_offset, -1.0f, stream_);
  }
  void qkv_split(DevPtr q, DevPtr k, DevPtr v, DevPtr qkv, int B, int T, int NH, int NKV, int HD,
                 bool rotate, float theta, int pos_offset) override {
    Op op(*this, "qkv_split");
    TRIDENT_CHECK_MSG(HD % 2 == 0, "qkv_split: head_dim " + std::to_string(HD) + " is odd");
    void* table = rotate ? scratch(kRope, cuda::rope_table_bytes(T, HD)).raw() : nullptr;
    cuda::qkv_permute(f(op, q, "q"), f(op, k, "k"), f(op, v, "v"), f(op, qkv, "qkv"), table, B, T,
                      NH, NKV, HD, rotate, theta, pos_offset, 1.0f, true, stream_);
  }
  void qkv_merge(DevPtr dqkv, DevPtr dq, DevPtr dk, DevPtr dv, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset) override {
    Op op(*this, "qkv_merge");
    TRIDENT_CHECK_MSG(HD % 2 == 0, "qkv_merge: head_dim " + std::to_string(HD) + " is odd");
    void* table = rotate ? scratch(kRope, cuda::rope_table_bytes(T, HD)).raw() : nullptr;
    cuda::qkv_permute(f(op, dq, "dq"), f(op, dk, "dk"), f(op, dv, "dv"), f(op, dqkv, "dqkv"),
                      table, B, T, NH, NKV, HD, rotate, theta, pos_offset, -1.0f, false, stream_);
  }

  size_t attention_state_bytes(int B, int T, int NH, int NKV, int HD,
                               DType dtype) const override {
    const AttentionShape shape{B, T, NH, NKV, HD, dtype};
    if (!plannable(shape)) {
      return attention_state_total_bytes(AttentionStatePath::kPlain, shape);  // calls CHECK-fail
    }
    return attention_state_total_bytes(decide(shape, /*asked=*/true), shape);
  }
  size_t attention_workspace_bytes(int B, int T, int NH, int NKV, int HD,
                                   DType dtype) const override {
    AttentionShape shape{B, T, NH, NKV, HD, dtype};
    if (!plannable(shape)) return 0;
    const AttentionStatePath path = decide(shape, /*asked=*/true);
    shape.recompute = path == AttentionStatePath::kPlainRecompute;
    return path == AttentionStatePath::kCudnn ? cudnn_->workspace_bytes(shape)
                                              : plain_->workspace_bytes(shape);
  }
  void attention_forward(DevPtr out, DevPtr state, DevPtr q, DevPtr k, DevPtr v, int B, int T,
                         int NH, int NKV, int HD) override {
    Op op(*this, "attention_forward");
    AttentionShape shape = attention_shape(op, {q, k, v, out}, B, T, NH, NKV, HD);
    expect(op, state, DType::kU8, "state");
    TRIDENT_CHECK_MSG(!state.is_null(), "cuda attention_forward: null state");
    const AttentionStatePath path = decide(shape, /*asked=*/false);
    shape.recompute = path == AttentionStatePath::kPlainRecompute;
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(state.raw(), attention_state_tag(path), 1, stream_));
    path_of(path).forward(out, state.byte_offset(kAttentionStateTagBytes), q, k, v, shape);
  }
  void attention_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr state,
                          DevPtr q, DevPtr k, DevPtr v, int B, int T, int NH, int NKV,
                          int HD) override {
    Op op(*this, "attention_backward");
    AttentionShape shape =
        attention_shape(op, {q, k, v, out, dout, dq, dk, dv}, B, T, NH, NKV, HD);
    expect(op, state, DType::kU8, "state");
    TRIDENT_CHECK_MSG(!state.is_null(), "cuda attention_backward: null state");
    const AttentionStatePath path = decide(shape, /*asked=*/false);  // forward's (kept)
    shape.recompute = path == AttentionStatePath::kPlainRecompute;
    if (sync_) check_state_tag(state, path, shape);
    path_of(path).backward(dq, dk, dv, dout, out, state.byte_offset(kAttentionStateTagBytes), q,
                           k, v, shape);
  }

  // The plain kernel of attention_kernels.h, whatever the attention path: one row of
  // scores per (sequence, query row, head) in grow-only scratch.
  void attention_cached_forward(DevPtr out, DevPtr q, DevPtr k_cache, DevPtr v_cache, int B,
                                int Tq, int pos, int capacity, int NH, int NKV,
                                int HD) override {
    Op op(*this, "attention_cached_forward");
    const AttentionShape shape = attention_shape(op, {q, k_cache, v_cache, out}, B, Tq, NH, NKV, HD);
    TRIDENT_CHECK_MSG(B > 0 && Tq > 0 && pos >= 0 && pos <= capacity - Tq,
                      "cuda attention_cached_forward: B " + std::to_string(B) + " Tq " +
                          std::to_string(Tq) + " pos " + std::to_string(pos) + " capacity " +
                          std::to_string(capacity));
    const size_t floats = elems(B, Tq) * elems(NH, pos + Tq);
    float* scores = static_cast<float*>(scratch(kScores, floats * sizeof(float)).raw());
    cuda::cached_attention_forward(out.raw(), q.raw(), k_cache.raw(), v_cache.raw(), shape.dtype,
                                   scores, B, Tq, pos, capacity, NH, NKV, HD, stream_);
  }

  // Block attention: the simple kernels of attention_block.h, the scores (forward) or P
  // and dS (backward) of every row in grow-only scratch.
  void attention_block_forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                               const AttentionBlock& s) override {
    Op op(*this, "attention_block_forward");
    const cuda::BlockDims d = block_dims(s);
    float* scores = static_cast<float*>(
        scratch(kScores, static_cast<size_t>(d.rows()) * d.Tk * sizeof(float)).raw());
    cuda::attention_block_forward(f(op, out, "out"), f32(op, lse, "lse"), f(op, q, "q"),
                                  f(op, k, "k"), f(op, v, "v"), scores, d, stream_);
  }
  void attention_block_merge(DevPtr out, DevPtr lse, DevPtr block_out, DevPtr block_lse,
                             const AttentionBlock& s) override {
    Op op(*this, "attention_block_merge");
    cuda::BlockDims d = block_dims(s);
    d.NKV = d.NH;  // the merge reads no keys: whatever kv heads the caller left in `s`
    cuda::attention_block_merge(f(op, out, "out"), f32(op, lse, "lse"),
                                f(op, block_out, "block_out"), f32(op, block_lse, "block_lse"),
                                d, stream_);
  }
  void attention_block_backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                                DevPtr lse, DevPtr q, DevPtr k, DevPtr v,
                                const AttentionBlock& s) override {
    Op op(*this, "attention_block_backward");
    const cuda::BlockDims d = block_dims(s);
    float* pds = static_cast<float*>(
        scratch(kScores, 2 * static_cast<size_t>(d.rows()) * d.Tk * sizeof(float)).raw());
    cuda::attention_block_backward(f(op, dq, "dq"), f(op, dk, "dk"), f(op, dv, "dv"),
                                   f(op, dout, "dout"), f(op, out, "out"), f32(op, lse, "lse"),
                                   f(op, q, "q"), f(op, k, "k"), f(op, v, "v"), pds, d, stream_);
  }

  // ---- pointwise ----------------------------------------------------------------
  void gelu_forward(DevPtr out, DevPtr inp, size_t n) override {
    Op op(*this, "gelu_forward");
    cuda::gelu_forward(f(op, out, "out"), f(op, inp, "inp"), n, stream_);
  }
  void gelu_backward(DevPtr dinp, DevPtr dout, DevPtr inp, size_t n) override {
    Op op(*this, "gelu_backward");
    cuda::gelu_backward(f(op, dinp, "dinp"), f(op, dout, "dout"), f(op, inp, "inp"), n, stream_);
  }
  void swiglu_forward(DevPtr out, DevPtr gate, DevPtr up, size_t n) override {
    Op op(*this, "swiglu_forward");
    cuda::swiglu_forward(f(op, out, "out"), f(op, gate, "gate"), f(op, up, "up"), n, stream_);
  }
  void swiglu_backward(DevPtr dgate, DevPtr dup, DevPtr dout, DevPtr gate, DevPtr up,
                       size_t n) override {
    Op op(*this, "swiglu_backward");
    cuda::swiglu_backward(f(op, dgate, "dgate"), f(op, dup, "dup"), f(op, dout, "dout"),
                          f(op, gate, "gate"), f(op, up, "up"), n, stream_);
  }
  void moe_route_forward(DevPtr weights, DevPtr experts, DevPtr probs, DevPtr lse, DevPtr stats,
                         DevPtr logits, int N, int E, int K) override {
    Op op(*this, "moe_route_forward");
    TRIDENT_CHECK_MSG(K >= 1 && K <= E, "cuda moe_route_forward: K " + std::to_string(K) +
                                            " is not in [1, E = " + std::to_string(E) + "]");
    cuda::moe_route_forward(f32(op, weights, "weights"), i32_out(op, experts, "experts"),
                            f32(op, probs, "probs"), f32(op, lse, "lse"), f32(op, stats, "stats"),
                            f(op, logits, "logits"), N, E, K, stream_);
  }
  void moe_route_backward(DevPtr dlogits, DevPtr dweights, DevPtr weights, DevPtr probs,
                          DevPtr lse, DevPtr experts, DevPtr prob_grad, float z_scale, int N,
                          int E, int K) override {
    Op op(*this, "moe_route_backward");
    cuda::moe_route_backward(f(op, dlogits, "dlogits"), f32(op, dweights, "dweights"),
                             f32(op, weights, "weights"), f32(op, probs, "probs"),
                             f32(op, lse, "lse"), i32(op, experts, "experts"),
                             f32(op, prob_grad, "prob_grad"), z_scale, N, E, K, stream_);
  }
  void moe_dispatch(DevPtr order, DevPtr position, DevPtr experts, int N, int K,
                    int E) override {
    Op op(*this, "moe_dispatch");
    cuda::moe_dispatch(i32_out(op, order, "order"), i32_out(op, position, "position"),
                       i32(op, experts, "experts"), N, K, E, stream_);
  }
  void moe_gather_forward(DevPtr out, DevPtr inp, DevPtr order, int N, int K, int C) override {
    Op op(*this, "moe_gather_forward");
    cuda::moe_gather_forward(f(op, out, "out"), f(op, inp, "inp"), i32(op, order, "order"), N, K,
                             C, stream_);
  }
  void moe_gather_backward(DevPtr dinp, DevPtr dout, DevPtr position, int N, int K,
                           int C) override {
    Op op(*this, "moe_gather_backward");
    cuda::moe_gather_backward(f(op, dinp, "dinp"), f(op, dout, "dout"),
                              i32(op, position, "position"), N, K, C, stream_);
  }
  void moe_combine_forward(DevPtr out, DevPtr inp, DevPtr weights, DevPtr position, int N, int K,
                           int C) override {
    Op op(*this, "moe_combine_forward");
    cuda::moe_combine_forward(f(op, out, "out"), f(op, inp, "inp"), f32(op, weights, "weights"),
                              i32(op, position, "position"), N, K, C, stream_);
  }
  void moe_combine_backward(DevPtr dinp, DevPtr dweights, DevPtr dout, DevPtr inp, DevPtr weights,
                            DevPtr position, int N, int K, int C) override {
    Op op(*this, "moe_combine_backward");
    cuda::moe_combine_backward(f(op, dinp, "dinp"), f32(op, dweights, "dweights"),
                               f(op, dout, "dout"), f(op, inp, "inp"), f32(op, weights, "weights"),
                               i32(op, position, "position"), N, K, C, stream_);
  }
  void add(DevPtr out, DevPtr a, DevPtr b, size_t n) override {
    Op op(*this, "add");
    cuda::add(f(op, out, "out"), f(op, a, "a"), f(op, b, "b"), n, stream_);
  }
  void accumulate(DevPtr dst, DevPtr src, size_t n) override {
    Op op(*this, "accumulate");
    cuda::accumulate(f(op, dst, "dst"), f(op, src, "src"), n, stream_);
  }
  void scale(DevPtr x, float s, size_t n) override {
    Op op(*this, "scale");
    cuda::scale(f(op, x, "x"), s, n, stream_);
  }

  // ---- loss ---------------------------------------------------------------------
  void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                             int Vp) override {
    Op op(*this, "cross_entropy_forward");
    check_vocab(op, V, Vp);
    cuda::cross_entropy_forward(f32(op, losses, "losses"), f(op, logits, "logits"),
                                i32(op, targets, "targets"), N, V, Vp, stream_);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    Op op(*this, "cross_entropy_backward");
    check_vocab(op, V, Vp);
    check_alias(op, dlogits, logits);
    cuda::cross_entropy_backward(f(op, dlogits, "dlogits"), f(op, logits, "logits"),
                                 i32(op, targets, "targets"), dloss, N, V, Vp, stream_);
  }
  void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    Op op(*this, "xent_local_max");
    check_local(op, N, Vp_local, vocab_begin, V);
    cuda::xent_local_max(f32(op, row_max, "row_max"), f(op, logits, "logits"), N, Vp_local,
                         vocab_begin, V, stream_);
  }
  void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                       DevPtr targets, int N, int Vp_local, int vocab_begin, int V) override {
    Op op(*this, "xent_local_sums");
    check_local(op, N, Vp_local, vocab_begin, V);
    cuda::xent_local_sums(f32(op, sum_exp, "sum_exp"), f32(op, target_logit, "target_logit"),
                          f(op, logits, "logits"), f32(op, row_max, "row_max"),
                          i32(op, targets, "targets"), N, Vp_local, vocab_begin, V, stream_);
  }
  void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                           DevPtr targets, float dloss, int N, int Vp_local, int vocab_begin,
                           int V) override {
    Op op(*this, "xent_local_backward");
    check_local(op, N, Vp_local, vocab_begin, V);
    check_alias(op, dlogits, logits);
    cuda::xent_local_backward(f(op, dlogits, "dlogits"), f(op, logits, "logits"),
                              f32(op, row_max, "row_max"), f32(op, sum_exp, "sum_exp"),
                              i32(op, targets, "targets"), dloss, N, Vp_local, vocab_begin, V,
                              stream_);
  }
  void xent_finish(DevPtr losses, DevPtr row_max, DevPtr sum_exp, DevPtr target_logit,
                   int N) override {
    Op op(*this, "xent_finish");
    TRIDENT_CHECK_MSG(N >= 0, "cuda xent_finish: N " + std::to_string(N));
    cuda::xent_finish(f32(op, losses, "losses"), f32(op, row_max, "row_max"),
                      f32(op, sum_exp, "sum_exp"), f32(op, target_logit, "target_logit"), N,
                      stream_);
  }
  void loss_accumulate(DevPtr acc, DevPtr losses, int N) override {
    Op op(*this, "loss_accumulate");
    TRIDENT_CHECK_MSG(N >= 1, "cuda loss_accumulate: N " + std::to_string(N));
    cuda::loss_accumulate(f64(op, acc, "acc"), f32(op, losses, "losses"), N, stream_);
  }

  // ---- optimizer ----------------------------------------------------------------
  void adamw_update(DevPtr param, DevPtr grad, DevPtr m, DevPtr v, DevPtr compute_copy, size_t n,
                    const AdamWParams& p) override {
    Op op(*this, "adamw_update");
    expect(op, compute_copy, DType::kBF16, "compute_copy");
    // Bias corrections in double, rounded once: the CPU's (kernels/cpu/adamw.cpp).
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), p.step));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), p.step));
    cuda::adamw_update(f32(op, param, "param"), f32(op, grad, "grad"), f32(op, m, "m"),
                       f32(op, v, "v"), static_cast<uint16_t*>(compute_copy.raw()), n, p.lr,
                       p.beta1, p.beta2, p.eps, p.weight_decay, bc1, bc2, stream_);
  }
  void sum_squares_accumulate(DevPtr acc, DevPtr x, size_t n) override {
    Op op(*this, "sum_squares_accumulate");
    double* acc_d = f64(op, acc, "acc");
    const FArg xf = f(op, x, "x");
    if (n == 0) return;
    DevPtr partials = scratch(kPartials, sum_squares_partials(n) * sizeof(double));
    cuda::sum_squares_accumulate(acc_d, xf, n, static_cast<double*>(partials.raw()), stream_);
  }

 protected:
  DevPtr do_allocate(size_t bytes) override {
    // At least one 256-byte granule, so a 0-byte request still gets a unique address.
    const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    void* p = nullptr;
    TRIDENT_CUDA_CHECK(cudaMallocAsync(&p, rounded, stream_));
    TRIDENT_CHECK_MSG(reinterpret_cast<uintptr_t>(p) % 64 == 0,
                      "cuda allocate: address not 64-byte aligned");
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
    after_op("allocate");
    return DevPtr::wrap(p, DType::kU8);
  }
  void do_deallocate(DevPtr ptr) override {
    TRIDENT_CUDA_CHECK(cudaFreeAsync(ptr.raw(), stream_));
    after_op("deallocate");
  }
  void do_upload(DevPtr dst, const void* host_src, size_t bytes) override {
    const char* src = static_cast<const char*>(host_src);
    char* d = static_cast<char*>(dst.raw());
    for (size_t off = 0; off < bytes; off += kStagingBytes) {
      const size_t chunk = std::min(kStagingBytes, bytes - off);
      void* staging = staging_for(chunk);
      std::memcpy(staging, src + off, chunk);
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(d + off, staging, chunk, cudaMemcpyHostToDevice, stream_));
      // The staging is reused by the next chunk or call: wait until the copy has read it.
      TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    after_op("upload");
  }
  void do_download(void* host_dst, DevPtr src, size_t bytes) override {
    char* dst = static_cast<char*>(host_dst);
    const char* s = static_cast<const char*>(src.raw());
    for (size_t off = 0; off < bytes; off += kStagingBytes) {
      const size_t chunk = std::min(kStagingBytes, bytes - off);
      void* staging = staging_for(chunk);
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(staging, s + off, chunk, cudaMemcpyDeviceToHost, stream_));
      TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::memcpy(dst + off, staging, chunk);
    }
    after_op("download");
  }

 private:
  // One entry point: names the op for dtype messages and, with TRIDENT_CUDA_SYNC=1,
  // synchronises and checks at its end.
  class Op {
   public:
    Op(CudaOps& ops, const char* name) : ops_(ops), name_(name) {}
    ~Op() { ops_.after_op(name_); }
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    const char* name() const { return name_; }

   private:
    CudaOps& ops_;
    const char* name_;
  };

  void after_op(const char* name) {
    if (!sync_) return;
    const cudaError_t err = cudaStreamSynchronize(stream_);
    TRIDENT_CHECK_MSG(err == cudaSuccess, std::string("cuda ") + name + " (TRIDENT_CUDA_SYNC): " +
                                              cudaGetErrorName(err) + ": " +
                                              cudaGetErrorString(err));
    TRIDENT_CUDA_CHECK_LAUNCH();
  }

  [[noreturn]] static void wrong_dtype(const Op& op, DevPtr p, const char* want, const char* arg) {
    check_failed("argument dtype",
                 std::string("cuda ") + op.name() + ": argument " + arg + " has dtype " +
                     dtype_name(p.dtype()) + ", want " + want,
                 __FILE__, __LINE__);
  }
  // A null pointer is "absent" and passes every check.
  static void expect(const Op& op, DevPtr p, DType want, const char* arg) {
    if (!p.is_null() && p.dtype() != want) wrong_dtype(op, p, dtype_name(want), arg);
  }
  static FArg f(const Op& op, DevPtr p, const char* arg) {
    if (!p.is_null() && !is_float_dtype(p.dtype())) wrong_dtype(op, p, "f32 or bf16", arg);
    return farg(p);
  }
  static float* f32(const Op& op, DevPtr p, const char* arg) {
    expect(op, p, DType::kF32, arg);
    return static_cast<float*>(p.raw());
  }
  static const int32_t* i32(const Op& op, DevPtr p, const char* arg) {
    expect(op, p, DType::kI32, arg);
    return static_cast<const int32_t*>(p.raw());
  }
  static int32_t* i32_out(const Op& op, DevPtr p, const char* arg) {
    expect(op, p, DType::kI32, arg);
    return static_cast<int32_t*>(p.raw());
  }
  static double* f64(const Op& op, DevPtr p, const char* arg) {
    expect(op, p, DType::kF64, arg);
    return static_cast<double*>(p.raw());
  }
  static void check_vocab(const Op& op, int V, int Vp) {
    TRIDENT_CHECK_MSG(V > 0 && Vp >= V, std::string("cuda ") + op.name() + ": V " +
                                            std::to_string(V) + " Vp " + std::to_string(Vp));
  }
  static void check_local(const Op& op, int N, int Vp_local, int vocab_begin, int V) {
    TRIDENT_CHECK_MSG(N >= 0 && Vp_local >= 0 && vocab_begin >= 0 && V > 0,
                      std::string("cuda ") + op.name() + ": N " + std::to_string(N) +
                          " Vp_local " + std::to_string(Vp_local) + " vocab_begin " +
                          std::to_string(vocab_begin) + " V " + std::to_string(V));
  }
  // The kernels read each element before writing it, in the same thread: aliasing is safe
  // only when both views have the same element size.
  static void check_alias(const Op& op, DevPtr dlogits, DevPtr logits) {
    TRIDENT_CHECK_MSG(dlogits.raw() != logits.raw() || dlogits.dtype() == logits.dtype(),
                      std::string("cuda ") + op.name() +
                          ": dlogits aliases logits with another dtype");
  }

  // memmove on the device: cudaMemcpyAsync does not allow overlapping ranges, so an
  // overlapping copy goes through scratch.
  void move_bytes(void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    const bool overlap = d < s + bytes && s < d + bytes;
    if (!overlap) {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    void* tmp = scratch(kOverlap, bytes).raw();
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  // D = op(A) @ op(B) (+ D) (+ bias) with d's shape fields set; the dtypes are filled here.
  // A and B of different dtypes: the bf16 one is widened into f32 scratch (exact). An f32
  // product, or an f32 bias, into a bf16 output: computed into f32 scratch (holding the
  // widened output when accumulating), then rounded into the output once. The bias takes
  // the GEMM output's dtype (cast into scratch when it differs: then only bf16 -> f32,
  // exact).
  void gemm(GemmDesc d, DevPtr a, DevPtr b, DevPtr out, DevPtr bias) {
    if (d.M == 0 || d.N == 0) return;
    if (d.K == 0 && d.accumulate) return;  // adds nothing
    const auto address = [](DevPtr p) { return reinterpret_cast<uintptr_t>(p.raw()); };
    if (!gemm_layout_ok(d.trans_a, d.trans_b, static_cast<uint64_t>(d.M),
                        static_cast<uint64_t>(d.N), static_cast<uint64_t>(d.K),
                        {address(a), address(b), address(out), address(bias)})) {
      cuda::simple_gemm(d.trans_a, d.trans_b, d.M, d.N, d.K, farg(a), farg(b), farg(out),
                        farg(bias), d.accumulate, stream_);
      return;
    }
    const size_t a_elems = elems(d.M, d.K), b_elems = elems(d.K, d.N), d_elems = elems(d.M, d.N);
    if (a.dtype() != b.dtype()) {
      if (a.dtype() == DType::kBF16) {
        a = widened(kOperandA, a, a_elems);
      } else {
        b = widened(kOperandB, b, b_elems);
      }
    }
    DevPtr dst = out;
    // cuBLASLt has no f32 x f32 -> bf16 GEMM, and a bf16 output's bias epilogue would round
    // an f32 bias before adding it: both compute in f32 and round once at the end.
    const bool f32_bias = !bias.is_null() && bias.dtype() == DType::kF32;
    const bool round_after = out.dtype() == DType::kBF16 && (a.dtype() == DType::kF32 || f32_bias);
    if (round_after) {
      dst = scratch(kResult, d_elems * sizeof(float)).as(DType::kF32);
      if (d.accumulate) cuda::cast(farg(dst), farg(out), d_elems, stream_);
    }
    if (!bias.is_null() && bias.dtype() != dst.dtype()) {
      DevPtr converted = scratch(kBias, static_cast<size_t>(d.N) * dtype_size(dst.dtype()))
                             .as(dst.dtype());
      cuda::cast(farg(converted), farg(bias), static_cast<size_t>(d.N), stream_);
      bias = converted;
    }
    d.ab_dtype = a.dtype();
    d.d_dtype = dst.dtype();
    d.bias = !bias.is_null();
    gemm_->run(d, a, b, dst, bias);
    if (round_after) cuda::cast(farg(out), farg(dst), d_elems, stream_);
  }
  DevPtr widened(int slot, DevPtr bf16, size_t n) {
    DevPtr w = scratch(slot, n * sizeof(float)).as(DType::kF32);
    cuda::cast(farg(w), farg(bf16), n, stream_);
    return w;
  }

  // Grow-only scratch, one buffer per use that can be live at the same time.
  enum Slot {
    kOperandA, kOperandB, kResult, kBias, kPartials, kOverlap, kColumns, kRope, kScores, kSlots
  };
  struct Scratch {
    DevPtr ptr;
    size_t bytes = 0;
  };
  DevPtr scratch(int slot, size_t bytes) {
    Scratch& s = scratch_[slot];
    if (s.bytes < bytes) {
      deallocate(s.ptr);  // stream-ordered: earlier work that reads it still completes first
      s.ptr = allocate(bytes);
      s.bytes = bytes;
    }
    return s.ptr;
  }

  // The partials of `arrays` two-pass column reductions over N rows of C columns
  // (launch.h column_chunks); null when there is nothing to reduce.
  float* column_partials(int N, int C, int arrays) {
    if (N <= 0 || C <= 0) return nullptr;
    const size_t floats = column_chunks(static_cast<uint64_t>(N)) * static_cast<size_t>(C) *
                          static_cast<size_t>(arrays);
    return static_cast<float*>(scratch(kColumns, floats * sizeof(float)).raw());
  }

  void* staging_for(size_t bytes) {
    if (staging_bytes_ < bytes) {
      if (staging_ != nullptr) TRIDENT_CUDA_CHECK(cudaFreeHost(staging_));
      staging_ = nullptr;
      TRIDENT_CUDA_CHECK(cudaMallocHost(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    return staging_;
  }

  // Every F buffer of an attention call has one dtype (attention.h); null gradients are
  // skipped.
  AttentionShape attention_shape(const Op& op, std::initializer_list<DevPtr> bufs, int B, int T,
                                 int NH, int NKV, int HD) {
    TRIDENT_CHECK_MSG(NKV > 0 && NH % NKV == 0 && HD > 0,
                      std::string("cuda ") + op.name() + ": NH " + std::to_string(NH) + " NKV " +
                          std::to_string(NKV) + " HD " + std::to_string(HD));
    DType dtype = bufs.begin()->dtype();
    for (DevPtr p : bufs) {
      f(op, p, "q/k/v/out/dout/dq/dk/dv");
      if (!p.is_null() && p.dtype() != dtype) {
        check_failed("attention dtypes",
                     std::string("cuda ") + op.name() +
                         ": every attention buffer must have one dtype (q is " +
                         dtype_name(dtype) + ", another is " + dtype_name(p.dtype()) + ")",
                     __FILE__, __LINE__);
      }
    }
    return AttentionShape{B, T, NH, NKV, HD, dtype};
  }

  static cuda::BlockDims block_dims(const AttentionBlock& s) {
    return {s.B,      s.Tq,  s.Tk,   s.q_stride(), s.kv_stride(),
            static_cast<int64_t>(s.q_pos) - s.k_pos, s.NH, s.NKV, s.HD};
  }

  // A size query for a shape attention calls accept (others CHECK-fail there): only
  // these are planned, so a bad query never builds cuDNN plans.
  static bool plannable(const AttentionShape& s) {
    return s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HD > 0 && s.NH % s.NKV == 0 &&
           is_float_dtype(s.dtype);
  }
  // The path of a shape (AttentionPlanner). A query that builds cuDNN plans is still
  // const to callers: the decisions and plans are caches, nothing is allocated on the
  // device.
  AttentionStatePath decide(const AttentionShape& s, bool asked) const {
    CudaOps* self = const_cast<CudaOps*>(this);
    return planner_.decide(s, asked, [self](const AttentionShape& x) { return self->prepare_cudnn(x); });
  }
  Status prepare_cudnn(const AttentionShape& s) {
    if (cudnn_ != nullptr) return cudnn_->prepare(s);
    Result<std::unique_ptr<AttentionPath>> made = make_cudnn_attention(*this, stream_, s);
    if (!made.is_ok()) return made.status();
    cudnn_ = std::move(made).value();
    return Status::ok();
  }
  AttentionPath& path_of(AttentionStatePath path) {
    if (path == AttentionStatePath::kCudnn) {
      TRIDENT_CHECK(cudnn_ != nullptr);
      return *cudnn_;
    }
    return *plain_;
  }
  // TRIDENT_CUDA_SYNC=1: the tag forward wrote must name the path this backward runs.
  void check_state_tag(DevPtr state, AttentionStatePath path, const AttentionShape& s) {
    char tag = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&tag, state.raw(), 1, cudaMemcpyDeviceToHost, stream_));
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    TRIDENT_CHECK_MSG(tag == attention_state_tag(path),
                      std::string("cuda attention_backward (B=") + std::to_string(s.B) +
                          " T=" + std::to_string(s.T) + "): the state's tag is '" +
                          std::string(1, tag) + "', this shape's path writes '" +
                          std::string(1, attention_state_tag(path)) +
                          "' (a state not written by attention_forward of this shape)");
  }

  const int device_;
  const AttentionChoice choice_;
  std::string device_name_;
  CUstream_st* stream_ = nullptr;
  bool sync_ = false;
  std::unique_ptr<GemmEngine> gemm_;
  std::unique_ptr<AttentionPath> plain_, cudnn_;  // cudnn_: made for the first bf16 shape
  mutable AttentionPlanner planner_;  // the path of every shape seen
  Scratch scratch_[kSlots];
  void* staging_ = nullptr;  // pinned host memory
  size_t staging_bytes_ = 0;
  mutable bool peak_logged_ = false;
};

}  // namespace

Result<std::unique_ptr<Ops>> make_cuda_ops(int device) {
  TRIDENT_ASSIGN_OR_RETURN(const AttentionChoice choice,
                           attention_choice_from_env(std::getenv("TRIDENT_ATTENTION")));
  auto ops = std::make_unique<CudaOps>(device, choice);
  TRIDENT_RETURN_IF_ERROR(ops->init());
  return std::unique_ptr<Ops>(std::move(ops));
}

}  // namespace trident::cuda
