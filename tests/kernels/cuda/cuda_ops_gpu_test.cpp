// GPU tests of the CUDA Ops. Each skips (GTEST_SKIP, "no CUDA device: <reason>") without a
// device, so on a machine without a GPU they report as skipped, never as passed. Every op
// against the float64 reference and against the CPU backend is the op table
// (tests/kernels/op_table_test.cpp, OpTable.cuda and OpTable.cuda_vs_cpu); these cover what
// the table does not: transfers, memmove, zero-filled allocations, the debug sync mode, the
// bitwise claims, determinism, and that a repeated step allocates nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace trident::cuda {
namespace {

#define TRIDENT_REQUIRE_GPU(ops)                                                      \
  auto ops##_made = make_ops(DeviceKind::kCuda, 0, 1);                                \
  if (!ops##_made.is_ok()) GTEST_SKIP() << "no CUDA device: " << ops##_made.status().message(); \
  Ops& ops = **ops##_made

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<float> download_all(Ops& ops, DevPtr p, size_t n) {
  std::vector<float> v(n);
  ops.download_floats(v.data(), p, n);
  return v;
}

TEST(CudaOpsGpu, UploadDownloadRoundTripAndCounts) {
  TRIDENT_REQUIRE_GPU(ops);
  EXPECT_STREQ(ops.name(), "cuda");
  // Sizes below, at and above one staging chunk (kStagingBytes), odd.
  for (size_t bytes : {size_t{1}, size_t{1000}, kStagingBytes, kStagingBytes + 12345}) {
    std::vector<unsigned char> host(bytes), back(bytes, 0xAB);
    for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>((i * 131 + 7) & 255);
    DeviceBuffer buf(ops, bytes);
    // Zero-filled, as Ops::allocate promises.
    ops.download(back.data(), buf.get(), bytes);
    for (size_t i = 0; i < bytes; i += 4099) ASSERT_EQ(back[i], 0) << bytes << " at " << i;
    const TransferCounts before = ops.transfer_counts();
    ops.upload(buf.get(), host.data(), bytes);
    ops.download(back.data(), buf.get(), bytes);
    EXPECT_EQ(ops.transfer_counts().uploads, before.uploads + 1);
    EXPECT_EQ(ops.transfer_counts().downloads, before.downloads + 1);
    EXPECT_EQ(ops.transfer_counts().upload_bytes, before.upload_bytes + bytes);
    EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0) << bytes;
  }
  EXPECT_EQ(ops.allocation_counts().live_bytes, 0u);
}

TEST(CudaOpsGpu, CopyIsMemmoveAndZeroZeroes) {
  TRIDENT_REQUIRE_GPU(ops);
  const size_t n = 1000;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  DeviceBuffer buf(ops, n * sizeof(float));
  DevPtr p = buf.as(DType::kF32);
  ops.upload(p, host.data(), n * sizeof(float));
  ops.copy(p + 10, p, 500 * sizeof(float));  // overlapping, forward
  std::vector<float> got = download_all(ops, p, n);
  for (size_t i = 0; i < 500; ++i) ASSERT_EQ(got[10 + i], static_cast<float>(i)) << i;
  ops.upload(p, host.data(), n * sizeof(float));
  ops.copy(p, p + 10, 500 * sizeof(float));  // overlapping, backward
  got = download_all(ops, p, n);
  for (size_t i = 0; i < 500; ++i) ASSERT_EQ(got[i], static_cast<float>(i + 10)) << i;
  ops.zero(p + 3, 7 * sizeof(float));
  got = download_all(ops, p, n);
  EXPECT_EQ(got[2], 12.0f);
  for (size_t i = 3; i < 10; ++i) EXPECT_EQ(got[i], 0.0f);
  EXPECT_EQ(got[10], 20.0f);
}

// The kernels round with __float2bfloat16_rn; the CPU (and upload_floats) with
// float_to_bf16: the same bits for ties, subnormals, infinities, the largest values.
TEST(CudaOpsGpu, Bf16RoundingIsTheCpusRoundToNearestEven) {
  TRIDENT_REQUIRE_GPU(ops);
  std::vector<float> v = random_floats(4096, 1, -1e3f, 1e3f);
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u, 0x00400000u,
                        0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                        0x00000000u, 0x80000000u, 0x7f7f8000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  const size_t n = v.size();
  DeviceBuffer src(ops, n * 4), dst(ops, n * 2);
  ops.upload(src.get(), v.data(), n * 4);
  ops.cast(dst.as(DType::kBF16), src.as(DType::kF32), n);
  std::vector<bf16_t> got(n);
  ops.download(got.data(), dst.get(), n * 2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], float_to_bf16(v[i])) << i << ": " << v[i];
}

// Sums over rows walk the rows in the CPU's order: the embedding backward (repeated
// tokens) is bitwise the CPU's, and so is the bias gradient over at most kColumnRowChunk
// rows (one partial); over more rows its two-pass order differs from the CPU's running
// sum only by rounding.
TEST(CudaOpsGpu, RowOrderReductionsAreBitwiseTheCpus) {
  TRIDENT_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_ops(1);
  const int B = 3, T = 37, C = 77, V = 11, N = B * T;
  std::vector<int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 7) % V;  // every row repeats
  const std::vector<float> dout = random_floats(static_cast<size_t>(N) * C, 2);
  const std::vector<float> init_dwte = random_floats(static_cast<size_t>(V) * C, 3);
  std::vector<std::vector<float>> results, all_bias;
  for (Ops* ops : {cpu.get(), &gpu}) {
    DeviceBuffer t(*ops, N * 4), d(*ops, dout.size() * 4), w(*ops, init_dwte.size() * 4),
        p(*ops, static_cast<size_t>(T) * C * 4), bias(*ops, C * 4), bias_all(*ops, C * 4);
    ops->upload(t.get(), tokens.data(), N * 4);
    ops->upload(d.get(), dout.data(), dout.size() * 4);
    ops->upload(w.get(), init_dwte.data(), init_dwte.size() * 4);
    ops->embedding_backward(w.as(DType::kF32), p.as(DType::kF32), d.as(DType::kF32),
                            t.as(DType::kI32), B, T, C, 0, V);
    ops->matmul_backward(DevPtr(), DevPtr(), bias.as(DType::kF32), d.as(DType::kF32), DevPtr(),
                         DevPtr(), 32, 5, C);
    ops->matmul_backward(DevPtr(), DevPtr(), bias_all.as(DType::kF32), d.as(DType::kF32),
                         DevPtr(), DevPtr(), N, 5, C);
    all_bias.push_back(download_all(*ops, bias_all.as(DType::kF32), C));
    std::vector<float> all = download_all(*ops, w.as(DType::kF32), init_dwte.size());
    for (float x : download_all(*ops, p.as(DType::kF32), static_cast<size_t>(T) * C))
      all.push_back(x);
    for (float x : download_all(*ops, bias.as(DType::kF32), C)) all.push_back(x);
    results.push_back(std::move(all));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4), 0);
  for (int c = 0; c < C; ++c)
    EXPECT_NEAR(all_bias[1][c], all_bias[0][c], 1e-5f * (1.0f + std::abs(all_bias[0][c]))) << c;
}

// A short mixed sequence of ops, its outputs as bytes.
std::vector<float> run_sequence(Ops& ops) {
  const int N = 33, C = 70, V = 50, Vp = 64;
  const std::vector<float> x = random_floats(static_cast<size_t>(N) * C, 4);
  const std::vector<float> w = random_floats(C, 5, 0.5f, 1.5f);
  const std::vector<float> logits = random_floats(static_cast<size_t>(N) * Vp, 6, -4.0f, 4.0f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 13) % V;
  DeviceBuffer xb(ops, x.size() * 4), wb(ops, C * 4), out(ops, x.size() * 2), mean(ops, N * 4),
      rstd(ops, N * 4), lg(ops, logits.size() * 4), tg(ops, N * 4), loss(ops, N * 4),
      acc(ops, 16);
  ops.upload(xb.get(), x.data(), x.size() * 4);
  ops.upload(wb.get(), w.data(), C * 4);
  ops.upload(lg.get(), logits.data(), logits.size() * 4);
  ops.upload(tg.get(), targets.data(), N * 4);
  ops.layernorm_forward(out.as(DType::kBF16), mean.as(DType::kF32), rstd.as(DType::kF32),
                        xb.as(DType::kF32), wb.as(DType::kF32), DevPtr(), N, C, 1e-5f);
  ops.gelu_forward(out.as(DType::kBF16), out.as(DType::kBF16), static_cast<size_t>(N) * C);
  ops.cross_entropy_forward(loss.as(DType::kF32), lg.as(DType::kF32), tg.as(DType::kI32), N, V, Vp);
  ops.loss_accumulate(acc.as(DType::kF64), loss.as(DType::kF32), N);
  ops.cross_entropy_backward(lg.as(DType::kF32), lg.as(DType::kF32), tg.as(DType::kI32), 0.5f, N,
                             V, Vp);
  ops.sum_squares_accumulate(acc.as(DType::kF64) + 1, lg.as(DType::kF32), logits.size());
  std::vector<float> all = download_all(ops, out.as(DType::kBF16), x.size());
  for (float v : download_all(ops, lg.as(DType::kF32), logits.size())) all.push_back(v);
  double sums[2];
  ops.download(sums, acc.get(), 16);
  float as_floats[4];
  std::memcpy(as_floats, sums, 16);
  all.insert(all.end(), as_floats, as_floats + 4);
  return all;
}

TEST(CudaOpsGpu, SyncModeAndRepeatsGiveTheSameBits) {
  TRIDENT_REQUIRE_GPU(ops);
  const std::vector<float> first = run_sequence(ops);
  const std::vector<float> again = run_sequence(ops);
  ASSERT_EQ(first.size(), again.size());
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "run to run";
  ::setenv("TRIDENT_CUDA_SYNC", "1", 1);
  auto synced = make_ops(DeviceKind::kCuda, 0, 1);
  ::unsetenv("TRIDENT_CUDA_SYNC");
  ASSERT_TRUE(synced.is_ok()) << synced.status().message();
  EXPECT_NE((*synced)->description().find("TRIDENT_CUDA_SYNC=1"), std::string::npos);
  const std::vector<float> sync_run = run_sequence(**synced);
  EXPECT_EQ(std::memcmp(first.data(), sync_run.data(), first.size() * 4), 0) << "TRIDENT_CUDA_SYNC";
}

TEST(CudaOpsGpu, SumOfSquaresIsDeterministicAndMatchesTheCpu) {
  TRIDENT_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_ops(1);
  const size_t n = 3 * 16384 + 17;
  const std::vector<float> x = random_floats(n, 7);
  double got[2] = {0, 0};
  for (int rep = 0; rep < 2; ++rep) {
    DeviceBuffer b(gpu, n * 4);
    gpu.upload(b.get(), x.data(), n * 4);
    got[rep] = gpu.sum_squares(b.as(DType::kF32), n);
  }
  EXPECT_EQ(got[0], got[1]);
  DeviceBuffer c(*cpu, n * 4);
  cpu->upload(c.get(), x.data(), n * 4);
  const double want = cpu->sum_squares(c.as(DType::kF32), n);
  EXPECT_NEAR(got[0], want, 1e-12 * want);
}

// Scratch (mixed-dtype GEMM operands, sum-of-squares partials) is allocated once: a second
// identical "step" allocates nothing.
TEST(CudaOpsGpu, ARepeatedStepAllocatesNothing) {
  TRIDENT_REQUIRE_GPU(ops);
  const int N = 24, IC = 32, OC = 48;
  DeviceBuffer inp(ops, N * IC * 4), w(ops, OC * IC * 2), out(ops, N * OC * 4),
      dw(ops, OC * IC * 4), db(ops, OC * 4), din(ops, N * IC * 4), acc(ops, 8);
  auto step = [&] {
    ops.matmul_forward(out.as(DType::kF32), inp.as(DType::kF32), w.as(DType::kBF16), DevPtr(), N,
                       IC, OC);
    ops.matmul_backward(din.as(DType::kF32), dw.as(DType::kF32), db.as(DType::kF32),
                        out.as(DType::kF32), inp.as(DType::kF32), w.as(DType::kBF16), N, IC, OC);
    ops.sum_squares_accumulate(acc.as(DType::kF64), dw.as(DType::kF32),
                               static_cast<size_t>(OC) * IC);
  };
  step();
  const uint64_t allocations = ops.allocation_counts().allocations;
  step();
  EXPECT_EQ(ops.allocation_counts().allocations, allocations);
}

TEST(CudaOpsGpu, DescriptionNamesTheGpuAndLibraries) {
  TRIDENT_REQUIRE_GPU(ops);
  const std::string d = ops.description();
  for (const char* part : {"cuda device", "driver", "runtime", "cuBLASLt", "cuDNN", "attention"})
    EXPECT_NE(d.find(part), std::string::npos) << part << " in " << d;
  // The GPUs this project runs on are in the peak table (kernels/cuda/peak_table.h): a peak
  // of 0 would leave MFU unreported.
  EXPECT_GT(ops.peak_flops(), 0.0) << d;
}

}  // namespace
}  // namespace trident::cuda
