// The ops that keep a step's reductions on the device (kernels/ops.h): xent_finish,
// loss_accumulate and sum_squares_accumulate give bitwise the values the host loops they
// replace computed, independent of the thread count; and every upload / download is
// counted in Ops::transfer_counts (the host-synchronisation budget's meter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

uint64_t bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The host combine model/transformer.cpp ran before xent_finish existed.
TEST(CpuDeviceReduce, XentFinishEqualsTheHostCombineOnAnyThreadCount) {
  const int N = 5000;  // above the op's OpenMP threshold
  const VecF row_max = random_vec(N, 1, -3, 3);
  const VecF sum_exp = random_vec(N, 2, 1, 50);
  const VecF target = random_vec(N, 3, -5, 5);
  VecF want(N);
  for (int n = 0; n < N; ++n) want[n] = std::log(sum_exp[n]) + row_max[n] - target[n];
  for (int threads : {1, 2, 3}) {
    auto ops = make_cpu_ops(threads);
    VecF got(N, 123.0f);
    ops->xent_finish(dev(*ops, got), dev(*ops, row_max), dev(*ops, sum_exp), dev(*ops, target), N);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), N * sizeof(float)), 0) << threads;
  }
}

// The trainer's old host loop: per micro-batch float(sum in double / N), then a double
// running sum over micro-batches in order.
TEST(CpuDeviceReduce, LossAccumulateEqualsTheHostLoopBitwise) {
  auto ops = make_cpu_ops(2);
  const int N = 37;
  double want = 0.0;
  DeviceBuffer acc_buf(*ops, sizeof(double));  // zero-filled
  const DevPtr acc = acc_buf.as(DType::kF64);
  for (int micro = 0; micro < 4; ++micro) {
    const VecF losses = random_vec(N, 10 + micro, 0, 11);
    double sum = 0.0;
    for (float v : losses) sum += v;
    want += static_cast<float>(sum / N);
    ops->loss_accumulate(acc, dev(*ops, losses), N);
  }
  double got = 0.0;
  ops->download(&got, acc, sizeof got);
  EXPECT_EQ(bits(got), bits(want)) << got << " vs " << want;
  EXPECT_GT(want, 0.0);  // not a vacuous 0 == 0
}

TEST(CpuDeviceReduce, SumSquaresAccumulateAddsTheSumOfSquaresOnAnyThreadCount) {
  const size_t sizes[] = {1, 1000, 40000, 100003};  // one chunk, several, a tail
  auto one = make_cpu_ops(1);
  for (int threads : {1, 2, 3}) {
    auto ops = make_cpu_ops(threads);
    DeviceBuffer acc_buf(*ops, sizeof(double));  // zero-filled
    const DevPtr acc = acc_buf.as(DType::kF64);
    double want = 0.0;
    for (size_t n : sizes) {
      const VecF x = random_vec(n, static_cast<uint32_t>(n), -2, 2);
      want += one->sum_squares(dev(*one, x), n);
      ops->sum_squares_accumulate(acc, dev(*ops, x), n);
      double ref = 0.0;
      for (float v : x) ref += static_cast<double>(v) * v;
      EXPECT_NEAR(ops->sum_squares(dev(*ops, x), n), ref, 1e-12 * ref) << n;
    }
    double got = 0.0;
    ops->download(&got, acc, sizeof got);
    EXPECT_EQ(bits(got), bits(want)) << threads;
  }
}

TEST(CpuOps, CountsEveryUploadAndDownload) {
  auto ops = make_cpu_ops(1);
  EXPECT_EQ(ops->transfer_counts().downloads, 0u);
  EXPECT_EQ(ops->transfer_counts().uploads, 0u);
  DeviceBuffer buf(*ops, 64);
  float host[16] = {1, 2, 3};
  ops->upload(buf.get(), host, sizeof host);
  ops->copy(buf.get(), buf.get(), 8);  // device -> device: not a transfer
  ops->zero(buf.get(), 4);
  float back[16];
  ops->download(back, buf.get(), 12);
  ops->download(back, buf.get(), 4);
  EXPECT_EQ(back[1], 2.0f);
  EXPECT_EQ(ops->transfer_counts().uploads, 1u);
  EXPECT_EQ(ops->transfer_counts().upload_bytes, 64u);
  EXPECT_EQ(ops->transfer_counts().downloads, 2u);
  EXPECT_EQ(ops->transfer_counts().download_bytes, 16u);
  // The host convenience sum_squares is one read.
  (void)ops->sum_squares(buf.as(DType::kF32), 16);
  EXPECT_EQ(ops->transfer_counts().downloads, 3u);
}

}  // namespace
}  // namespace trident::testing
