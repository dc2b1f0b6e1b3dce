// Causal softmax attention with GQA, one (batch, head) per OpenMP iteration and
// single-threaded OpenBLAS sgemms on strided views of q / k / v (no copies), so results
// do not depend on the thread count. Query rows are processed in blocks of kRowBlock,
// and a block only multiplies the key columns it can see (0..block end), which skips
// most of the masked upper triangle.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

constexpr int kRowBlock = 64;

// In place on row p[0..T): softmax over 0..i, zeros after.
void causal_softmax_row(float* p, int i, int T) {
  const int n = i + 1;
  const float m = max_f(p, n);
  for (int j = 0; j < n; ++j) p[j] = exp_fast(p[j] - m);
  const float inv = 1.0f / sum_f(p, n);
  for (int j = 0; j < n; ++j) p[j] *= inv;
  for (int j = n; j < T; ++j) p[j] = 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int ldq = NH * HD, ldkv = NKV * HD;
  const int pairs = B * NH;
#pragma omp parallel
  {
    omp_set_num_threads(1);  // sgemms below stay on this thread (see matmul.cpp)
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / NH, h = bh % NH, kvh = h / group;
      const float* qh = q + static_cast<long>(b) * T * ldq + h * HD;
      const float* kh = k + static_cast<long>(b) * T * ldkv + kvh * HD;
      const float* vh = v + static_cast<long>(b) * T * ldkv + kvh * HD;
      float* oh = out + static_cast<long>(b) * T * ldq + h * HD;
      float* p = att + static_cast<long>(bh) * T * T;
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock), rows = i1 - i0;
        // S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, HD, scale,
                    qh + static_cast<long>(i0) * ldq, ldq, kh, ldkv, 0.0f,
                    p + static_cast<long>(i0) * T, T);
        for (int i = i0; i < i1; ++i) causal_softmax_row(p + static_cast<long>(i) * T, i, T);
        // O[i0:i1] = P[i0:i1, 0:i1] V[0:i1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HD, i1, 1.0f,
                    p + static_cast<long>(i0) * T, T, vh, ldkv, 0.0f,
                    oh + static_cast<long>(i0) * ldq, ldq);
      }
    }
  }
}

// Parallel over (batch, kv head): the query heads sharing a kv head run in order inside
// one iteration, so dk / dv accumulate without races and in a fixed order.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int NH,
                        int NKV, int HD) {
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int ldq = NH * HD, ldkv = NKV * HD;
  const int pairs = B * NKV;
  const bool need_ds = dq != nullptr || dk != nullptr;
#pragma omp parallel
  {
    omp_set_num_threads(1);  // sgemms below stay on this thread (see matmul.cpp)
    std::vector<float> ds(need_ds ? static_cast<size_t>(kRowBlock) * T : 0);  // rows of dP / dS
#pragma omp for schedule(dynamic, 1)
    for (int bk = 0; bk < pairs; ++bk) {
      const int b = bk / NKV, kvh = bk % NKV;
      const float* kh = k + static_cast<long>(b) * T * ldkv + kvh * HD;
      const float* vh = v + static_cast<long>(b) * T * ldkv + kvh * HD;
      float* dkh = dk != nullptr ? dk + static_cast<long>(b) * T * ldkv + kvh * HD : nullptr;
      float* dvh = dv != nullptr ? dv + static_cast<long>(b) * T * ldkv + kvh * HD : nullptr;
      for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        const long qoff = static_cast<long>(b) * T * ldq + h * HD;
        const float* qh = q + qoff;
        const float* doh = dout + qoff;
        float* dqh = dq != nullptr ? dq + qoff : nullptr;
        const float* p = att + (static_cast<long>(b) * NH + h) * T * T;
        for (int i0 = 0; i0 < T; i0 += kRowBlock) {
          const int i1 = std::min(T, i0 + kRowBlock), rows = i1 - i0;
          const float* pb = p + static_cast<long>(i0) * T;
          const float* dob = doh + static_cast<long>(i0) * ldq;
          if (dvh != nullptr) {  // dV[0:i1] += P[i0:i1, 0:i1]^T dO[i0:i1]
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, HD, rows, 1.0f, pb, T, dob,
                        ldq, 1.0f, dvh, ldkv);
          }
          if (!need_ds) continue;
          // dP[0:rows, 0:i1] = dO[i0:i1] V[0:i1]^T, then dS = scale * P * (dP - rowdot).
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, HD, 1.0f, dob, ldq, vh,
                      ldkv, 0.0f, ds.data(), T);
          for (int r = 0; r < rows; ++r) {
            const int n = i0 + r + 1;
            float* d = ds.data() + static_cast<long>(r) * T;
            const float* pr = pb + static_cast<long>(r) * T;
            const float dot = dot_f(pr, d, n);
            for (int j = 0; j < n; ++j) d[j] = scale * (pr[j] * (d[j] - dot));
            for (int j = n; j < i1; ++j) d[j] = 0.0f;
          }
          if (dqh != nullptr) {  // dQ[i0:i1] += dS K[0:i1]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HD, i1, 1.0f, ds.data(),
                        T, kh, ldkv, 1.0f, dqh + static_cast<long>(i0) * ldq, ldq);
          }
          if (dkh != nullptr) {  // dK[0:i1] += dS^T Q[i0:i1]
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, HD, rows, 1.0f, ds.data(), T,
                        qh + static_cast<long>(i0) * ldq, ldq, 1.0f, dkh, ldkv);
          }
        }
      }
    }
  }
}

}  // namespace trident::cpu
