// The CUDA attention paths on a GPU: the plain path against a host double reference
// (f32 and bf16, MHA and GQA, odd T, T = 128 and 256), the cuDNN path against the plain
// one in bf16 (shapes the runtime cuDNN cannot serve are skipped, naming its version; T =
// 128 and 256 are served by every supported version, so something is always compared),
// and the fallback to plain of shapes cuDNN rejects. They run through the CUDA Ops
// (make_ops), which owns the stream the paths run on; TRIDENT_ATTENTION picks the path
// when the Ops is made, the state's first byte says which path ran. Skipped without a
// device.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace trident {
namespace {

bool has_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Shape {
  int B, T, NH, NKV, HD;
};

std::string str(const Shape& s, DType dt) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HD=" + std::to_string(s.HD) + " " + dtype_name(dt);
}

// Host tensors of one attention call (values as the device holds them).
struct Problem {
  std::vector<float> q, k, v, dout, dq0, dk0, dv0;  // dq0..: what the gradients hold before
};

struct Grads {
  std::vector<float> out, dq, dk, dv;
};

std::vector<float> random_values(size_t n, bool bf16, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = bf16 ? bf16_to_float(float_to_bf16(u(rng))) : u(rng);
  return x;
}

Problem make_problem(const Shape& s, bool bf16, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t nq = static_cast<size_t>(s.B) * s.T * s.NH * s.HD;
  const size_t nkv = static_cast<size_t>(s.B) * s.T * s.NKV * s.HD;
  Problem p;
  p.q = random_values(nq, bf16, rng);
  p.k = random_values(nkv, bf16, rng);
  p.v = random_values(nkv, bf16, rng);
  p.dout = random_values(nq, bf16, rng);
  p.dq0 = random_values(nq, bf16, rng);
  p.dk0 = random_values(nkv, bf16, rng);
  p.dv0 = random_values(nkv, bf16, rng);
  return p;
}

// Causal attention and its backward in double (kernels/ops.h semantics; the gradients
// accumulate onto dq0, dk0, dv0).
Grads reference(const Shape& s, const Problem& p) {
  const int G = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HD));
  auto qi = [&](int b, int t, int h, int d) { return ((static_cast<size_t>(b) * s.T + t) * s.NH + h) * s.HD + d; };
  auto ki = [&](int b, int t, int h, int d) { return ((static_cast<size_t>(b) * s.T + t) * s.NKV + h) * s.HD + d; };
  std::vector<double> out(p.q.size(), 0.0), dq(p.dq0.begin(), p.dq0.end()), dk(p.dk0.begin(), p.dk0.end()),
      dv(p.dv0.begin(), p.dv0.end());
  std::vector<double> prob(s.T), dp(s.T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kv = h / G;
      for (int t = 0; t < s.T; ++t) {
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int d = 0; d < s.HD; ++d) dot += double(p.q[qi(b, t, h, d)]) * p.k[ki(b, j, kv, d)];
          prob[j] = dot * scale;
          mx = std::max(mx, prob[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += (prob[j] = std::exp(prob[j] - mx));
        for (int j = 0; j <= t; ++j) prob[j] /= sum;
        double pdp = 0.0;
        for (int j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int d = 0; d < s.HD; ++d) {
            out[qi(b, t, h, d)] += prob[j] * p.v[ki(b, j, kv, d)];
            dv[ki(b, j, kv, d)] += prob[j] * p.dout[qi(b, t, h, d)];
            dot += double(p.dout[qi(b, t, h, d)]) * p.v[ki(b, j, kv, d)];
          }
          dp[j] = dot;
          pdp += prob[j] * dot;
        }
        for (int j = 0; j <= t; ++j) {
          const double ds = prob[j] * (dp[j] - pdp) * scale;
          for (int d = 0; d < s.HD; ++d) {
            dq[qi(b, t, h, d)] += ds * p.k[ki(b, j, kv, d)];
            dk[ki(b, j, kv, d)] += ds * p.q[qi(b, t, h, d)];
          }
        }
      }
    }
  }
  auto to_float = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  return {to_float(out), to_float(dq), to_float(dk), to_float(dv)};
}

// The Ops for `path` ("plain" or "cudnn"), or null with the reason in *why.
std::unique_ptr<Ops> cuda_ops_for(const char* path, std::string* why) {
  setenv("TRIDENT_ATTENTION", path, 1);
  auto ops = make_ops(DeviceKind::kCuda, 0, 1);
  unsetenv("TRIDENT_ATTENTION");
  if (!ops.is_ok()) {
    *why = ops.status().message();
    return nullptr;
  }
  return std::move(ops).value();
}

// One forward and one backward through `ops`; with `only`, the backward asks for that
// one gradient ('q', 'k' or 'v') and passes null for the others (they keep dq0..). The
// state is sized for `sized_for` (default: s itself); *tag receives its first byte (the
// path that ran).
Grads run_on_device(Ops& ops, const Shape& s, DType dt, const Problem& p, char only = 0,
                    const Shape* sized_for = nullptr, char* tag = nullptr) {
  auto buffer = [&](const std::vector<float>& host) {
    DeviceBuffer b(ops, host.size() * dtype_size(dt));
    ops.upload_floats(b.as(dt), host.data(), host.size());
    return b;
  };
  DeviceBuffer q = buffer(p.q), k = buffer(p.k), v = buffer(p.v), dout = buffer(p.dout);
  DeviceBuffer dq = buffer(p.dq0), dk = buffer(p.dk0), dv = buffer(p.dv0);
  DeviceBuffer out(ops, p.q.size() * dtype_size(dt));
  const Shape& z = sized_for != nullptr ? *sized_for : s;
  DeviceBuffer state(ops, ops.attention_state_bytes(z.B, z.T, z.NH, z.NKV, z.HD, dt));
  ops.attention_forward(out.as(dt), state.get(), q.as(dt), k.as(dt), v.as(dt), s.B, s.T, s.NH, s.NKV, s.HD);
  if (tag != nullptr) ops.download(tag, state.get(), 1);
  auto wanted = [&](const DeviceBuffer& b, char which) { return only == 0 || only == which ? b.as(dt) : DevPtr(); };
  ops.attention_backward(wanted(dq, 'q'), wanted(dk, 'k'), wanted(dv, 'v'), dout.as(dt), out.as(dt), state.get(),
                         q.as(dt), k.as(dt), v.as(dt), s.B, s.T, s.NH, s.NKV, s.HD);
  Grads g;
  auto fetch = [&](const DeviceBuffer& b, size_t n) {
    std::vector<float> host(n);
    ops.download_floats(host.data(), b.as(dt), n);
    return host;
  };
  g.out = fetch(out, p.q.size());
  g.dq = fetch(dq, p.dq0.size());
  g.dk = fetch(dk, p.dk0.size());
  g.dv = fetch(dv, p.dv0.size());
  return g;
}

// max |a - b| / max(1, max |b|).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0.0, mag = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(double(b[i])));
  }
  return err / mag;
}

void expect_close(const Grads& got, const Grads& want, double tol, const std::string& what) {
  EXPECT_LT(rel_err(got.out, want.out), tol) << what << ": out";
  EXPECT_LT(rel_err(got.dq, want.dq), tol) << what << ": dq";
  EXPECT_LT(rel_err(got.dk, want.dk), tol) << what << ": dk";
  EXPECT_LT(rel_err(got.dv, want.dv), tol) << what << ": dv";
}

// Odd T (cuDNN 9.16 and newer only), then T = 128 and 256, MHA and GQA (every version).
const Shape kShapes[] = {{2, 7, 4, 2, 16},    {2, 33, 4, 2, 64},  {2, 33, 4, 4, 16},
                         {2, 7, 4, 1, 64},    {2, 128, 4, 4, 64}, {2, 128, 4, 2, 64},
                         {1, 256, 4, 4, 64},  {1, 256, 8, 2, 64}};

cuda::AttentionShape bf16_shape(const Shape& s) { return {s.B, s.T, s.NH, s.NKV, s.HD, DType::kBF16}; }

TEST(AttentionGpu, PlainPathMatchesADoubleReference) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  std::string why;
  std::unique_ptr<Ops> ops = cuda_ops_for("plain", &why);
  if (!ops) GTEST_SKIP() << "no CUDA Ops: " << why;
  for (const Shape& s : kShapes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Problem p = make_problem(s, dt == DType::kBF16, 7);
      const Grads want = reference(s, p);
      const Grads got = run_on_device(*ops, s, dt, p);
      // f32: fp32 GEMMs (no TF32) and softmax; bf16: P, dS and the outputs rounded.
      expect_close(got, want, dt == DType::kF32 ? 1e-4 : 3e-2, "plain " + str(s, dt));
    }
  }
  // One gradient at a time (the others null): each is still right, the others untouched.
  const Shape s = kShapes[1];
  const Problem p = make_problem(s, false, 9);
  const Grads want = reference(s, p);
  for (char only : {'q', 'k', 'v'}) {
    const Grads got = run_on_device(*ops, s, DType::kF32, p, only);
    const std::string what = std::string("plain, only d") + only + " " + str(s, DType::kF32);
    EXPECT_LT(rel_err(got.dq, only == 'q' ? want.dq : p.dq0), 1e-4) << what << ": dq";
    EXPECT_LT(rel_err(got.dk, only == 'k' ? want.dk : p.dk0), 1e-4) << what << ": dk";
    EXPECT_LT(rel_err(got.dv, only == 'v' ? want.dv : p.dv0), 1e-4) << what << ": dv";
  }
}

TEST(AttentionGpu, CudnnPathMatchesThePlainPathInBf16) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  std::string why;
  std::unique_ptr<Ops> plain = cuda_ops_for("plain", &why);
  if (!plain) GTEST_SKIP() << "no CUDA Ops: " << why;
  std::unique_ptr<Ops> cudnn = cuda_ops_for("cudnn", &why);
  ASSERT_TRUE(cudnn) << why;
  int compared = 0;
  std::string skipped;
  for (const Shape& s : kShapes) {
    const Status supported = cuda::cudnn_runtime_support(bf16_shape(s), cudnnGetVersion());
    if (!supported.is_ok()) {  // this runtime's rule, not a defect: say so, compare the rest
      skipped += "\n  " + supported.message();
      continue;
    }
    // The path must have plans on this GPU; else the Ops would fall back and this
    // comparison would be plain against plain. (Only built here, nothing executed, so
    // the stream does not matter.)
    auto made = cuda::make_cudnn_attention(*cudnn, nullptr, bf16_shape(s));
    EXPECT_TRUE(made.is_ok()) << str(s, DType::kBF16) << ": " << made.status().message();
    if (!made.is_ok()) continue;
    const Problem p = make_problem(s, true, 11);
    const Grads want = reference(s, p);
    const Grads ref = run_on_device(*plain, s, DType::kBF16, p);
    char tag = 0;
    const Grads got = run_on_device(*cudnn, s, DType::kBF16, p, 0, nullptr, &tag);
    EXPECT_EQ(tag, 'C') << str(s, DType::kBF16) << ": the state was not written by the cuDNN path";
    EXPECT_NE(got.out, ref.out) << "bitwise equal to the plain path: is the cuDNN path in use?";
    expect_close(got, want, 3e-2, "cudnn vs reference " + str(s, DType::kBF16));
    expect_close(got, ref, 3e-2, "cudnn vs plain " + str(s, DType::kBF16));
    ++compared;
  }
  if (!skipped.empty()) {
    std::printf("cuDNN %zu cannot serve these shapes (skipped):%s\n", cudnnGetVersion(), skipped.c_str());
  }
  EXPECT_GT(compared, 0) << "no shape compared under cuDNN " << cudnnGetVersion();
}

// The cuDNN plans at the shapes the GPU check benchmarks (GPT-2 124M and 350M at B16 T1024,
// the ~1B Llama at B8 T2048 with 8 KV heads): each is built (forward and backward graphs,
// execution plans), and its plan time, workspace and state are printed, so the first GPU
// run says before the benchmark whether and how cuDNN serves them. Nothing is executed.
TEST(AttentionGpu, CudnnPlansAtTheBenchmarkShapes) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  std::string why;
  std::unique_ptr<Ops> cudnn = cuda_ops_for("cudnn", &why);
  if (!cudnn) GTEST_SKIP() << "no CUDA Ops: " << why;
  const Shape shapes[] = {{16, 1024, 12, 12, 64}, {16, 1024, 16, 16, 64}, {8, 2048, 32, 8, 64}};
  for (const Shape& s : shapes) {
    const cuda::AttentionShape shape = bf16_shape(s);
    const Status supported = cuda::cudnn_runtime_support(shape, cudnnGetVersion());
    EXPECT_TRUE(supported.is_ok()) << str(s, DType::kBF16) << ": " << supported.message();
    if (!supported.is_ok()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    auto made = cuda::make_cudnn_attention(*cudnn, nullptr, shape);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(made.is_ok()) << str(s, DType::kBF16) << ": " << made.status().message();
    if (!made.is_ok()) continue;
    std::printf("cuDNN %zu plans for %s: %.1f ms, workspace %zu bytes, state %zu bytes\n",
                cudnnGetVersion(), str(s, DType::kBF16).c_str(), ms,
                (*made)->workspace_bytes(shape), cuda::cudnn_attention_state_bytes(shape));
  }
}

// With bf16 and no TRIDENT_ATTENTION the Ops runs cuDNN where it has a plan: the default.
TEST(AttentionGpu, CudnnIsTheBf16Default) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  auto ops = make_ops(DeviceKind::kCuda, 0, 1);
  ASSERT_TRUE(ops.is_ok()) << ops.status().message();
  const Shape s{2, 128, 4, 2, 64};
  const Problem p = make_problem(s, true, 13);
  char tag = 0;
  const Grads got = run_on_device(**ops, s, DType::kBF16, p, 0, nullptr, &tag);
  EXPECT_EQ(tag, 'C') << "bf16 B=2 T=128 did not run cuDNN (cuDNN " << cudnnGetVersion() << ")";
  expect_close(got, reference(s, p), 3e-2, "default bf16 " + str(s, DType::kBF16));
  const Problem p32 = make_problem(s, false, 13);
  const Grads f32 = run_on_device(**ops, s, DType::kF32, p32, 0, nullptr, &tag);
  EXPECT_EQ(tag, 'P') << "f32 runs the plain path";
  expect_close(f32, reference(s, p32), 1e-4, "default f32 " + str(s, DType::kF32));
}

// A shape cuDNN rejects (T = 1, as in generation) runs plain even with cudnn forced:
// asked for, it keeps its probabilities ('P'); first seen at a call into a buffer sized
// for a larger cuDNN shape, it recomputes them in backward ('R'). Both match the
// reference, and nothing aborts.
TEST(AttentionGpu, ShapesCudnnRejectsFallBackToPlain) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  std::string why;
  std::unique_ptr<Ops> ops = cuda_ops_for("cudnn", &why);
  if (!ops) GTEST_SKIP() << "no CUDA Ops: " << why;
  const Shape one{2, 1, 4, 2, 64}, larger{2, 128, 4, 2, 64};
  const Problem p = make_problem(one, true, 17);
  const Grads want = reference(one, p);
  char tag = 0;
  const Grads asked = run_on_device(*ops, one, DType::kBF16, p, 0, nullptr, &tag);
  EXPECT_EQ(tag, 'P');
  expect_close(asked, want, 3e-2, "T=1 asked " + str(one, DType::kBF16));
  std::unique_ptr<Ops> fresh = cuda_ops_for("cudnn", &why);  // T=1 not yet seen there
  ASSERT_TRUE(fresh) << why;
  const Grads inside = run_on_device(*fresh, one, DType::kBF16, p, 0, &larger, &tag);
  EXPECT_EQ(tag, 'R');
  expect_close(inside, want, 3e-2, "T=1 in a T=128 state " + str(one, DType::kBF16));
}

// The memory plan's device figures.
TEST(AttentionGpu, DeviceMemoryIsReported) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  auto ops = make_ops(DeviceKind::kCuda, 0, 1);
  ASSERT_TRUE(ops.is_ok()) << ops.status().message();
  const auto m = (*ops)->device_memory();
  ASSERT_TRUE(m.has_value());
  EXPECT_GT(m->total_bytes, 0u);
  EXPECT_LE(m->free_bytes, m->total_bytes);
  EXPECT_EQ(m->pinned_host_bytes, cuda::kStagingBytes);
}

}  // namespace
}  // namespace trident
