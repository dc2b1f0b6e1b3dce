// Block attention's kernels (attention_block.cu), for Ops::attention_block_forward,
// _merge and _backward (kernels/ops.h "Block attention"); cuda_ops.cpp calls them. Simple
// and obviously correct rather than fast, like the cached attention's kernel: one block of
// kBlock threads per (sequence, head, query row) for the scores, one thread per output
// element for the gradient products, each sum in a fixed order (no atomics). Every F
// argument has its own dtype (FArg); fp32 math, each output rounded once. Index arithmetic
// is 64-bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace trident::cuda {

// The block's geometry with the row strides resolved (q_rows >= Tq, kv_rows >= Tk) and
// offset = q_pos - k_pos: query row i sees key rows j < min(Tk, offset + i + 1).
struct BlockDims {
  int B, Tq, Tk, q_rows, kv_rows;
  int64_t offset;
  int NH, NKV, HD;
  int64_t rows() const { return static_cast<int64_t>(B) * NH * Tq; }  // (b, h, i) triples
};

// out and lse of the block; `scores`: rows() * Tk floats of scratch.
void attention_block_forward(FArg out, float* lse, FArg q, FArg k, FArg v, float* scores,
                             const BlockDims& d, Stream s);
// The log-sum-exp merge of (block_out, block_lse) into (out, lse); d's key fields unused.
void attention_block_merge(FArg out, float* lse, FArg block_out, const float* block_lse,
                           const BlockDims& d, Stream s);
// dq, dk, dv += the block's gradients (null: not needed); `scratch`: 2 * rows() * Tk floats
// (P and dS).
void attention_block_backward(FArg dq, FArg dk, FArg dv, FArg dout, FArg out, const float* lse,
                              FArg q, FArg k, FArg v, float* scratch, const BlockDims& d,
                              Stream s);

}  // namespace trident::cuda
