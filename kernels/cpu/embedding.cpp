// Token + position embedding (vocab-parallel aware). See kernels/ops.h.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int vocab_begin, int vocab_local) {
  const long N = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static) if (N * C >= static_cast<long>(kParallelMinElems))
  for (long n = 0; n < N; ++n) {
    float* o = out + n * C;
    const int local = tokens[n] - vocab_begin;
    if (local >= 0 && local < vocab_local) {
      std::memcpy(o, wte + static_cast<long>(local) * C, sizeof(float) * C);
    } else {
      std::memset(o, 0, sizeof(float) * C);
    }
    if (wpe != nullptr) {
      const float* p = wpe + (n % T) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

// Parallel over column blocks; each block walks the rows in order, so repeated tokens
// accumulate in the same order whatever the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int vocab_begin, int vocab_local) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const long N = static_cast<long>(B) * T;
  const bool parallel = N * C >= static_cast<long>(kParallelMinElems) && blocks > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    if (dwte != nullptr) {
      for (long n = 0; n < N; ++n) {
        const int local = tokens[n] - vocab_begin;
        if (local < 0 || local >= vocab_local) continue;
        float* d = dwte + static_cast<long>(local) * C;
        const float* g = dout + n * C;
        for (int c = c0; c < c1; ++c) d[c] += g[c];
      }
    }
    if (dwpe != nullptr) {
      for (int t = 0; t < T; ++t) {
        float* d = dwpe + static_cast<long>(t) * C;
        for (int b = 0; b < B; ++b) {
          const float* g = dout + (static_cast<long>(b) * T + t) * C;
          for (int c = c0; c < c1; ++c) d[c] += g[c];
        }
      }
    }
  }
}

}  // namespace trident::cpu
