// The tensor-parallel layers without a group (parallel/tensor_parallel.h): at size 1 each
// layer is exactly its plain Ops call (bitwise), so a model with tp = 1 is the model
// without tensor parallelism; a split that does not divide and a collective on a
// planning-only group fail naming what. The split layers over real groups:
// tests/mpi/tp_layers_test.cpp.
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

namespace trident {
namespace {

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37 + 11) % 23) - 1.0f;
  return v;
}

struct Buffers {
  Ops& ops;
  std::vector<DeviceBuffer> owned;
  DevPtr put(const std::vector<float>& host) {
    owned.emplace_back(ops, host.size() * sizeof(float));
    DevPtr p = owned.back().as(DType::kF32);
    ops.upload_floats(p, host.data(), host.size());
    return p;
  }
  std::vector<float> get(DevPtr p, size_t n) {
    std::vector<float> host(n);
    ops.download_floats(host.data(), p, n);
    return host;
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TensorParallel, OneRankLayersAreThePlainOpsCalls) {
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, nullptr, 0, 1);
  EXPECT_FALSE(group.active());
  const int N = 5, C = 6, F = 7, V = 9, Vp = 12;
  Buffers b{*ops, {}};
  DevPtr x = b.put(values(N * C, 0.25f)), w = b.put(values(F * C, 0.125f)),
         bias = b.put(values(F, 0.5f));

  ColumnParallelLinear column(group, C, F, "fc");
  DevPtr out = b.put(std::vector<float>(N * F)), want = b.put(std::vector<float>(N * F));
  column.forward(out, x, w, bias, N);
  ops->matmul_forward(want, x, w, bias, N, C, F);
  EXPECT_TRUE(bitwise_equal(b.get(out, N * F), b.get(want, N * F)));

  RowParallelLinear row(group, F, C, "proj");
  DevPtr w2 = b.put(values(C * F, 0.2f)), bias2 = b.put(values(C, 0.3f));
  DevPtr y = b.put(std::vector<float>(N * C)), y_want = b.put(std::vector<float>(N * C));
  row.forward(y, out, w2, bias2, N);
  ops->matmul_forward(y_want, out, w2, bias2, N, F, C);  // the bias, on the only rank
  EXPECT_TRUE(bitwise_equal(b.get(y, N * C), b.get(y_want, N * C)));

  // The cross-entropy at one rank is cross_entropy_forward/backward (padded columns
  // V..Vp-1 excluded), not the three-step vocab-parallel form.
  std::vector<int32_t> targets = {0, 3, 8, 1, 5};
  DeviceBuffer tgt(*ops, targets.size() * sizeof(int32_t));
  ops->upload(tgt.as(DType::kI32), targets.data(), targets.size() * sizeof(int32_t));
  VocabParallelCrossEntropy xent(group, V, Vp);
  const std::vector<float> logits_host = values(N * Vp, 0.3f);
  DevPtr logits = b.put(logits_host), logits2 = b.put(logits_host);
  DevPtr losses = b.put(std::vector<float>(N)), losses_want = b.put(std::vector<float>(N));
  DevPtr row_max = b.put(std::vector<float>(N)), sums = b.put(std::vector<float>(2 * N));
  xent.forward(losses, row_max, sums, logits, tgt.as(DType::kI32), N);
  ops->cross_entropy_forward(losses_want, logits2, tgt.as(DType::kI32), N, V, Vp);
  EXPECT_TRUE(bitwise_equal(b.get(losses, N), b.get(losses_want, N)));
  xent.backward(logits, logits, row_max, sums, tgt.as(DType::kI32), 0.5f, N);
  ops->cross_entropy_backward(logits2, logits2, tgt.as(DType::kI32), 0.5f, N, V, Vp);
  EXPECT_TRUE(bitwise_equal(b.get(logits, N * Vp), b.get(logits2, N * Vp)));
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
  Buffers b{*ops, {}};
  DevPtr inp = b.put(values(2 * 4, 0.1f)), w = b.put(values(3 * 4, 0.1f)),
         out = b.put(std::vector<float>(2 * 3));
  EXPECT_DEATH(row.forward(out, inp, w, DevPtr(), 2),
               "tp collective 'attn.o' over 2 ranks without a communicator");
}

}  // namespace
}  // namespace trident
