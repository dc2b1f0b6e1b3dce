// The tensor-parallel layers without a group (parallel/tensor_parallel.h): at size 1 each
// layer is exactly its plain Ops call (bitwise), so a model with tp = 1 is the model
// without tensor parallelism; a split that does not divide and a collective on a
// planning-only group fail naming what. The split layers over real groups:
// tests/parallel/tp_layers_mpi_test.cpp.
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/forwarding_ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident {
namespace {

using testing::dev;
using testing::DevVec;
using testing::VecF;

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37 + 11) % 23) - 1.0f;
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TensorParallel, OneRankLayersAreThePlainOpsCalls) {
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, nullptr, 0, 1);
  EXPECT_FALSE(group.active());
  const int N = 5, C = 6, F = 7, V = 9, Vp = 12;
  const VecF x = values(N * C, 0.25f), w = values(F * C, 0.125f), bias = values(F, 0.5f);

  ColumnParallelLinear column(group, C, F, "fc");
  VecF out(N * F), want(N * F);
  column.forward(dev(*ops, out), dev(*ops, x), dev(*ops, w), dev(*ops, bias), N);
  ops->matmul_forward(dev(*ops, want), dev(*ops, x), dev(*ops, w), dev(*ops, bias), N, C, F);
  EXPECT_TRUE(bitwise_equal(out, want));

  RowParallelLinear row(group, F, C, "proj");
  const VecF w2 = values(C * F, 0.2f), bias2 = values(C, 0.3f);
  VecF y(N * C), y_want(N * C);
  row.forward(dev(*ops, y), dev(*ops, out), dev(*ops, w2), dev(*ops, bias2), N);
  // The bias, on the only rank.
  ops->matmul_forward(dev(*ops, y_want), dev(*ops, out), dev(*ops, w2), dev(*ops, bias2), N, F, C);
  EXPECT_TRUE(bitwise_equal(y, y_want));

  // The cross-entropy at one rank: bitwise cross_entropy_forward/backward (padded columns
  // V..Vp-1 excluded), through the three local steps (CrossEntropyKeepsItsStatistics).
  const std::vector<int32_t> targets = {0, 3, 8, 1, 5};
  const DevVec<int32_t> tgt(*ops, targets);
  VocabParallelCrossEntropy xent(group, V, Vp);
  VecF logits = values(N * Vp, 0.3f), logits_want = logits;
  VecF losses(N), losses_want(N), row_max(N), sums(2 * N);
  {
    // Kept from forward to backward, as the model keeps them; the backward is in place.
    DevVec<float> d_logits(*ops, logits), d_logits_want(*ops, logits_want);
    DevVec<float> d_row_max(*ops, row_max), d_sums(*ops, sums);
    xent.forward(dev(*ops, losses), d_row_max, d_sums, d_logits, tgt, N);
    ops->cross_entropy_forward(dev(*ops, losses_want), d_logits_want, tgt, N, V, Vp);
    xent.backward(d_logits, d_logits, d_row_max, d_sums, tgt, 0.5f, N);
    ops->cross_entropy_backward(d_logits_want, d_logits_want, tgt, 0.5f, N, V, Vp);
  }
  EXPECT_TRUE(bitwise_equal(losses, losses_want));
  EXPECT_TRUE(bitwise_equal(logits, logits_want));
}

// Counts the cross-entropy's calls and the passes they make over the logits (the fused
// forward: max and sum; the fused backward: max, sum, then the write).
class XentPassOps : public testing::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  int passes = 0, fused_calls = 0;
  void cross_entropy_forward(DevPtr losses, DevPtr logits, DevPtr targets, int N, int V,
                             int Vp) override {
    passes += 2, ++fused_calls;
    inner_.cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    passes += 3, ++fused_calls;
    inner_.cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void xent_local_max(DevPtr row_max, DevPtr logits, int N, int Vp_local, int vocab_begin,
                      int V) override {
    ++passes;
    inner_.xent_local_max(row_max, logits, N, Vp_local, vocab_begin, V);
  }
  void xent_local_sums(DevPtr sum_exp, DevPtr target_logit, DevPtr logits, DevPtr row_max,
                       DevPtr targets, int N, int Vp_local, int vocab_begin, int V) override {
    ++passes;
    inner_.xent_local_sums(sum_exp, target_logit, logits, row_max, targets, N, Vp_local,
                           vocab_begin, V);
  }
  void xent_local_backward(DevPtr dlogits, DevPtr logits, DevPtr row_max, DevPtr sum_exp,
                           DevPtr targets, float dloss, int N, int Vp_local, int vocab_begin,
                           int V) override {
    ++passes;
    inner_.xent_local_backward(dlogits, logits, row_max, sum_exp, targets, dloss, N, Vp_local,
                               vocab_begin, V);
  }
};

// At one rank backward reuses the row statistics that forward kept: three passes over the
// logits in all, not five, and no fused call.
TEST(TensorParallel, CrossEntropyKeepsItsStatistics) {
  auto cpu = make_cpu_ops(1);
  XentPassOps ops(*cpu);
  TensorParallel group(ops, nullptr, 0, 1);
  const int N = 4, V = 7, Vp = 8;
  const std::vector<int32_t> targets = {0, 6, 2, 3};
  const DevVec<int32_t> tgt(ops, targets);
  VocabParallelCrossEntropy xent(group, V, Vp);
  VecF logits = values(N * Vp, 0.4f), losses(N), row_max(N), sums(2 * N);
  {
    DevVec<float> d_logits(ops, logits), d_row_max(ops, row_max), d_sums(ops, sums);
    xent.forward(dev(ops, losses), d_row_max, d_sums, d_logits, tgt, N);
    EXPECT_EQ(ops.passes, 2);
    xent.backward(d_logits, d_logits, d_row_max, d_sums, tgt, 1.0f, N);
  }
  EXPECT_EQ(ops.passes, 3);
  EXPECT_EQ(ops.fused_calls, 0);
}

TEST(TensorParallelDeathTest, ASplitThatDoesNotDivideNamesTheDimension) {
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, nullptr, 1, 4);
  EXPECT_DEATH(ColumnParallelLinear(group, 8, 10, "mlp.fc"), "mlp.fc: 10 does not split over tp 4");
}

TEST(TensorParallelDeathTest, APlanningOnlyGroupRefusesItsFirstCollective) {
  // Size 2 without a communicator: sizes and splits work (the memory plan builds such
  // models), a collective does not.
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, nullptr, 0, 2);
  EXPECT_TRUE(group.active());
  EXPECT_EQ(group.local(8, "d_ff"), 4);
  EXPECT_EQ(group.begin(8, "d_ff"), 0);
  RowParallelLinear row(group, 8, 3, "attn.o");
  const VecF inp = values(2 * 4, 0.1f), w = values(3 * 4, 0.1f);
  VecF out(2 * 3);
  EXPECT_DEATH(row.forward(dev(*ops, out), dev(*ops, inp), dev(*ops, w), DevPtr(), 2),
               "tp collective 'attn.o' over 2 ranks without a communicator");
}

}  // namespace
}  // namespace trident
