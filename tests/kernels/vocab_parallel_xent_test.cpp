// Vocab-parallel cross-entropy (xent_local_max / _sums / _finish / _backward): the logits are cut
// into S vocab slices, the two all-reduces (max, then sum) are emulated here, and the
// per-row loss and the concatenated dlogits must match a float64 reference and the fused
// cross_entropy_forward / _backward, for any slicing, slices that are all padding,
// aliased dlogits, and any thread count (bitwise).
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

// float64 softmax cross-entropy over the first V columns and its gradient.
void reference(const Problem& p, VecD* losses, VecD* dlogits) {
  losses->assign(p.N, 0.0);
  dlogits->assign(static_cast<size_t>(p.N) * p.Vp, 0.0);
  for (int n = 0; n < p.N; ++n) {
    const float* x = &p.logits[static_cast<size_t>(n) * p.Vp];
    double m = x[0], sum = 0;
    for (int v = 0; v < p.V; ++v) m = std::max(m, static_cast<double>(x[v]));
    for (int v = 0; v < p.V; ++v) sum += std::exp(x[v] - m);
    (*losses)[n] = std::log(sum) + m - x[p.targets[n]];
    for (int v = 0; v < p.V; ++v)
      (*dlogits)[static_cast<size_t>(n) * p.Vp + v] =
          p.dloss * (std::exp(x[v] - m) / sum - (v == p.targets[n] ? 1.0 : 0.0));
  }
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

void expect_padding_zero(const Result& r, const Problem& p, const std::string& what) {
  int bad = 0;
  for (int n = 0; n < p.N; ++n)
    for (int v = p.V; v < p.Vp; ++v)
      if (r.dlogits[static_cast<size_t>(n) * p.Vp + v] != 0.0f) ++bad;
  EXPECT_EQ(bad, 0) << what << ": padded columns of dlogits not exactly 0";
}

// (V, S) over Vp = 32: V = 27 as asked, S = 8 and V in {16, 20} add slices that are
// entirely padding (vocab_begin == V and vocab_begin > V).
TEST(CpuVocabParallelXent, MatchesReferenceAndFusedForEverySlicing) {
  auto ops = make_cpu_ops(2);
  const int N = 37, Vp = 32;
  const std::pair<int, int> cases[] = {{27, 1}, {27, 2}, {27, 4}, {27, 8},
                                       {20, 4}, {16, 2}, {16, 4}, {1, 4}};
  for (auto [V, S] : cases) {
    const std::string what = "V=" + std::to_string(V) + " S=" + std::to_string(S);
    SCOPED_TRACE(what);
    const Problem p = make_problem(N, V, Vp, 300 + V);
    VecD ref_loss, ref_d;
    reference(p, &ref_loss, &ref_d);
    const Result fused = run_fused(*ops, p);
    const Result sliced = run_sliced(*ops, p, S, /*in_place=*/false);
    expect_close(sliced.losses, ref_loss, kTol, "losses vs float64");
    expect_close(sliced.dlogits, ref_d, kTol, "dlogits vs float64");
    expect_close(sliced.losses, to_d(fused.losses), kTol, "losses vs fused");
    expect_close(sliced.dlogits, to_d(fused.dlogits), kTol, "dlogits vs fused");
    expect_padding_zero(sliced, p, what);
    // One rank runs the fused op's arithmetic exactly.
    if (S == 1) {
      EXPECT_TRUE(bitwise_equal(sliced.losses, fused.losses)) << "S=1 losses vs fused";
      EXPECT_TRUE(bitwise_equal(sliced.dlogits, fused.dlogits)) << "S=1 dlogits vs fused";
    }
    const Result aliased = run_sliced(*ops, p, S, /*in_place=*/true);
    EXPECT_TRUE(bitwise_equal(aliased.dlogits, sliced.dlogits)) << "aliased dlogits differ";
  }
}

TEST(CpuVocabParallelXent, PaddingOnlySliceContributesNothing) {
  auto ops = make_cpu_ops(1);
  const int N = 5, Vl = 8, V = 27;
  const std::vector<int32_t> tgt = {0, 26, 13, 24, 3};
  const VecF logits = random_vec(N * Vl, 7, -4, 4);
  for (int vocab_begin : {27, 32}) {  // == V and > V
    VecF row_max(N, 0.0f), sum_exp(N, 5.0f), tl(N, 5.0f), d(N * Vl, 9.0f);
    ops->xent_local_max(dev(*ops, row_max), dev(*ops, logits), N, Vl, vocab_begin, V);
    for (float m : row_max) EXPECT_EQ(m, -FLT_MAX);
    const VecF global_max(N, 1.5f), global_sum(N, 3.0f);
    ops->xent_local_sums(dev(*ops, sum_exp), dev(*ops, tl), dev(*ops, logits),
                         dev(*ops, global_max), dev(*ops, tgt), N, Vl, vocab_begin, V);
    EXPECT_EQ(sum_exp, VecF(N, 0.0f));
    EXPECT_EQ(tl, VecF(N, 0.0f));
    ops->xent_local_backward(dev(*ops, d), dev(*ops, logits), dev(*ops, global_max),
                             dev(*ops, global_sum), dev(*ops, tgt), 0.5f, N, Vl, vocab_begin, V);
    EXPECT_EQ(d, VecF(N * Vl, 0.0f));
  }
}

// Local values on a partly padded slice, checked one by one against direct formulas:
// the max and the sum skip padded columns, target_logit is set only on the owning rank.
TEST(CpuVocabParallelXent, LocalValuesOnPartlyPaddedSlice) {
  auto ops = make_cpu_ops(1);
  const int N = 3, Vl = 8, vocab_begin = 24, V = 27;  // columns 24..26 real, 27..31 padding
  VecF logits = random_vec(N * Vl, 11, -2, 2);
  for (int n = 0; n < N; ++n)
    for (int v = 3; v < Vl; ++v) logits[n * Vl + v] = 60.0f;
  const std::vector<int32_t> tgt = {24, 26, 23};  // first, last real column; another rank's
  VecF row_max(N), sum_exp(N), tl(N);
  ops->xent_local_max(dev(*ops, row_max), dev(*ops, logits), N, Vl, vocab_begin, V);
  const VecF m(N, 2.5f);
  ops->xent_local_sums(dev(*ops, sum_exp), dev(*ops, tl), dev(*ops, logits), dev(*ops, m),
                       dev(*ops, tgt), N, Vl, vocab_begin, V);
  for (int n = 0; n < N; ++n) {
    const float* x = &logits[n * Vl];
    EXPECT_EQ(row_max[n], std::max({x[0], x[1], x[2]})) << n;
    const double want = std::exp(x[0] - 2.5) + std::exp(x[1] - 2.5) + std::exp(x[2] - 2.5);
    EXPECT_NEAR(sum_exp[n], want, 1e-6 * want) << n;
  }
  EXPECT_EQ(tl[0], logits[0 * Vl + 0]);
  EXPECT_EQ(tl[1], logits[1 * Vl + 2]);
  EXPECT_EQ(tl[2], 0.0f);
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
