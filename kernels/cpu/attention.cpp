// Causal softmax attention with GQA, one (batch, head) per OpenMP iteration and
// single-threaded OpenBLAS sgemms on strided views of q / k / v (no copies), so results
// do not depend on the thread count. Query rows are processed in blocks of kRowBlock,
// and a block only multiplies the key columns it can see (0..block end), which skips
// most of the masked upper triangle. The training forward and the cached forward
// (queries at an offset over a key/value cache) are one function (attend), so with
// offset 0 they are bitwise the same.
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

// Query rows [i0, i1) of one (batch, head), at absolute positions pos + i: row i sees the
// keys 0 .. pos + i. qh / oh / kh / vh point at row 0 of the head (strides ldq, ldkv); p
// holds the block's rows of scores, then probabilities, at stride ldp >= pos + i1.
void attend_block(float* oh, float* p, long ldp, const float* qh, const float* kh,
                  const float* vh, int i0, int i1, int pos, int ldq, int ldkv, int HD,
                  float scale) {
  const int rows = i1 - i0, keys = pos + i1;
  // S[i0:i1, 0:keys] = scale * Q[i0:i1] K[0:keys]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HD, scale,
              qh + static_cast<long>(i0) * ldq, ldq, kh, ldkv, 0.0f, p, static_cast<int>(ldp));
  for (int r = 0; r < rows; ++r) {
    causal_softmax_row(p + r * ldp, pos + i0 + r, static_cast<int>(ldp));
  }
  // O[i0:i1] = P[i0:i1, 0:keys] V[0:keys]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HD, keys, 1.0f, p,
              static_cast<int>(ldp), vh, ldkv, 0.0f, oh + static_cast<long>(i0) * ldq, ldq);
}

// Queries at positions pos .. pos+Tq-1 over keys and values of kv_rows positions per
// sequence. `att`: the probabilities [B, NH, Tq, Tq] kept for a backward (pos 0, the
// training forward), or null: each row block's in per-thread scratch.
void attend(float* out, float* att, const float* q, const float* k, const float* v, int B,
            int Tq, int pos, int kv_rows, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int ldq = NH * HD, ldkv = NKV * HD;
  const int pairs = B * NH;
  const long keys = static_cast<long>(pos) + Tq;  // the last row's, and the rows' stride
#pragma omp parallel
  {
    omp_set_num_threads(1);  // sgemms below stay on this thread (see matmul.cpp)
    const size_t block_floats = static_cast<size_t>(std::min(Tq, kRowBlock)) * keys;
    std::vector<float> scratch(att != nullptr ? 0 : block_floats);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / NH, h = bh % NH, kvh = h / group;
      const float* qh = q + static_cast<long>(b) * Tq * ldq + h * HD;
      const float* kh = k + static_cast<long>(b) * kv_rows * ldkv + kvh * HD;
      const float* vh = v + static_cast<long>(b) * kv_rows * ldkv + kvh * HD;
      float* oh = out + static_cast<long>(b) * Tq * ldq + h * HD;
      for (int i0 = 0; i0 < Tq; i0 += kRowBlock) {
        float* p = att != nullptr ? att + (static_cast<long>(bh) * Tq + i0) * keys : scratch.data();
        attend_block(oh, p, keys, qh, kh, vh, i0, std::min(Tq, i0 + kRowBlock), pos, ldq, ldkv,
                     HD, scale);
      }
    }
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD) {
  attend(out, att, q, k, v, B, T, 0, T, NH, NKV, HD);
}

void attention_cached_forward(float* out, const float* q, const float* k_cache,
                              const float* v_cache, int B, int Tq, int pos, int capacity, int NH,
                              int NKV, int HD) {
  attend(out, nullptr, q, k_cache, v_cache, B, Tq, pos, capacity, NH, NKV, HD);
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
