// Context parallelism: the sequence of every sample is split over the ranks of a cp group,
// and attention runs as ring attention over that group (docs/ARCHITECTURE.md "Context
// parallelism"). This file holds the two pieces a model needs: which rows of a sequence a
// rank holds, and RingAttention, which computes exact causal attention of those rows over
// the whole sequence without ever gathering it.
//
// Causal load balance (Megatron's and torchtitan's): a sequence of T positions is cut into
// 2·cp chunks of c = T / (2·cp) positions, and cp rank r holds chunks r and 2·cp−1−r, side
// by side as its 2c local rows ([B, 2c, ...]: rows 0..c-1 are chunk r, rows c..2c-1 chunk
// 2·cp−1−r). Every rank then does the same attention work: an early chunk, which sees few
// keys, is paired with a late one, which sees many.
//
// Ring attention over the cp group (cp steps; at step s rank r holds the keys and values
// of rank (r − s) mod cp, and passes them on to rank r + 1 while it receives the next
// block from rank r − 1):
// - step 0, its own block: chunk r's queries over chunk r (causal), chunk 2·cp−1−r's
//   queries over both chunks (causal on the second, full on the first);
// - a block of a lower rank j < r: all local queries over j's first chunk (full); its
//   second chunk is later than every local query;
// - a block of a higher rank j > r: the local second chunk's queries over both of j's
//   chunks (full); the local first chunk precedes all of them.
// So after step 0 every step is 2c² query-key pairs per head on every rank. Each block's
// (out, lse) is merged into the running one by its log-sum-exp (Ops::attention_block_merge).
// Backward repeats the ring for the keys and values and sends each block's dK/dV
// accumulator along with it: the accumulator of rank j's block visits every rank, each
// adds its queries' share (Ops::attention_block_backward, from the final out and lse), and
// one last hop brings it home, so each rank ends with the gradients of its own k and v.
//
// Communication (comm/communicator.h): every exchange is one ibatch_p2p holding the send
// to the next rank and the receive from the previous one, the NCCL-safe grouping of the
// pipeline's batch_p2p (parallel/pipeline.h): neighbours that send to each other at once
// cannot deadlock. It is posted BEFORE the compute it overlaps and waited after it, into
// double buffers: forward, the next block's k and v travel while the block in hand's
// attention computes (cp − 1 exchanges, each behind one block; the last block computes
// with nothing in flight). Backward, the next k/v block travels likewise, and the dK/dV
// accumulator finished at step s travels during step s + 1: that step computes its block's
// contribution into a block buffer of its own, then waits for the arriving accumulator
// and adds the contribution to it (step 0 computes straight into this rank's own
// accumulator); the hop of the last step, home to the owner, has nothing left to hide
// behind. MPI runs the batches on the communicator's communication thread, NCCL on its own
// stream between events. With overlap off (the constructor's flag; TRIDENT_RING_OVERLAP=0
// for the default) every exchange is waited right after it is posted: the same arithmetic
// in the same order, bitwise the same results (tests/parallel/ring_attention_mpi_test.cpp).
//
// Precision: the running out, the dK/dV accumulators (and a block's share) and dq are
// f32 whatever the dtype of q, k, v (a bf16 running out would be rounded at every merge, a
// bf16 dK/dV at every hop); keys and values travel in their own dtype. Traffic per rank and call
// (counted in traffic(), equal to the communicator's send counters): forward (cp−1) blocks
// of k and v, 2·(cp−1)·B·2c·NKV·HD elements of the dtype; backward the same again plus cp
// hops of dK/dV in f32, 2·cp·B·2c·NKV·HD·4 bytes (none when cp = 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "comm/communicator.h"
#include "core/check.h"
#include "kernels/ops.h"

namespace trident {

// The rows of one cp rank (see the top of this file).
struct CpChunks {
  int cp = 1, rank = 0;
  int chunk = 0;  // c = T / (2 cp) positions per chunk
  int rows() const { return 2 * chunk; }
  int first() const { return rank; }                // global chunk index of rows 0..c-1
  int second() const { return 2 * cp - 1 - rank; }  // and of rows c..2c-1
  int first_pos() const { return first() * chunk; }
  int second_pos() const { return second() * chunk; }
  // The global position of local row t (0 <= t < 2c): what RoPE and the data loader use.
  int position(int t) const { return t < chunk ? first_pos() + t : second_pos() + (t - chunk); }
};

// The chunks of `rank` for sequences of T positions over cp ranks. CHECK-fails unless
// T is a positive multiple of 2 cp and 0 <= rank < cp (config validation refuses other
// sequence lengths before a model is built).
CpChunks cp_chunks(int T, int cp, int rank);

// local[B, 2c, width] = the rank's rows of global[B, T, width] (host buffers: tokens,
// targets, reference activations); put_cp_rows is the inverse, writing only those rows.
template <class E>
void take_cp_rows(const E* global, E* local, int B, int T, int width, const CpChunks& c) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < c.rows(); ++t) {
      const E* src = global + (static_cast<size_t>(b) * T + c.position(t)) * width;
      E* dst = local + (static_cast<size_t>(b) * c.rows() + t) * width;
      for (int x = 0; x < width; ++x) dst[x] = src[x];
    }
}
template <class E>
void put_cp_rows(const E* local, E* global, int B, int T, int width, const CpChunks& c) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < c.rows(); ++t) {
      const E* src = local + (static_cast<size_t>(b) * c.rows() + t) * width;
      E* dst = global + (static_cast<size_t>(b) * T + c.position(t)) * width;
      for (int x = 0; x < width; ++x) dst[x] = src[x];
    }
}

// Ring attention over a cp group (device space) for one shape: B sequences of 2c local
// rows, NH query heads and NKV kv heads of HD, q/k/v of `dtype`. Allocates its buffers
// once, here (two blocks of received keys and values, the f32 running out, one block's
// out and lse, dq, two travelling dK/dV accumulators and one block's dK/dV); nothing per
// call. Every rank of the group calls forward and backward in the same order with the
// same shape and the same overlap setting.
class RingAttention {
 public:
  // Whether a block's exchange runs while a block's attention computes (see
  // "Communication" above): trident plan reads this and counts only the part of each
  // exchange that outlasts the block compute it hides behind.
  static constexpr bool kOverlapsCompute = true;

  // overlap false: every exchange is waited right after it is posted (the blocking ring,
  // for comparisons). The default: TRIDENT_RING_OVERLAP (unset or 1: overlapped, 0: not;
  // any other value CHECK-fails naming the variable).
  RingAttention(Ops& ops, Communicator& cp_group, int B, int chunk, int NH, int NKV, int HD,
                DType dtype, bool overlap = overlap_from_env());
  static bool overlap_from_env();
  bool overlaps() const { return overlap_; }

  // out[B, 2c, NH, HD] (overwritten) and lse[B, NH, 2c] (f32, overwritten: the row
  // log-sum-exp over the whole sequence, the state backward reads) of causal attention of
  // this rank's queries over every rank's keys. q[B, 2c, NH, HD], k, v [B, 2c, NKV, HD] are
  // this rank's load-balanced rows.
  void forward(DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v);
  // dq, dk, dv (this rank's rows) += the gradients, from forward's out and lse; q, k, v
  // unchanged since forward. Any gradient may be null (not needed); the ring runs anyway.
  void backward(DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out, DevPtr lse, DevPtr q,
                DevPtr k, DevPtr v);

  // Point-to-point payload of this rank since construction or reset_traffic().
  struct Traffic {
    int64_t bytes_sent = 0, bytes_received = 0;
    int64_t exchanges = 0;  // ibatch_p2p calls
  };
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }

  size_t q_elems() const;    // B * 2c * NH * HD
  size_t kv_elems() const;   // B * 2c * NKV * HD
  size_t lse_elems() const;  // B * NH * 2c
  // The bytes of the buffers it allocates (what buffer_bytes says for its shape).
  size_t bytes() const;
  // What a RingAttention of this shape over `cp` ranks allocates (the memory plan).
  static size_t buffer_bytes(int B, int chunk, int NH, int NKV, int HD, DType dtype, int cp);

 private:
  // This rank's blocks over the keys and values of rank src: merged into the running out
  // and lse (forward), or added to dq and the block's dK/dV accumulators (backward).
  void forward_step(int src, DevPtr out, DevPtr lse, DevPtr q, DevPtr k, DevPtr v);
  void backward_step(int src, DevPtr dq, DevPtr dk, DevPtr dv, DevPtr dout, DevPtr out,
                     DevPtr lse, DevPtr q, DevPtr k, DevPtr v);
  // One ibatch_p2p: each (send, receive) pair of buffers of n elements goes to rank + 1
  // and comes from rank - 1. Returns the work in flight (already finished without
  // overlap).
  struct Pass {
    DevPtr send, recv;
    size_t n;
    int tag;
  };
  CommWork post(std::initializer_list<Pass> passes, const char* what, int step);
  Ops::AttentionBlock block(int Tq, int Tk, int q_pos) const;

  Ops& ops_;
  Communicator& comm_;
  int B_, c_, NH_, NKV_, HD_;
  DType dtype_;
  DeviceBuffer k_[2], v_[2];    // received keys and values (dtype)
  DeviceBuffer acc_;            // the running out (f32)
  DeviceBuffer blk_, blk_lse_;  // one block's out and lse (f32)
  DeviceBuffer dq_;             // dq over the ring (f32)
  DeviceBuffer dk_[2], dv_[2];  // the travelling dK/dV accumulators (f32)
  DeviceBuffer blk_dk_, blk_dv_;  // one block's dK/dV share (f32)
  bool overlap_;
  Traffic traffic_;
};

}  // namespace trident
