// Vocab-parallel cross-entropy (xent_local_max / _sums / _finish / _backward): the logits are cut
// into S vocab slices, the two all-reduces (max, then sum) are emulated here, and the
// per-row loss and the concatenated dlogits must match the fused cross_entropy_forward /
// _backward (bitwise for one slice), for any slicing, with aliased dlogits (bitwise), and
// for any thread count (bitwise). Each piece and the whole decomposition against float64,
// slices that are all padding and padded columns cleared exactly: the op table's
// xent_local_* and xent_parallel entries (op_table_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr double kTol = 1e-5;

struct Problem {
  int N, V, Vp;
  VecF logits;  // [N, Vp]; padded columns hold large garbage that must be ignored
  std::vector<int32_t> targets;  // [N]; every real column is some row's target when N >= V
  float dloss;
};

Problem make_problem(int N, int V, int Vp, uint32_t seed) {
  Problem p{N, V, Vp, random_vec(static_cast<size_t>(N) * Vp, seed, -4, 4), {}, 1.0f / N};
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) p.logits[static_cast<size_t>(n) * Vp + v] = 60.0f;
  p.targets.resize(N);
  for (int n = 0; n < N; ++n) p.targets[n] = (n * 7 + 3) % V;  // 7 coprime with the V used
  return p;
}

struct Result {
  VecF losses;   // [N]
  VecF dlogits;  // [N, Vp], the slices concatenated back
};

// Runs the decomposition over S equal slices as S ranks would, emulating the all-reduces
// (sums in rank order). in_place: each rank's backward overwrites its own logits slice.
Result run_sliced(Ops& ops, const Problem& p, int S, bool in_place) {
  const int N = p.N, Vl = p.Vp / S;
  std::vector<VecF> slice(S, VecF(static_cast<size_t>(N) * Vl));
  for (int r = 0; r < S; ++r)
    for (int n = 0; n < N; ++n)
      std::memcpy(&slice[r][static_cast<size_t>(n) * Vl],
                  &p.logits[static_cast<size_t>(n) * p.Vp + r * Vl], Vl * sizeof(float));

  VecF row_max(N, -FLT_MAX), local(N);
  for (int r = 0; r < S; ++r) {
    ops.xent_local_max(dev(ops, local), dev(ops, slice[r]), N, Vl, r * Vl, p.V);
    for (int n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], local[n]);
  }
  VecF sum_exp(N, 0.0f), target_logit(N, 0.0f), local_t(N);
  for (int r = 0; r < S; ++r) {
    std::fill(local.begin(), local.end(), 123.0f);  // must be overwritten
    std::fill(local_t.begin(), local_t.end(), 123.0f);
    ops.xent_local_sums(dev(ops, local), dev(ops, local_t), dev(ops, slice[r]), dev(ops, row_max),
                        dev(ops, p.targets), N, Vl, r * Vl, p.V);
    for (int n = 0; n < N; ++n) sum_exp[n] += local[n], target_logit[n] += local_t[n];
  }
  Result out{VecF(N), VecF(static_cast<size_t>(N) * p.Vp)};
  std::fill(out.losses.begin(), out.losses.end(), 123.0f);  // must be overwritten
  ops.xent_finish(dev(ops, out.losses), dev(ops, row_max), dev(ops, sum_exp),
                  dev(ops, target_logit), N);

  for (int r = 0; r < S; ++r) {
    VecF d(slice[r].size(), 9.0f);  // overwritten, not accumulated
    {
      DevVec<float> logits_r(ops, slice[r]), d_r(ops, d);  // written back at the block's end
      ops.xent_local_backward(in_place ? logits_r.ptr() : d_r.ptr(), logits_r, dev(ops, row_max),
                              dev(ops, sum_exp), dev(ops, p.targets), p.dloss, N, Vl, r * Vl, p.V);
    }
    const float* dst = in_place ? slice[r].data() : d.data();
    for (int n = 0; n < N; ++n)
      std::memcpy(&out.dlogits[static_cast<size_t>(n) * p.Vp + r * Vl],
                  dst + static_cast<size_t>(n) * Vl, Vl * sizeof(float));
  }
  return out;
}

Result run_fused(Ops& ops, const Problem& p) {
  Result out{VecF(p.N), VecF(static_cast<size_t>(p.N) * p.Vp)};
  ops.cross_entropy_forward(dev(ops, out.losses), dev(ops, p.logits), dev(ops, p.targets), p.N, p.V,
                            p.Vp);
  ops.cross_entropy_backward(dev(ops, out.dlogits), dev(ops, p.logits), dev(ops, p.targets),
                             p.dloss, p.N, p.V, p.Vp);
  return out;
}

bool bitwise_equal(const VecF& a, const VecF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// (V, S) over Vp = 32: V = 27 as asked, S = 8 and V in {16, 20} add slices that are
// entirely padding (vocab_begin == V and vocab_begin > V). The same slicings against
// float64: the op table's xent_parallel_*_N37_R<S>_Vpl<32/S>_V<V> entries.
TEST(CpuVocabParallelXent, MatchesTheFusedOpForEverySlicing) {
  auto ops = make_cpu_ops(2);
  const int N = 37, Vp = 32;
  const std::pair<int, int> cases[] = {{27, 1}, {27, 2}, {27, 4}, {27, 8},
                                       {20, 4}, {16, 2}, {16, 4}, {1, 4}};
  for (auto [V, S] : cases) {
    const std::string what = "V=" + std::to_string(V) + " S=" + std::to_string(S);
    SCOPED_TRACE(what);
    const Problem p = make_problem(N, V, Vp, 300 + V);
    const Result fused = run_fused(*ops, p);
    const Result sliced = run_sliced(*ops, p, S, /*in_place=*/false);
    expect_close(sliced.losses, to_d(fused.losses), kTol, "losses vs fused");
    expect_close(sliced.dlogits, to_d(fused.dlogits), kTol, "dlogits vs fused");
    // One rank runs the fused op's arithmetic exactly.
    if (S == 1) {
      EXPECT_TRUE(bitwise_equal(sliced.losses, fused.losses)) << "S=1 losses vs fused";
      EXPECT_TRUE(bitwise_equal(sliced.dlogits, fused.dlogits)) << "S=1 dlogits vs fused";
    }
    const Result aliased = run_sliced(*ops, p, S, /*in_place=*/true);
    EXPECT_TRUE(bitwise_equal(aliased.dlogits, sliced.dlogits)) << "aliased dlogits differ";
  }
}

// Large enough that every step takes its OpenMP path (N * Vp_local >= 32 Ki).
TEST(CpuVocabParallelXent, BitwiseIdenticalAcrossThreadCounts) {
  Problem p = make_problem(256, 1000, 1024, 99);
  for (int n = 0; n < p.N; ++n) p.targets[n] = (n * 37) % p.V;  // both slices
  auto one = make_cpu_ops(1);
  auto two = make_cpu_ops(2);
  auto three = make_cpu_ops(3);
  for (bool in_place : {false, true}) {
    const Result ref = run_sliced(*one, p, 2, in_place);
    for (Ops* ops : {one.get(), two.get(), three.get()}) {
      const Result got = run_sliced(*ops, p, 2, in_place);
      EXPECT_TRUE(bitwise_equal(got.losses, ref.losses)) << "losses, in_place " << in_place;
      EXPECT_TRUE(bitwise_equal(got.dlogits, ref.dlogits)) << "dlogits, in_place " << in_place;
    }
    // And the parallel path is still right.
    const Result fused = run_fused(*two, p);
    expect_close(ref.losses, to_d(fused.losses), kTol, "large losses vs fused");
    expect_close(ref.dlogits, to_d(fused.dlogits), kTol, "large dlogits vs fused");
  }
}

}  // namespace
}  // namespace trident::testing
