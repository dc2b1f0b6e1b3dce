// Ring attention (contract: context_parallel.h).
//
// The blocks of a step as Ops::attention_block calls. Only q_pos - k_pos matters to the
// mask, so the positions are virtual: a rank's two chunks sit side by side as rows 0..2c-1.
// - own block, chunk r: rows 0..c-1 over key rows 0..c-1, q_pos = k_pos (causal);
// - own block, chunk 2cp-1-r: rows c..2c-1 over key rows 0..2c-1 with q_pos - k_pos = c:
//   query row i (virtual position c + i) sees every key of the first chunk and keys
//   c..c+i of the second (causal);
// - lower rank: rows 0..2c-1 over key rows 0..c-1 with q_pos - k_pos = c >= Tk - 1 (full);
// - higher rank: rows c..2c-1 over key rows 0..2c-1 with q_pos - k_pos = 2c (full).
#include "parallel/context_parallel.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace trident {
namespace {

constexpr int kTagK = 1, kTagV = 2, kTagDk = 3, kTagDv = 4;

}  // namespace

CpChunks cp_chunks(int T, int cp, int rank) {
  TRIDENT_CHECK_MSG(cp >= 1 && rank >= 0 && rank < cp && T > 0 && T % (2 * cp) == 0,
                    "context parallelism: a sequence of " + std::to_string(T) +
                        " positions cannot be cut into 2 x cp = " + std::to_string(2 * cp) +
                        " equal chunks (rank " + std::to_string(rank) + ")");
  CpChunks c;
  c.cp = cp;
  c.rank = rank;
  c.chunk = T / (2 * cp);
  return c;
}

bool RingAttention::overlap_from_env() {
  const char* env = std::getenv("TRIDENT_RING_OVERLAP");
  if (env == nullptr || *env == 0) return true;
  const std::string value = env;
  TRIDENT_CHECK_MSG(value == "0" || value == "1",
                    "TRIDENT_RING_OVERLAP='" + value + "': must be 1 (overlap, the default) or 0");
  return value == "1";
}

RingAttention::RingAttention(Ops& ops, Communicator& cp_group, int B, int chunk, int NH, int NKV,
                             int HD, DType dtype, bool overlap)
    : ops_(ops),
      comm_(cp_group),
      B_(B),
      c_(chunk),
      NH_(NH),
      NKV_(NKV),
      HD_(HD),
      dtype_(dtype),
      overlap_(overlap) {
  TRIDENT_CHECK_MSG(B > 0 && chunk > 0 && NH > 0 && NKV > 0 && NH % NKV == 0 && HD > 0 &&
                        is_float_dtype(dtype),
                    "ring attention: B=" + std::to_string(B) + " chunk=" + std::to_string(chunk) +
                        " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
                        " HD=" + std::to_string(HD) + " dtype " + dtype_name(dtype));
  const size_t kv_bytes = kv_elems() * dtype_size(dtype);
  const size_t f32 = sizeof(float);
  if (comm_.size() > 1) {
    for (int i = 0; i < 2; ++i) {
      k_[i] = DeviceBuffer(ops, kv_bytes);
      v_[i] = DeviceBuffer(ops, kv_bytes);
      dk_[i] = DeviceBuffer(ops, kv_elems() * f32);
      dv_[i] = DeviceBuffer(ops, kv_elems() * f32);
    }
    blk_ = DeviceBuffer(ops, q_elems() * f32);
    blk_lse_ = DeviceBuffer(ops, lse_elems() * f32);
    blk_dk_ = DeviceBuffer(ops, kv_elems() * f32);
    blk_dv_ = DeviceBuffer(ops, kv_elems() * f32);
  } else {  // one rank: its own block only, no exchange
    dk_[0] = DeviceBuffer(ops, kv_elems() * f32);
    dv_[0] = DeviceBuffer(ops, kv_elems() * f32);
  }
  acc_ = DeviceBuffer(ops, q_elems() * f32);
  dq_ = DeviceBuffer(ops, q_elems() * f32);
}

size_t RingAttention::q_elems() const {
  return static_cast<size_t>(B_) * 2 * c_ * NH_ * HD_;
}
size_t RingAttention::kv_elems() const {
  return static_cast<size_t>(B_) * 2 * c_ * NKV_ * HD_;
}
size_t RingAttention::lse_elems() const { return static_cast<size_t>(B_) * NH_ * 2 * c_; }

size_t RingAttention::bytes() const {
  size_t n = acc_.bytes() + blk_.bytes() + blk_lse_.bytes() + dq_.bytes() + blk_dk_.bytes() +
             blk_dv_.bytes();
  for (int i = 0; i < 2; ++i) n += k_[i].bytes() + v_[i].bytes() + dk_[i].bytes() + dv_[i].bytes();
  return n;
}

size_t RingAttention::buffer_bytes(int B, int chunk, int NH, int NKV, int HD, DType dtype,
                                   int cp) {
  // The constructor's buffers: the running out and dq (f32, q-sized) always; with more
  // than one rank two received blocks of k and v (dtype), one block's out and lse (f32),
  // two travelling dK/dV accumulators and one block's dK/dV (f32), else one accumulator
  // pair.
  const size_t q = static_cast<size_t>(B) * 2 * chunk * NH * HD;
  const size_t kv = static_cast<size_t>(B) * 2 * chunk * NKV * HD;
  const size_t lse = static_cast<size_t>(B) * NH * 2 * chunk;
  const size_t f32 = sizeof(float);
  size_t n = 2 * q * f32;
  if (cp > 1) {
    n += 2 * 2 * kv * dtype_size(dtype) + 3 * 2 * kv * f32 + q * f32 + lse * f32;
  } else {
    n += 2 * kv * f32;
  }
  return n;
}

Ops::AttentionBlock RingAttention::block(int Tq, int Tk, int q_pos) const {
  Ops::AttentionBlock s;
  s.B = B_, s.Tq = Tq, s.Tk = Tk, s.q_rows = 2 * c_, s.kv_rows = 2 * c_;
  s.q_pos = q_pos, s.k_pos = 0;
  s.NH = NH_, s.NKV = NKV_, s.HD = HD_;
  return s;
}

CommWork RingAttention::post(std::initializer_list<Pass> passes, const char* what, int step) {
  const int p = comm_.size(), r = comm_.rank();
  std::vector<P2POp> ops;
  for (const Pass& x : passes) {
    ops.push_back(P2POp{P2POp::kSend, CommBuf::device(x.send, x.n), (r + 1) % p, x.tag});
    ops.push_back(P2POp{P2POp::kRecv, CommBuf::device(x.recv, x.n), (r + p - 1) % p, x.tag});
    const auto bytes = static_cast<int64_t>(x.n * dtype_size(x.send.dtype()));
    traffic_.bytes_sent += bytes;
    traffic_.bytes_received += bytes;
  }
  ++traffic_.exchanges;
  CommWork work = comm_.ibatch_p2p(
      ops, {.label = std::string("ring attention ") + what + " step " + std::to_string(step)});
  if (!overlap_) work.wait();  // the blocking ring: the exchange ends before the compute
  return work;
}

void RingAttention::forward_step(int src, DevPtr out, DevPtr lse, DevPtr q, DevPtr k,
                                 DevPtr v) {
  const int r = comm_.rank(), c = c_;
  const size_t second_q = static_cast<size_t>(c) * NH_ * HD_;  // row c of q / out
  if (src == r) {  // the first contributions of every row: straight into out and lse
    ops_.attention_block_forward(out, lse, q, k, v, block(c, c, 0));
    ops_.attention_block_forward(out + second_q, lse + c, q + second_q, k, v,
                                 block(c, 2 * c, c));
    return;
  }
  const DevPtr blk = blk_.as(DType::kF32), blk_lse = blk_lse_.as(DType::kF32);
  if (src < r) {
    const Ops::AttentionBlock s = block(2 * c, c, c);
    ops_.attention_block_forward(blk, blk_lse, q, k, v, s);
    ops_.attention_block_merge(out, lse, blk, blk_lse, s);
  } else {
    const Ops::AttentionBlock s = block(c, 2 * c, 2 * c);
    ops_.attention_block_forward(blk + second_q, blk_lse + c, q + second_q, k, v, s);
    ops_.attention_block_merge(out + second_q, lse + c, blk + second_q, blk_lse + c, s);
  }
}

void RingAttention::backward_step(int src, DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout,
                                  DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v) {
  const int r = comm_.rank(), c = c_;
  const size_t second_q = static_cast<size_t>(c) * NH_ * HD_;
  auto second = [&](DevPtr x) { return x + second_q; };
  if (src == r) {
    ops_.attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, block(c, c, 0));
    ops_.attention_block_backward(second(dq), dk, dv, second(dout), second(out), lse + c,
                                  second(q), k, v, block(c, 2 * c, c));
  } else if (src < r) {
    ops_.attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, block(2 * c, c, c));
  } else {
    ops_.attention_block_backward(second(dq), dk, dv, second(dout), second(out), lse + c,
                                  second(q), k, v, block(c, 2 * c, 2 * c));
  }
}

void RingAttention::forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v) {
  TRIDENT_CHECK_MSG(k.dtype() == dtype_ && v.dtype() == dtype_,
                    std::string("ring attention forward: k and v must be ") +
                        dtype_name(dtype_) + " (the dtype it was built for)");
  const int p = comm_.size(), r = comm_.rank();
  const DevPtr acc = acc_.as(DType::kF32);
  DevPtr cur_k = k, cur_v = v;
  for (int s = 0; s < p; ++s) {
    DevPtr next_k, next_v;
    CommWork kv;
    if (s + 1 < p) {  // the next block's transfer, in flight during this block's compute
      next_k = k_[s % 2].as(dtype_);
      next_v = v_[s % 2].as(dtype_);
      kv = post({{cur_k, next_k, kv_elems(), kTagK}, {cur_v, next_v, kv_elems(), kTagV}},
                "forward k/v", s);
    }
    forward_step((r - s + p) % p, acc, lse, q, cur_k, cur_v);
    kv.wait();
    cur_k = next_k;
    cur_v = next_v;
  }
  ops_.cast(out, acc, q_elems());
}

void RingAttention::backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                             DevPtr lse, DevPtr q, DevPtr k, DevPtr v) {
  TRIDENT_CHECK_MSG(k.dtype() == dtype_ && v.dtype() == dtype_,
                    std::string("ring attention backward: k and v must be ") +
                        dtype_name(dtype_) + " (the dtype it was built for)");
  const int p = comm_.size(), r = comm_.rank();
  const size_t kv_bytes_f32 = kv_elems() * sizeof(float);
  const DevPtr dq_acc = dq_.as(DType::kF32);
  ops_.zero(dq_acc, q_elems() * sizeof(float));
  DevPtr cur_k = k, cur_v = v;
  CommWork hop;  // the travelling dK/dV of the previous step, in flight during this one
  for (int s = 0; s < p; ++s) {
    DevPtr next_k, next_v;
    CommWork kv;
    if (s + 1 < p) {  // as in forward
      next_k = k_[s % 2].as(dtype_);
      next_v = v_[s % 2].as(dtype_);
      kv = post({{cur_k, next_k, kv_elems(), kTagK}, {cur_v, next_v, kv_elems(), kTagV}},
                "backward k/v", s);
    }
    // The accumulator of the block in hand: this rank's own at step 0, else the one the
    // previous hop brings. Step 0 computes straight into it; later steps into the block
    // buffers, added to the accumulator once it has arrived.
    const DevPtr acc_dk = dk_[s % 2].as(DType::kF32), acc_dv = dv_[s % 2].as(DType::kF32);
    const DevPtr into_dk = s == 0 ? acc_dk : blk_dk_.as(DType::kF32);
    const DevPtr into_dv = s == 0 ? acc_dv : blk_dv_.as(DType::kF32);
    ops_.zero(into_dk, kv_bytes_f32);
    ops_.zero(into_dv, kv_bytes_f32);
    backward_step((r - s + p) % p, dq_acc, into_dk, into_dv, dout, out, lse, q, cur_k, cur_v);
    if (s > 0) {
      hop.wait();
      ops_.accumulate(acc_dk, into_dk, kv_elems());
      ops_.accumulate(acc_dv, into_dv, kv_elems());
    }
    kv.wait();
    if (p > 1) {  // the block's dK/dV on to the next rank, which holds that block next
      // (after the last step: home to its owner); this rank's next accumulator arrives.
      const DevPtr next_dk = dk_[(s + 1) % 2].as(DType::kF32);
      const DevPtr next_dv = dv_[(s + 1) % 2].as(DType::kF32);
      hop = post({{acc_dk, next_dk, kv_elems(), kTagDk}, {acc_dv, next_dv, kv_elems(), kTagDv}},
                 "backward dk/dv", s);
    }
    cur_k = next_k;
    cur_v = next_v;
  }
  hop.wait();
  // The gradients of this rank's own keys and values, complete (p hops after step 0).
  const DevPtr own_dk = dk_[p > 1 ? p % 2 : 0].as(DType::kF32);
  const DevPtr own_dv = dv_[p > 1 ? p % 2 : 0].as(DType::kF32);
  if (!dq.is_null()) ops_.accumulate(dq, dq_acc, q_elems());
  if (!dk.is_null()) ops_.accumulate(dk, own_dk, kv_elems());
  if (!dv.is_null()) ops_.accumulate(dv, own_dv, kv_elems());
}

}  // namespace trident
