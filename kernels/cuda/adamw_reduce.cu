// AdamW, the loss accumulator and the sum of squares, after kernels/cpu/adamw.cpp and
// cross_entropy.cpp (loss_accumulate).
#include "kernels/cuda/device_util.cuh"

namespace trident::cuda {
namespace {

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v,
                             __nv_bfloat16* compute_copy, size_t n, float lr, float b1, float b2,
                             float eps, float wd, float bc1, float bc2) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = grad[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float p = param[i] - lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    param[i] = p;
    if (compute_copy != nullptr) compute_copy[i] = __float2bfloat16_rn(p);
  }
}

// One thread on purpose: the CPU's order (row order, double), and N = B*T is small.
__global__ void loss_accumulate_kernel(double* acc, const float* losses, int N) {
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += losses[n];
  *acc += static_cast<float>(sum / N);
}

// Pass 1: block b sums the squares of chunk b in double, each thread a fixed stride of it,
// then a fixed block tree. The tree depends only on n (the chunking and kBlock).
__global__ void sum_squares_partial_kernel(double* partials, FArg x, size_t n) {
  __shared__ double shared[kWarpsPerBlock];
  const size_t begin = static_cast<size_t>(blockIdx.x) * kSumChunk;
  const size_t end = min(n, begin + static_cast<size_t>(kSumChunk));
  double acc = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double xv = load(x, i);
    acc += xv * xv;
  }
  acc = block_reduce<double, false>(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2: one block adds the partials (strided per thread, then the block tree).
__global__ void sum_squares_final_kernel(double* acc, const double* partials, size_t count) {
  __shared__ double shared[kWarpsPerBlock];
  double s = 0.0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_reduce<double, false>(s, shared);
  if (threadIdx.x == 0) *acc += s;
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, uint16_t* compute_copy,
                  size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float bc1, float bc2, Stream s) {
  const Launch l = elementwise_launch(n);
  if (l.empty()) return;
  adamw_kernel<<<l.grid_x, l.block, 0, s>>>(param, grad, m, v,
                                            reinterpret_cast<__nv_bfloat16*>(compute_copy), n, lr,
                                            beta1, beta2, eps, weight_decay, bc1, bc2);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void loss_accumulate(double* acc, const float* losses, int N, Stream s) {
  loss_accumulate_kernel<<<1, 1, 0, s>>>(acc, losses, N);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

void sum_squares_accumulate(double* acc, FArg x, size_t n, double* partials, Stream s) {
  const uint64_t count = sum_squares_partials(n);
  if (count == 0) return;
  TRIDENT_CHECK_MSG(count <= kMaxGridX, "sum_squares: n " + std::to_string(n) + " too large");
  sum_squares_partial_kernel<<<static_cast<unsigned>(count), kBlock, 0, s>>>(partials, x, n);
  TRIDENT_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kBlock, 0, s>>>(acc, partials, count);
  TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace trident::cuda
