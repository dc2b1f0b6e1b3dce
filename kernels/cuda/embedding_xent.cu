// Embeddings and softmax cross-entropy (fused and vocab-parallel), after
// kernels/cpu/embedding.cpp and cross_entropy.cpp.
//
// Embedding backward is deterministic without atomics: a thread owns one column of a
// slice of the vocabulary rows (local row % splits == its y) and walks the tokens in
// order, so every dwte element receives its additions in token order, exactly as on the
// CPU; dwpe: a thread per (position, column) sums over the batch in order.
//
// Cross-entropy: one block per row (launch.h block_per_row_launch): the row max and the
// sum of exp_fast(x - max) by fixed-order block reductions, then each thread writes the
// columns it read, so dlogits may alias logits (each element is read before it is
// written, by the same thread, after every read of the statistics' pass has finished).
#include <cfloat>

#include "kernels/cuda/device_util.cuh"

namespace trident::cuda {
namespace {

__global__ void embedding_forward_kernel(FArg out, const int32_t* tokens, FArg wte, FArg wpe,
                                         size_t total, int T, int C, int vocab_begin,
                                         int vocab_local) {
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int local = tokens[n] - vocab_begin;
    float v = 0.0f;
    if (local >= 0 && local < vocab_local) v = load(wte, static_cast<size_t>(local) * C + c);
    if (wpe.p != nullptr) v += load(wpe, (n % T) * C + c);
    store(out, i, v);
  }
}

__global__ void embedding_backward_wte_kernel(float* dwte, FArg dout, const int32_t* tokens,
                                              size_t N, int C, int vocab_begin, int vocab_local) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  const int splits = static_cast<int>(gridDim.y), mine = static_cast<int>(blockIdx.y);
  for (size_t n = 0; n < N; ++n) {
    const int local = tokens[n] - vocab_begin;
    if (local < 0 || local >= vocab_local || local % splits != mine) continue;
    dwte[static_cast<size_t>(local) * C + c] += load(dout, n * C + c);
  }
}

__global__ void embedding_backward_wpe_kernel(float* dwpe, FArg dout, int B, int T, int C) {
  const size_t c = global_thread();
  if (c >= static_cast<size_t>(C)) return;
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    float* d = dwpe + static_cast<size_t>(t) * C + c;
    for (int b = 0; b < B; ++b) *d += load(dout, (static_cast<size_t>(b) * T + t) * C + c);
  }
}

__device__ __forceinline__ int real_columns(int Vp_local, int vocab_begin, int V) {
  return min(max(V - vocab_begin, 0), Vp_local);
}

// Max and sum of exp(x - max) of row `x` over its first `real` columns; every thread of
// the block gets both.
__device__ void row_stats(FArg logits, size_t row, int real, float* shared_f, float* m_out,
                          float* s_out) {
  float m = -INFINITY;
  for (int v = threadIdx.x; v < real; v += blockDim.x) m = fmaxf(m, load(logits, row + v));
  m = block_reduce<float, true>(m, shared_f);
  float s = 0.0f;
  for (int v = threadIdx.x; v < real; v += blockDim.x) s += exp_fast(load(logits, row + v) - m);
  *s_out = block_reduce<float, false>(s, shared_f);
  *m_out = m;
}

__global__ void xent_max_kernel(float* row_max, FArg logits, int N, int Vp_local, int vocab_begin,
                                int V) {
  __shared__ float shared[kWarpsPerBlock];
  const int real = real_columns(Vp_local, vocab_begin, V);
  for (size_t n = blockIdx.x; n < static_cast<size_t>(N); n += gridDim.x) {
    const size_t row = n * Vp_local;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < real; v += blockDim.x) m = fmaxf(m, load(logits, row + v));
    m = block_reduce<float, true>(m, shared);
    if (threadIdx.x == 0) row_max[n] = real > 0 ? m : -FLT_MAX;
  }
}

__global__ void xent_sums_kernel(float* sum_exp, float* target_logit, FArg logits,
                                 const float* row_max, const int32_t* targets, int N, int Vp_local,
                                 int vocab_begin, int V) {
  __shared__ float shared[kWarpsPerBlock];
  const int real = real_columns(Vp_local, vocab_begin, V);
  for (size_t n = blockIdx.x; n < static_cast<size_t>(N); n += gridDim.x) {
    const size_t row = n * Vp_local;
    const float m = row_max[n];
    float s = 0.0f;
    for (int v = threadIdx.x; v < real; v += blockDim.x) s += exp_fast(load(logits, row + v) - m);
    s = block_reduce<float, false>(s, shared);
    if (threadIdx.x == 0) {
      const int t = targets[n];
      const int local_t = t - vocab_begin;
      const bool valid = t >= 0 && t < V;
      sum_exp[n] = valid ? s : NAN;
      const bool owns_target = local_t >= 0 && local_t < real;
      target_logit[n] = !valid ? NAN : (owns_target ? load(logits, row + local_t) : 0.0f);
    }
  }
}

// dlogits = dloss * (exp(x - m) / s - [column == target]); 0 on padded columns.
__device__ void write_dlogits(FArg dlogits, FArg logits, size_t row, int real, int Vp_local,
                              int local_t, bool valid, float m, float s, float dloss) {
  const float inv = 1.0f / s;
  for (int v = threadIdx.x; v < Vp_local; v += blockDim.x) {
    float d = 0.0f;
    if (v < real) {
      const float p = exp_fast(load(logits, row + v) - m) * inv;
      d = v == local_t ? dloss * (p - 1.0f) : dloss * p;
    }
    store(dlogits, row + v, valid ? d : NAN);
  }
}

__global__ void xent_backward_kernel(FArg dlogits, FArg logits, const float* row_max,
                                     const float* sum_exp, const int32_t* targets, float dloss,
                                     int N, int Vp_local, int vocab_begin, int V) {
  const int real = real_columns(Vp_local, vocab_begin, V);
  for (size_t n = blockIdx.x; n < static_cast<size_t>(N); n += gridDim.x) {
    const int t = targets[n];
    write_dlogits(dlogits, logits, n * Vp_local, real, Vp_local, t - vocab_begin, t >= 0 && t < V,
                  row_max[n], sum_exp[n], dloss);
  }
}

__global__ void cross_entropy_forward_kernel(float* losses, FArg logits, const int32_t* targets,
                                             int N, int V, int Vp) {
  __shared__ float shared[kWarpsPerBlock];
  for (size_t n = blockIdx.x; n < static_cast<size_t>(N); n += gridDim.x) {
    const size_t row = n * Vp;
    float m, s;
    row_stats(logits, row, V, shared, &m, &s);
    if (threadIdx.x == 0) {
      const int t = targets[n];
      losses[n] = t >= 0 && t < V ? logf(s) + m - load(logits, row + t) : NAN;
    }
  }
}

__global__ void cross_entropy_backward_kernel(FArg dlogits, FArg logits, const int32_t* targets,
                                              float dloss, int N, int V, int Vp) {
  __shared__ float shared[kWarpsPerBlock];
  for (size_t n = blockIdx.x; n < static_cast<size_t>(N); n += gridDim.x) {
    const size_t row = n * Vp;
    float m, s;
    row_stats(logits, row, V, shared, &m, &s);  // every read of the stats ends here
    const int t = targets[n];
    write_dlogits(dlogits, logits, row, V, Vp, t, t >= 0 && t < V, m, s, dloss);
    __syncthreads();  // the next row's stats reuse `shared`
  }
}

__global__ void xent_finish_kernel(float* losses, const float* row_max, const float* sum_exp,
                                   const float* target_logit, int N) {
  for (size_t n = global_thread(); n < static_cast<size_t>(N); n += grid_threads())
    losses[n] = logf(sum_exp[n]) + row_max[n] - target_logit[n];
}

}  // namespace

void embedding_forward(FArg out, const int32_t* tokens, FArg wte, FArg wpe, int B, int T, int C,
                       int vocab_begin, int vocab_local, Stream s) {
  const size_t total = static_cast<size_t>(B) * T * C;
  const Launch l = elementwise_launch(total);
  if (l.empty()) return;
  embedding_forward_kernel<<<l.grid_x, l.block, 0, s>>>(out, tokens, wte, wpe, total, T, C,
                                                        vocab_begin, vocab_local);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, FArg dout, const int32_t* tokens, int B, int T,
                        int C, int vocab_begin, int vocab_local, Stream s) {
  const size_t N = static_cast<size_t>(B) * T;
  if (N == 0 || C <= 0) return;
  if (dwte != nullptr) {
    const Launch l = embedding_backward_launch(static_cast<uint64_t>(C),
                                               static_cast<uint64_t>(std::max(vocab_local, 0)));
    if (!l.empty()) {
      embedding_backward_wte_kernel<<<dim3(l.grid_x, l.grid_y), l.block, 0, s>>>(
          dwte, dout, tokens, N, C, vocab_begin, vocab_local);
      TRIDENT_CUDA_CHECK_LAUNCH();
    }
  }
  if (dwpe != nullptr) {
    const Launch l = column_launch(static_cast<uint64_t>(C), static_cast<uint64_t>(T));
    embedding_backward_wpe_kernel<<<dim3(l.grid_x, l.grid_y), l.block, 0, s>>>(dwpe, dout, B, T,
                                                                               C);
    TRIDENT_CUDA_CHECK_LAUNCH();
  }
}

void cross_entropy_forward(float* losses, FArg logits, const int32_t* targets, int N, int V,
                           int Vp, Stream s) {
  const Launch l = block_per_row_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  cross_entropy_forward_kernel<<<l.grid_x, l.block, 0, s>>>(losses, logits, targets, N, V, Vp);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(FArg dlogits, FArg logits, const int32_t* targets, float dloss, int N,
                            int V, int Vp, Stream s) {
  const Launch l = block_per_row_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  cross_entropy_backward_kernel<<<l.grid_x, l.block, 0, s>>>(dlogits, logits, targets, dloss, N, V,
                                                             Vp);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void xent_local_max(float* row_max, FArg logits, int N, int Vp_local, int vocab_begin, int V,
                    Stream s) {
  const Launch l = block_per_row_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  xent_max_kernel<<<l.grid_x, l.block, 0, s>>>(row_max, logits, N, Vp_local, vocab_begin, V);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void xent_local_sums(float* sum_exp, float* target_logit, FArg logits, const float* row_max,
                     const int32_t* targets, int N, int Vp_local, int vocab_begin, int V,
                     Stream s) {
  const Launch l = block_per_row_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  xent_sums_kernel<<<l.grid_x, l.block, 0, s>>>(sum_exp, target_logit, logits, row_max, targets, N,
                                                Vp_local, vocab_begin, V);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void xent_local_backward(FArg dlogits, FArg logits, const float* row_max, const float* sum_exp,
                         const int32_t* targets, float dloss, int N, int Vp_local, int vocab_begin,
                         int V, Stream s) {
  const Launch l = block_per_row_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  xent_backward_kernel<<<l.grid_x, l.block, 0, s>>>(dlogits, logits, row_max, sum_exp, targets,
                                                    dloss, N, Vp_local, vocab_begin, V);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void xent_finish(float* losses, const float* row_max, const float* sum_exp,
                 const float* target_logit, int N, Stream s) {
  const Launch l = elementwise_launch(static_cast<uint64_t>(std::max(N, 0)));
  if (l.empty()) return;
  xent_finish_kernel<<<l.grid_x, l.block, 0, s>>>(losses, row_max, sum_exp, target_logit, N);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace trident::cuda
