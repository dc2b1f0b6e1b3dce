// Causal softmax attention with GQA, one (batch, head) per OpenMP iteration and
// single-threaded OpenBLAS sgemms on strided views of q / k / v (no copies), so results
// do not depend on the thread count. Query rows are processed in blocks of kRowBlock,
// and a block only multiplies the key columns it can see (0..block end), which skips
// most of the masked upper triangle. The training forward, the cached forward (queries
// at an offset over a key/value cache) and the block forward of ring attention (queries
// and keys at any offset, rows at a stride) are one function (attend), so with offset 0
// they are bitwise the same.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_util.h"

namespace trident::cpu {
namespace {

constexpr int kRowBlock = 64;

constexpr float kNoKeys = -std::numeric_limits<float>::infinity();  // lse of a masked row

// The keys query row i sees: 0 .. min(Tk, offset + i + 1) - 1, offset = q_pos - k_pos
// (kernels/ops.h "Block attention"); 0 when the row is masked.
int visible_keys(long offset, int i, int Tk) {
  return static_cast<int>(std::clamp(offset + i + 1, 0L, static_cast<long>(Tk)));
}

// In place on row p[0..T): softmax over 0..n-1, zeros after; returns the row's
// log-sum-exp of the scores. n = 0 (a masked row): all zeros, -inf.
float causal_softmax_row(float* p, int n, int T) {
  if (n == 0) {
    std::fill(p, p + T, 0.0f);
    return kNoKeys;
  }
  const float m = max_f(p, n);
  for (int j = 0; j < n; ++j) p[j] = exp_fast(p[j] - m);
  const float sum = sum_f(p, n);
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; ++j) p[j] *= inv;
  for (int j = n; j < T; ++j) p[j] = 0.0f;
  return m + std::log(sum);
}

// One query block and one key block's geometry in fp32 views: rows at strides q_rows and
// kv_rows per sequence, offset = q_pos - k_pos.
struct Geometry {
  int B, Tq, Tk, q_rows, kv_rows;
  long offset;
  int NH, NKV, HD;
};

// Query rows [i0, i1) of one (batch, head). qh / oh / kh / vh point at row 0 of the head
// (strides ldq, ldkv); p holds the block's rows of scores, then probabilities, at stride
// ldp >= the keys of row i1 - 1; lse (or null) the rows' log-sum-exp.
void attend_block(float* oh, float* p, long ldp, float* lse, const float* qh, const float* kh,
                  const float* vh, int i0, int i1, const Geometry& g, int ldq, int ldkv,
                  float scale) {
  const int rows = i1 - i0, keys = visible_keys(g.offset, i1 - 1, g.Tk);
  if (keys == 0) {  // every row of the block is masked
    for (int r = 0; r < rows; ++r) {
      std::fill(oh + static_cast<long>(i0 + r) * ldq, oh + static_cast<long>(i0 + r) * ldq + g.HD,
                0.0f);
      if (lse != nullptr) lse[i0 + r] = kNoKeys;
    }
    return;
  }
  // S[i0:i1, 0:keys] = scale * Q[i0:i1] K[0:keys]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, g.HD, scale,
              qh + static_cast<long>(i0) * ldq, ldq, kh, ldkv, 0.0f, p, static_cast<int>(ldp));
  for (int r = 0; r < rows; ++r) {
    const float l = causal_softmax_row(p + r * ldp, visible_keys(g.offset, i0 + r, g.Tk),
                                       static_cast<int>(ldp));
    if (lse != nullptr) lse[i0 + r] = l;
  }
  // O[i0:i1] = P[i0:i1, 0:keys] V[0:keys]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, g.HD, keys, 1.0f, p,
              static_cast<int>(ldp), vh, ldkv, 0.0f, oh + static_cast<long>(i0) * ldq, ldq);
}

// `att`: the probabilities [B, NH, Tq, Tq] kept for a backward (the training forward), or
// null: each row block's in per-thread scratch. `lse` ([B, NH, q_rows]) or null.
void attend(float* out, float* att, float* lse, const float* q, const float* k, const float* v,
            const Geometry& g) {
  const int group = g.NH / g.NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.HD));
  const int ldq = g.NH * g.HD, ldkv = g.NKV * g.HD;
  const int pairs = g.B * g.NH;
  const long keys = std::max(1, visible_keys(g.offset, g.Tq - 1, g.Tk));  // the rows' stride
#pragma omp parallel
  {
    omp_set_num_threads(1);  // sgemms below stay on this thread (see matmul.cpp)
    const size_t block_floats = static_cast<size_t>(std::min(g.Tq, kRowBlock)) * keys;
    std::vector<float> scratch(att != nullptr ? 0 : block_floats);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / g.NH, h = bh % g.NH, kvh = h / group;
      const float* qh = q + static_cast<long>(b) * g.q_rows * ldq + h * g.HD;
      const float* kh = k + static_cast<long>(b) * g.kv_rows * ldkv + kvh * g.HD;
      const float* vh = v + static_cast<long>(b) * g.kv_rows * ldkv + kvh * g.HD;
      float* oh = out + static_cast<long>(b) * g.q_rows * ldq + h * g.HD;
      float* lh = lse != nullptr ? lse + static_cast<long>(bh) * g.q_rows : nullptr;
      for (int i0 = 0; i0 < g.Tq; i0 += kRowBlock) {
        float* p =
            att != nullptr ? att + (static_cast<long>(bh) * g.Tq + i0) * keys : scratch.data();
        attend_block(oh, p, keys, lh, qh, kh, vh, i0, std::min(g.Tq, i0 + kRowBlock), g, ldq,
                     ldkv, scale);
      }
    }
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int NH, int NKV, int HD) {
  attend(out, att, nullptr, q, k, v, {B, T, T, T, T, 0, NH, NKV, HD});
}

void attention_cached_forward(float* out, const float* q, const float* k_cache,
                              const float* v_cache, int B, int Tq, int pos, int capacity, int NH,
                              int NKV, int HD) {
  attend(out, nullptr, nullptr, q, k_cache, v_cache, {B, Tq, pos + Tq, Tq, capacity, pos, NH, NKV, HD});
}

void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const BlockShape& s) {
  attend(out, nullptr, lse, q, k, v,
         {s.B, s.Tq, s.Tk, s.q_rows, s.kv_rows, static_cast<long>(s.q_pos) - s.k_pos, s.NH, s.NKV,
          s.HD});
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

// Parallel over (batch, kv head), as attention_backward. Per block of query rows: the
// scores again (one sgemm over the keys the block sees), P = exp(S - lse) from the final
// lse, then the four products of attention_backward with dS = P * (dP - D).
void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const BlockShape& s) {
  const int group = s.NH / s.NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.HD));
  const int ldq = s.NH * s.HD, ldkv = s.NKV * s.HD;
  const int pairs = s.B * s.NKV;
  const long offset = static_cast<long>(s.q_pos) - s.k_pos;
  const bool need_ds = dq != nullptr || dk != nullptr;
#pragma omp parallel
  {
    omp_set_num_threads(1);  // sgemms below stay on this thread (see matmul.cpp)
    const size_t block_floats = static_cast<size_t>(kRowBlock) * s.Tk;
    std::vector<float> pbuf(block_floats), ds(need_ds ? block_floats : 0);
#pragma omp for schedule(dynamic, 1)
    for (int bk = 0; bk < pairs; ++bk) {
      const int b = bk / s.NKV, kvh = bk % s.NKV;
      const long kvoff = static_cast<long>(b) * s.kv_rows * ldkv + kvh * s.HD;
      const float* kh = k + kvoff;
      const float* vh = v + kvoff;
      float* dkh = dk != nullptr ? dk + kvoff : nullptr;
      float* dvh = dv != nullptr ? dv + kvoff : nullptr;
      for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        const long qoff = static_cast<long>(b) * s.q_rows * ldq + h * s.HD;
        const float* qh = q + qoff;
        const float* doh = dout + qoff;
        const float* oh = out + qoff;
        float* dqh = dq != nullptr ? dq + qoff : nullptr;
        const float* lh = lse + (static_cast<long>(b) * s.NH + h) * s.q_rows;
        for (int i0 = 0; i0 < s.Tq; i0 += kRowBlock) {
          const int i1 = std::min(s.Tq, i0 + kRowBlock), rows = i1 - i0;
          const int keys = visible_keys(offset, i1 - 1, s.Tk);
          if (keys == 0) continue;  // every row of the block is masked: nothing flows
          const float* qb = qh + static_cast<long>(i0) * ldq;
          const float* dob = doh + static_cast<long>(i0) * ldq;
          float* p = pbuf.data();
          // P[0:rows, 0:keys] = exp(scale * Q K^T - lse), masked entries and rows 0.
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, s.HD, scale, qb, ldq,
                      kh, ldkv, 0.0f, p, keys);
          for (int r = 0; r < rows; ++r) {
            float* pr = p + static_cast<long>(r) * keys;
            const float l = lh[i0 + r];
            const int n = l == kNoKeys ? 0 : visible_keys(offset, i0 + r, s.Tk);
            for (int j = 0; j < n; ++j) pr[j] = exp_fast(pr[j] - l);
            for (int j = n; j < keys; ++j) pr[j] = 0.0f;
          }
          if (dvh != nullptr) {  // dV[0:keys] += P^T dO
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, s.HD, rows, 1.0f, p, keys,
                        dob, ldq, 1.0f, dvh, ldkv);
          }
          if (!need_ds) continue;
          // dP = dO V^T, then dS = scale * P * (dP - D), D = rowsum(dO * O).
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, s.HD, 1.0f, dob, ldq,
                      vh, ldkv, 0.0f, ds.data(), keys);
          for (int r = 0; r < rows; ++r) {
            const long row = static_cast<long>(i0 + r) * ldq;
            const float D = dot_f(doh + row, oh + row, s.HD);
            float* d = ds.data() + static_cast<long>(r) * keys;
            const float* pr = p + static_cast<long>(r) * keys;
            for (int j = 0; j < keys; ++j) d[j] = scale * (pr[j] * (d[j] - D));
          }
          if (dqh != nullptr) {  // dQ[i0:i1] += dS K[0:keys]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s.HD, keys, 1.0f,
                        ds.data(), keys, kh, ldkv, 1.0f, dqh + static_cast<long>(i0) * ldq, ldq);
          }
          if (dkh != nullptr) {  // dK[0:keys] += dS^T Q[i0:i1]
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, s.HD, rows, 1.0f, ds.data(),
                        keys, qb, ldq, 1.0f, dkh, ldkv);
          }
        }
      }
    }
  }
}

// One thread range of (sequence, head, row) triples; each row's HD outputs in order.
void attention_block_merge(float* out, float* lse, const float* block_out,
                           const float* block_lse, int B, int Tq, int q_rows, int NH, int HD) {
  const long rows = static_cast<long>(B) * NH * Tq;
#pragma omp parallel for schedule(static)
  for (long r = 0; r < rows; ++r) {
    const int i = static_cast<int>(r % Tq);
    const long bh = r / Tq;
    const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH);
    const long li = bh * q_rows + i;
    float* o = out + (static_cast<long>(b) * q_rows + i) * NH * HD + static_cast<long>(h) * HD;
    const float* bo = block_out + (o - out);
    const float a = lse[li], c = block_lse[li];
    const float m = std::max(a, c);
    if (m == kNoKeys) {  // neither has seen a key
      std::fill(o, o + HD, 0.0f);
      lse[li] = kNoKeys;
      continue;
    }
    const float merged = m + std::log1p(std::exp(std::min(a, c) - m));
    const float wa = std::exp(a - merged), wc = std::exp(c - merged);
    for (int e = 0; e < HD; ++e) o[e] = wa * o[e] + wc * bo[e];
    lse[li] = merged;
  }
}

}  // namespace trident::cpu
