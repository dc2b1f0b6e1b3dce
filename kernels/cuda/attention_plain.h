// The GEMMs of the plain attention path (attention_plain.cpp), exposed so host tests can
// describe() exactly the descs the path runs. Per kv group (batch B*NKV, G = NH/NKV query
// heads of T rows each, ld = T rounded up to 8):
//   scores:  [G*T, ld] f32  = [G*T, HD] @ [T, HD]^T   (S = Qg Kg^T, dP = dOg Vg^T)
//   pv:      [G*T, HD]      = [G*T, ld] @ [T, HD]     (Og = P Vg; io-dtype D)
//   grad_q:  [G*T, HD] f32  = [G*T, ld] @ [T, HD]     (dQg = dS Kg)
//   grad_kv: [T, HD] f32    = [G*T, ld]^T @ [G*T, HD] (dVg = P^T dOg, dKg = dS^T Qg)
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"

namespace trident::cuda {

// Row stride of the scores and probabilities: T rounded up to 8 elements (16-byte rows in
// bf16).
inline int64_t plain_attention_ld(int T) { return (static_cast<int64_t>(T) + 7) / 8 * 8; }

struct PlainAttentionGemms {
  GemmDesc scores, pv, grad_q, grad_kv;
};
PlainAttentionGemms plain_attention_gemms(const AttentionShape& shape);

}  // namespace trident::cuda
