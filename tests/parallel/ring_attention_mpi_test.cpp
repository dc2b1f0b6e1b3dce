// Ring attention (parallel/context_parallel.h) over a cp group: each rank's forward out and
// lse and its backward dq, dk, dv on its load-balanced chunks must equal the single-process
// attention_forward / attention_backward over the whole sequence (and a float64 log-sum-
// exp), for gpt2-like heads (NH = NKV) and llama-like grouped-query heads, and the bytes
// each rank sends must be the analytic ring volume. The cp group is the whole world, and at
// 4 and 8 ranks also groups of 2 and 4 inside it. Overlapped and blocking rings must
// agree bitwise. (The checked backend, which would make
// device memory inaccessible for the rest of this binary's tests, checks the bounds of the
// ring's blocks in the op table, tests/kernels/op_table_test.cpp; the chunk map alone is
// context_parallel_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "tests/common/mpi_test_util.h"

namespace trident {
namespace {

struct Heads {
  const char* name;
  int NH, NKV, HD;
};
constexpr Heads kGpt2{"gpt2", 4, 4, 8};
constexpr Heads kLlama{"llama", 4, 2, 8};

std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * test::seeded_value(seed, 0, i);  // same on every rank
  return v;
}

// The largest |a - b| over the largest |b|.
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return err / std::max(ref, 1e-30);
}

// Whole-sequence row log-sum-exp lse[b, h, t] of q k^T / sqrt(HD) over keys 0..t, float64.
std::vector<double> reference_lse(const std::vector<float>& q, const std::vector<float>& k, int B,
                                  int T, const Heads& h) {
  std::vector<double> lse(static_cast<size_t>(B) * h.NH * T);
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.HD));
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < h.NH; ++hh) {
      const int kv = hh / (h.NH / h.NKV);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<size_t>(t) + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int e = 0; e < h.HD; ++e)
            dot += static_cast<double>(q[((static_cast<size_t>(b) * T + t) * h.NH + hh) * h.HD + e]) *
                   k[((static_cast<size_t>(b) * T + j) * h.NKV + kv) * h.HD + e];
          mx = std::max(mx, s[static_cast<size_t>(j)] = dot * scale);
        }
        for (double x : s) sum += std::exp(x - mx);
        lse[(static_cast<size_t>(b) * h.NH + hh) * T + t] = mx + std::log(sum);
      }
    }
  return lse;
}

DeviceBuffer upload(Ops& ops, const std::vector<float>& host, DType dtype) {
  DeviceBuffer buf(ops, host.size() * dtype_size(dtype));
  ops.upload_floats(buf.as(dtype), host.data(), host.size());
  return buf;
}
std::vector<float> download(Ops& ops, const DeviceBuffer& buf, DType dtype, size_t n) {
  std::vector<float> host(n);
  ops.download_floats(host.data(), buf.as(dtype), n);
  return host;
}

// Runs forward and backward of ring attention over `cp` and checks them on this rank.
// dtype: of q, k, v, out and the gradients (bf16: against the f32 reference of the same
// bf16-rounded inputs, to bf16's tolerance).
void check_ring(Communicator& cp, const Heads& h, DType dtype, double tol) {
  const int B = 2, c = 3, p = cp.size(), T = 2 * p * c;
  const CpChunks chunks = cp_chunks(T, p, cp.rank());
  const std::string where = std::string(h.name) + " " + dtype_name(dtype) + " cp " +
                            std::to_string(p) + " rank " + std::to_string(cp.rank());
  const size_t wq = static_cast<size_t>(h.NH) * h.HD, wkv = static_cast<size_t>(h.NKV) * h.HD;
  const size_t nq = B * T * wq, nkv = B * T * wkv;
  auto round_to = [dtype](std::vector<float> v) {
    if (dtype == DType::kBF16)
      for (float& x : v) x = bf16_to_float(float_to_bf16(x));
    return v;
  };
  const std::vector<float> q = round_to(random_floats(nq, 11, 2.0f));
  const std::vector<float> k = round_to(random_floats(nkv, 12, 2.0f));
  const std::vector<float> v = round_to(random_floats(nkv, 13, 1.0f));
  const std::vector<float> dout = round_to(random_floats(nq, 14, 1.0f));

  // The whole sequence in one process.
  auto ref_ops = make_cpu_ops(1);
  const DType f32 = DType::kF32;
  DeviceBuffer gq = upload(*ref_ops, q, f32), gk = upload(*ref_ops, k, f32),
               gv = upload(*ref_ops, v, f32), gdout = upload(*ref_ops, dout, f32);
  DeviceBuffer gout(*ref_ops, nq * 4), gdq(*ref_ops, nq * 4), gdk(*ref_ops, nkv * 4),
      gdv(*ref_ops, nkv * 4),
      state(*ref_ops, ref_ops->attention_state_bytes(B, T, h.NH, h.NKV, h.HD, f32));
  ref_ops->attention_forward(gout.as(f32), state.get(), gq.as(f32), gk.as(f32), gv.as(f32), B, T,
                             h.NH, h.NKV, h.HD);
  ref_ops->attention_backward(gdq.as(f32), gdk.as(f32), gdv.as(f32), gdout.as(f32), gout.as(f32),
                              state.get(), gq.as(f32), gk.as(f32), gv.as(f32), B, T, h.NH, h.NKV,
                              h.HD);
  auto local = [&](const std::vector<float>& global, size_t width) {
    std::vector<float> l(static_cast<size_t>(B) * chunks.rows() * width);
    take_cp_rows(global.data(), l.data(), B, T, static_cast<int>(width), chunks);
    return l;
  };
  const std::vector<float> want_out = local(download(*ref_ops, gout, f32, nq), wq);
  const std::vector<float> want_dq = local(download(*ref_ops, gdq, f32, nq), wq);
  const std::vector<float> want_dk = local(download(*ref_ops, gdk, f32, nkv), wkv);
  const std::vector<float> want_dv = local(download(*ref_ops, gdv, f32, nkv), wkv);
  const std::vector<double> lse_all = reference_lse(q, k, B, T, h);

  // The ring, on this rank's rows. The f32 gradients start at 1 (backward accumulates);
  // bf16 ones at 0, where a sum with 1 would round to bf16's ulp at 1 instead of the
  // gradient's own.
  const float start = dtype == DType::kF32 ? 1.0f : 0.0f;
  auto ops = make_cpu_ops(1);
  const size_t lq = static_cast<size_t>(B) * chunks.rows() * wq;
  const size_t lkv = static_cast<size_t>(B) * chunks.rows() * wkv;
  const size_t nl = static_cast<size_t>(B) * h.NH * chunks.rows();
  DeviceBuffer lq_buf = upload(*ops, local(q, wq), dtype), lk = upload(*ops, local(k, wkv), dtype),
               lv = upload(*ops, local(v, wkv), dtype), ldout = upload(*ops, local(dout, wq), dtype);
  const std::vector<float> start_q(lq, start), start_kv(lkv, start);
  DeviceBuffer out(*ops, lq * dtype_size(dtype)), lse(*ops, nl * 4);
  DeviceBuffer dq = upload(*ops, start_q, dtype), dk = upload(*ops, start_kv, dtype),
               dv = upload(*ops, start_kv, dtype);
  RingAttention ring(*ops, cp, B, c, h.NH, h.NKV, h.HD, dtype);
  const int64_t sent_before = cp.traffic().bytes_of(CollectiveKind::kSend);
  ring.forward(out.as(dtype), lse.as(f32), lq_buf.as(dtype), lk.as(dtype), lv.as(dtype));
  const int64_t forward_sent = cp.traffic().bytes_of(CollectiveKind::kSend) - sent_before;
  const RingAttention::Traffic forward_traffic = ring.traffic();
  ring.backward(dq.as(dtype), dk.as(dtype), dv.as(dtype), ldout.as(dtype), out.as(dtype),
                lse.as(f32), lq_buf.as(dtype), lk.as(dtype), lv.as(dtype));
  const int64_t total_sent = cp.traffic().bytes_of(CollectiveKind::kSend) - sent_before;

  EXPECT_LE(max_rel(download(*ops, out, dtype, lq), want_out), tol) << where << " out";
  auto minus_start = [start](std::vector<float> g) {
    for (float& x : g) x -= start;
    return g;
  };
  EXPECT_LE(max_rel(minus_start(download(*ops, dq, dtype, lq)), want_dq), tol) << where << " dq";
  EXPECT_LE(max_rel(minus_start(download(*ops, dk, dtype, lkv)), want_dk), tol) << where << " dk";
  EXPECT_LE(max_rel(minus_start(download(*ops, dv, dtype, lkv)), want_dv), tol) << where << " dv";
  const std::vector<float> got_lse = download(*ops, lse, f32, nl);
  double lse_err = 0;
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < h.NH; ++hh)
      for (int t = 0; t < chunks.rows(); ++t) {
        const double want = lse_all[(static_cast<size_t>(b) * h.NH + hh) * T + chunks.position(t)];
        const double got = got_lse[(static_cast<size_t>(b) * h.NH + hh) * chunks.rows() + t];
        lse_err = std::max(lse_err, std::abs(got - want));
      }
  EXPECT_LE(lse_err, 1e-5 * std::max(1.0, static_cast<double>(T) / 32)) << where << " lse";

  // The analytic ring volume per rank: k and v (B * 2c * NKV * HD elements each) go round
  // cp - 1 hops in forward and again in backward, where dK/dV (f32) take cp hops.
  const int64_t kv_block = static_cast<int64_t>(lkv) * static_cast<int64_t>(dtype_size(dtype));
  const int64_t forward_bytes = (p - 1) * 2 * kv_block;
  const int64_t backward_bytes =
      (p - 1) * 2 * kv_block + (p > 1 ? p * 2 * static_cast<int64_t>(lkv) * 4 : 0);
  EXPECT_EQ(forward_traffic.bytes_sent, forward_bytes) << where;
  EXPECT_EQ(forward_sent, forward_bytes) << where << " (the communicator's count)";
  EXPECT_EQ(ring.traffic().bytes_sent, forward_bytes + backward_bytes) << where;
  EXPECT_EQ(ring.traffic().bytes_received, forward_bytes + backward_bytes) << where;
  EXPECT_EQ(total_sent, forward_bytes + backward_bytes) << where << " (the communicator's count)";
}

// fp32: the ring's merges and the whole-sequence softmax round differently, within a few
// ulp of the largest output (the worst measured, at 8 ranks: 6.7e-7).
constexpr double kTolF32 = 5e-6;
// bf16 outputs: one rounding of the f32 result (2^-9 of an element, under 2^-8 of the
// largest), and the bf16 out that backward's D = rowsum(dout * out) reads (the worst
// measured, at 8 ranks: 3.9e-3).
constexpr double kTolBf16 = 1.0 / 128;

TEST(RingAttention, WholeWorldMatchesOneProcessGpt2) {
  check_ring(test::device_world(), kGpt2, DType::kF32, kTolF32);
}
TEST(RingAttention, WholeWorldMatchesOneProcessLlama) {
  check_ring(test::device_world(), kLlama, DType::kF32, kTolF32);
}
TEST(RingAttention, WholeWorldMatchesOneProcessLlamaBf16) {
  check_ring(test::device_world(), kLlama, DType::kBF16, kTolBf16);
}

// What one rank's ring gives for fixed local inputs: out, lse and the gradients (added to
// zero), downloaded as floats (exact for bf16), and the ring's traffic.
struct RingResult {
  std::vector<float> out, lse, dq, dk, dv;
  RingAttention::Traffic traffic;
};
RingResult run_ring(Communicator& cp, const Heads& h, DType dtype, bool overlap) {
  const int B = 2, c = 5;
  auto ops = make_cpu_ops(1);
  RingAttention ring(*ops, cp, B, c, h.NH, h.NKV, h.HD, dtype, overlap);
  EXPECT_EQ(ring.overlaps(), overlap);
  const size_t lq = ring.q_elems(), lkv = ring.kv_elems(), nl = ring.lse_elems();
  const uint64_t seed = 100 + 10 * static_cast<uint64_t>(cp.rank());
  DeviceBuffer q = upload(*ops, random_floats(lq, seed, 2.0f), dtype),
               k = upload(*ops, random_floats(lkv, seed + 1, 2.0f), dtype),
               v = upload(*ops, random_floats(lkv, seed + 2, 1.0f), dtype),
               dout = upload(*ops, random_floats(lq, seed + 3, 1.0f), dtype);
  DeviceBuffer out(*ops, lq * dtype_size(dtype)), lse(*ops, nl * 4);
  DeviceBuffer dq = upload(*ops, std::vector<float>(lq, 0.0f), dtype),
               dk = upload(*ops, std::vector<float>(lkv, 0.0f), dtype),
               dv = upload(*ops, std::vector<float>(lkv, 0.0f), dtype);
  ring.forward(out.as(dtype), lse.as(DType::kF32), q.as(dtype), k.as(dtype), v.as(dtype));
  ring.backward(dq.as(dtype), dk.as(dtype), dv.as(dtype), dout.as(dtype), out.as(dtype),
                lse.as(DType::kF32), q.as(dtype), k.as(dtype), v.as(dtype));
  return {download(*ops, out, dtype, lq), download(*ops, lse, DType::kF32, nl),
          download(*ops, dq, dtype, lq),  download(*ops, dk, dtype, lkv),
          download(*ops, dv, dtype, lkv), ring.traffic()};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Overlap changes when the ring waits, never what it computes: with every exchange in
// flight during the block compute (the default) and with each waited at once (the
// blocking ring), every output is bitwise the same, and so is the traffic.
TEST(RingAttention, OverlapOnAndOffAreBitwiseEqual) {
  Communicator& cp = test::device_world();
  for (const Heads& h : {kGpt2, kLlama}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const std::string where = std::string(h.name) + " " + dtype_name(dtype) + " cp " +
                                std::to_string(cp.size()) + " rank " + std::to_string(cp.rank());
      const RingResult on = run_ring(cp, h, dtype, true), off = run_ring(cp, h, dtype, false);
      EXPECT_TRUE(bitwise_equal(on.out, off.out)) << where << " out";
      EXPECT_TRUE(bitwise_equal(on.lse, off.lse)) << where << " lse";
      EXPECT_TRUE(bitwise_equal(on.dq, off.dq)) << where << " dq";
      EXPECT_TRUE(bitwise_equal(on.dk, off.dk)) << where << " dk";
      EXPECT_TRUE(bitwise_equal(on.dv, off.dv)) << where << " dv";
      EXPECT_EQ(on.traffic.bytes_sent, off.traffic.bytes_sent) << where;
      EXPECT_EQ(on.traffic.exchanges, off.traffic.exchanges) << where;
      // Not vacuous: the gradients are there (a ring that dropped them would agree too).
      double sum = 0;
      for (float x : on.dk) sum += std::abs(x);
      EXPECT_GT(sum, 0) << where << " dk is all zero";
    }
  }
}

// cp groups of 2 (and 4 at 8 ranks) inside the world, as a cp dimension inside dp or pp
// will be: group ranks, not world ranks, pick the chunks and the neighbours.
TEST(RingAttention, GroupsInsideTheWorld) {
  Communicator& world = test::device_world();
  if (world.size() < 4) GTEST_SKIP() << "needs 4 ranks or more";
  for (int cp = 2; cp < world.size(); cp *= 2) {
    std::unique_ptr<Communicator> group =
        world.split(world.rank() / cp, world.rank(), "cp" + std::to_string(cp));
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), cp);
    check_ring(*group, kLlama, DType::kF32, kTolF32);
    check_ring(*group, kGpt2, DType::kF32, kTolF32);
  }
}

}  // namespace
}  // namespace trident
