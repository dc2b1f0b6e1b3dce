// GemmEngine: describe() for every matmul of the tiny and GPT-2 124M configs (host only,
// no device), its validation messages, and, on a GPU, run() against a double reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/attention_plain.h"
#include "kernels/cuda/gemm.h"

namespace trident::cuda {
namespace {

// The three GEMMs of one linear layer out[N, OC] = inp[N, IC] @ W[OC, IC]^T (+ bias), as
// the CUDA Ops runs them (kernels/ops.h matmul_forward / matmul_backward).
GemmDesc forward_desc(int N, int IC, int OC, DType dt, bool bias) {
  GemmDesc d;
  d.M = N;
  d.N = OC;
  d.K = IC;
  d.trans_b = true;
  d.ab_dtype = d.d_dtype = dt;
  d.bias = bias;
  return d;
}
GemmDesc dinp_desc(int N, int IC, int OC, DType dt) {  // dinp[N, IC] += dout @ W
  GemmDesc d;
  d.M = N;
  d.N = IC;
  d.K = OC;
  d.ab_dtype = d.d_dtype = dt;
  d.accumulate = true;
  return d;
}
GemmDesc dweight_desc(int N, int IC, int OC, DType dt) {  // dW[OC, IC] += dout^T @ inp (f32)
  GemmDesc d;
  d.M = OC;
  d.N = IC;
  d.K = N;
  d.trans_a = true;
  d.ab_dtype = dt;
  d.d_dtype = DType::kF32;
  d.accumulate = true;
  return d;
}

struct ModelShape {
  const char* name;
  int N, C, NH, NKV, F, Vp, B, T;
  bool gpt2;  // biases and a GELU MLP; else llama (SwiGLU, no biases, GQA)
};

// configs/tiny.yaml, configs/tiny_llama.yaml (micro-batch 8 x seq 128) and GPT-2 124M
// (B*T = 4*1024).
const ModelShape kModels[] = {
    {"tiny", 8 * 128, 128, 4, 4, 512, 256, 8, 128, true},
    {"tiny_llama", 8 * 128, 128, 4, 2, 352, 256, 8, 128, false},
    {"gpt2-124m", 4 * 1024, 768, 12, 12, 3072, 50304, 4, 1024, true},
};

TEST(GemmDescribe, EveryMatmulOfTheTinyAndGpt2Configs) {
  int described = 0;
  for (const ModelShape& m : kModels) {
    const int HD = m.C / m.NH;
    struct Linear {
      int IC, OC;
      bool bias;
    };
    std::vector<Linear> linears;
    if (m.gpt2) {
      linears = {{m.C, 3 * m.C, true}, {m.C, m.C, true}, {m.C, m.F, true}, {m.F, m.C, true}, {m.C, m.Vp, false}};
    } else {
      const int qkv = m.C + 2 * m.NKV * HD;
      linears = {{m.C, qkv, false}, {m.C, m.C, false}, {m.C, m.F, false},
                 {m.C, 2 * m.F, false}, {m.F, m.C, false}, {m.C, m.Vp, false}};
    }
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const Linear& l : linears) {
        for (const GemmDesc& d : {forward_desc(m.N, l.IC, l.OC, dt, l.bias), dinp_desc(m.N, l.IC, l.OC, dt),
                                  dweight_desc(m.N, l.IC, l.OC, dt)}) {
          Status s = GemmEngine::describe(d);
          EXPECT_TRUE(s.is_ok()) << m.name << ": " << s.message();
          ++described;
        }
      }
      // The plain attention path's batched GEMMs (and an odd T for its padded ld).
      for (int T : {m.T, 33}) {
        AttentionShape a{m.B, T, m.NH, m.NKV, HD, dt};
        const PlainAttentionGemms g = plain_attention_gemms(a);
        for (const GemmDesc& d : {g.scores, g.pv, g.grad_q, g.grad_kv}) {
          Status s = GemmEngine::describe(d);
          EXPECT_TRUE(s.is_ok()) << m.name << " attention T=" << T << ": " << s.message();
          EXPECT_GT(d.batch, 1);
          ++described;
        }
      }
    }
  }
  EXPECT_EQ(described, 2 * (3 * 5 + 8) + 2 * (3 * 5 + 8) + 2 * (3 * 6 + 8));
}

// Expects describe() to fail naming `needle` and the desc.
void expect_describe_fails(const GemmDesc& d, const std::string& needle) {
  Status s = GemmEngine::describe(d);
  ASSERT_FALSE(s.is_ok()) << d.str();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(d.str()), std::string::npos) << s.message();
}

TEST(GemmDescribe, RejectsBiasWithAccumulate) {
  GemmDesc d = dinp_desc(64, 32, 16, DType::kF32);
  d.bias = true;
  expect_describe_fails(d, "bias is only allowed without accumulate");
}

TEST(GemmDescribe, RejectsALeadingDimensionSmallerThanTheRow) {
  GemmDesc d = forward_desc(64, 32, 16, DType::kF32, false);
  d.lda = 16;  // A is [64, 32]
  expect_describe_fails(d, "lda=16 is smaller than the 32 columns");
  GemmDesc e = forward_desc(64, 32, 16, DType::kF32, false);
  e.ldd = 8;  // D is [64, 16]
  expect_describe_fails(e, "ldd=8 is smaller than the 16 columns");
}

TEST(GemmDescribe, RejectsZeroK) {
  expect_describe_fails(forward_desc(64, 0, 16, DType::kBF16, false), "M, N and K must be positive");
}

TEST(GemmDescribe, OddLeadingDimensionsAndBatchStridesAreAccepted) {
  // The op table's odd shapes: any leading dimension >= the row is a valid GEMM (the
  // algorithm is asked for the alignment the desc keeps, gemm.h).
  GemmDesc d = forward_desc(64, 8, 16, DType::kBF16, false);
  d.lda = 9;  // 18 bytes
  EXPECT_TRUE(GemmEngine::describe(d).is_ok()) << GemmEngine::describe(d).message();
  for (DType t : {DType::kF32, DType::kBF16}) {
    const GemmDesc packed = forward_desc(7, 5, 3, t, true);
    EXPECT_TRUE(GemmEngine::describe(packed).is_ok()) << GemmEngine::describe(packed).message();
  }
  GemmDesc batched = forward_desc(7, 5, 3, DType::kBF16, false);
  batched.batch = 3;
  batched.stride_a = 7 * 5;
  batched.stride_b = 3 * 5;
  batched.stride_d = 7 * 3;
  EXPECT_TRUE(GemmEngine::describe(batched).is_ok()) << GemmEngine::describe(batched).message();
}

TEST(GemmDescribe, RejectsF32InputsWithABf16Output) {
  GemmDesc d = forward_desc(64, 32, 16, DType::kF32, false);
  d.d_dtype = DType::kBF16;
  expect_describe_fails(d, "f32 inputs need an f32 D");
}

TEST(GemmDescribe, RejectsOverlappingBatches) {
  GemmDesc d = forward_desc(8, 16, 16, DType::kF32, false);
  d.batch = 2;
  d.stride_a = 8 * 16;
  d.stride_b = 16 * 16;
  d.stride_d = 16;  // < M * ldd = 128
  expect_describe_fails(d, "batches of D would overlap");
}

TEST(GemmDesc, StrNamesTheShapeAndFlags) {
  GemmDesc d = dweight_desc(7, 8, 16, DType::kBF16);
  EXPECT_EQ(d.str(), "M=16 N=8 K=7 ta bf16->f32 acc lda=0 ldb=0 ldd=0 batch=1");
}

TEST(GemmEngine, CreateWithoutADeviceSaysSo) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) GTEST_SKIP() << "a CUDA device is present";
  auto engine = GemmEngine::create(nullptr);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_NE(engine.status().message().find("cublasLtCreate failed"), std::string::npos)
      << engine.status().message();
}

// The bias pointer's alignment, which keys the algorithm cache (the heuristic reads it
// from the pointer): the largest power of two up to 256 dividing the address.
TEST(GemmAlignment, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  auto at = [](uintptr_t a) { return pointer_alignment(reinterpret_cast<const void*>(a)); };
  EXPECT_EQ(at(0), 256u);
  EXPECT_EQ(at(0x1000), 256u);
  EXPECT_EQ(at(0x1100), 256u);
  EXPECT_EQ(at(0x1080), 128u);
  EXPECT_EQ(at(0x1040), 64u);
  EXPECT_EQ(at(0x1020), 32u);  // a bf16 bias slice of the parameter layout (16 floats apart)
  EXPECT_EQ(at(0x1002), 2u);
  EXPECT_EQ(at(0x1001), 1u);
}

// No algorithm never aborts: the heuristic is asked with the alignment preferences, then
// without, then the simple kernel runs; each question only when the one before found none.
TEST(GemmRoute, FallsBackWithoutAlignmentThenToTheSimpleKernel) {
  std::vector<bool> asked;
  auto answers = [&](int with, int without) {
    asked.clear();
    return choose_gemm_route([&, with, without](bool prefs) {
      asked.push_back(prefs);
      return prefs ? with : without;
    });
  };
  EXPECT_EQ(answers(1, 1), GemmRoute::kAligned);
  EXPECT_EQ(asked, std::vector<bool>({true}));
  EXPECT_EQ(answers(0, 1), GemmRoute::kUnaligned);
  EXPECT_EQ(asked, std::vector<bool>({true, false}));
  EXPECT_EQ(answers(0, 0), GemmRoute::kSimple);
  EXPECT_EQ(asked, std::vector<bool>({true, false}));
}

// ---- GPU: run() against a double reference ---------------------------------------------

bool has_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

struct HostMatrix {
  int rows = 0, cols = 0;
  int64_t ld = 0;
  std::vector<float> v;  // values as the device holds them (bf16-rounded for bf16)
  float at(int r, int c) const { return v[static_cast<size_t>(r * ld + c)]; }
};

HostMatrix random_matrix(int rows, int cols, int64_t ld, bool bf16, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostMatrix m{rows, cols, ld, std::vector<float>(static_cast<size_t>(rows * ld), 0.0f)};
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float x = u(rng);
      m.v[static_cast<size_t>(r * ld + c)] = bf16 ? bf16_to_float(float_to_bf16(x)) : x;
    }
  }
  return m;
}

void* upload(const std::vector<float>& v, DType dt) {
  void* p = nullptr;
  const size_t n = v.size();
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * dtype_size(dt)), cudaSuccess);
  if (dt == DType::kF32) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    std::vector<bf16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(v[i]);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return p;
}

std::vector<float> download(void* p, size_t n, DType dt) {
  std::vector<float> out(n);
  if (dt == DType::kF32) {
    EXPECT_EQ(cudaMemcpy(out.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  } else {
    std::vector<bf16_t> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
  }
  return out;
}

int64_t ld8(int cols) { return (cols + 7) / 8 * 8; }  // aligned for both dtypes

struct Case {
  int M, N, K;
  bool ta, tb;
  DType ab, d;
  bool bias, acc;
  int batch = 1;  // > 1: matrices one after another (batch strides = rows * ld)
  float alpha = 1.0f;
};

void run_case(GemmEngine& engine, const Case& c, std::mt19937& rng) {
  const bool bf16_in = c.ab == DType::kBF16, bf16_out = c.d == DType::kBF16;
  const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K;
  const int br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
  // The batch entries stacked as one tall matrix each (entry i at rows i*rows..).
  HostMatrix A = random_matrix(ar * c.batch, ac, ld8(ac), bf16_in, rng);
  HostMatrix Bm = random_matrix(br * c.batch, bc, ld8(bc), bf16_in, rng);
  HostMatrix D0 = random_matrix(c.M * c.batch, c.N, ld8(c.N), bf16_out, rng);
  HostMatrix bias = random_matrix(1, c.N, c.N, bf16_out, rng);
  GemmDesc d;
  d.M = c.M;
  d.N = c.N;
  d.K = c.K;
  d.trans_a = c.ta;
  d.trans_b = c.tb;
  d.ab_dtype = c.ab;
  d.d_dtype = c.d;
  d.bias = c.bias;
  d.accumulate = c.acc;
  d.lda = A.ld;
  d.ldb = Bm.ld;
  d.ldd = D0.ld;
  d.alpha = c.alpha;
  d.batch = c.batch;
  if (c.batch > 1) {
    d.stride_a = ar * A.ld;
    d.stride_b = br * Bm.ld;
    d.stride_d = c.M * D0.ld;
  }
  ASSERT_TRUE(GemmEngine::describe(d).is_ok()) << GemmEngine::describe(d).message();
  void* a = upload(A.v, c.ab);
  void* b = upload(Bm.v, c.ab);
  void* dd = upload(D0.v, c.d);
  void* bb = c.bias ? upload(bias.v, c.d) : nullptr;
  engine.run(d, DevPtr::wrap(a, c.ab), DevPtr::wrap(b, c.ab), DevPtr::wrap(dd, c.d),
             c.bias ? DevPtr::wrap(bb, c.d) : DevPtr());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got = download(dd, D0.v.size(), c.d);
  double max_err = 0.0;
  for (int e = 0; e < c.batch; ++e) {
    for (int i = 0; i < c.M; ++i) {
      for (int j = 0; j < c.N; ++j) {
        double ref = 0.0;
        for (int k = 0; k < c.K; ++k) {
          const double x = c.ta ? A.at(e * ar + k, i) : A.at(e * ar + i, k);
          const double y = c.tb ? Bm.at(e * br + j, k) : Bm.at(e * br + k, j);
          ref += x * y;
        }
        ref *= c.alpha;
        if (c.acc) ref += D0.at(e * c.M + i, j);
        if (c.bias) ref += bias.at(0, j);
        const double err =
            std::fabs(got[static_cast<size_t>((e * c.M + i) * D0.ld + j)] - ref) / (1.0 + std::fabs(ref));
        max_err = std::max(max_err, err);
      }
    }
  }
  // f32 (no TF32): fp32 accumulation error only; bf16 output: one rounding (2^-8).
  const double tol = bf16_out ? 8e-3 : 1e-5 * std::sqrt(static_cast<double>(c.K));
  EXPECT_LT(max_err, tol) << d.str();
  for (void* p : {a, b, dd, bb}) cudaFree(p);
}

TEST(GemmEngineGpu, MatchesADoubleReferenceOnOddShapes) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  auto engine = GemmEngine::create(stream);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  std::mt19937 rng(1234);
  int cases = 0;
  for (auto [M, N, K] : {std::tuple{3, 5, 7}, std::tuple{257, 129, 65}}) {
    for (DType ab : {DType::kF32, DType::kBF16}) {
      for (DType dd : {DType::kF32, DType::kBF16}) {
        if (ab == DType::kF32 && dd == DType::kBF16) continue;
        for (int flags = 0; flags < 4; ++flags) {
          const bool ta = flags & 1, tb = flags & 2;
          run_case(**engine, {M, N, K, ta, tb, ab, dd, false, false}, rng);
          run_case(**engine, {M, N, K, ta, tb, ab, dd, true, false}, rng);
          run_case(**engine, {M, N, K, ta, tb, ab, dd, false, true}, rng);
          cases += 3;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 3 * 4 * 3);
  engine->reset();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

// The last-resort route (cuBLASLt offers no algorithm): simple_gemm with the desc's
// leading dimensions, batch strides and alpha, against the same reference; and the
// batched, scaled descs through cuBLASLt too.
TEST(GemmEngineGpu, SimpleFallbackMatchesADoubleReference) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  auto simple = GemmEngine::create(stream, size_t{32} << 20, /*simple_only=*/true);
  ASSERT_TRUE(simple.is_ok()) << simple.status().message();
  auto lt = GemmEngine::create(stream);
  ASSERT_TRUE(lt.is_ok()) << lt.status().message();
  std::mt19937 rng(4321);
  for (GemmEngine* engine : {simple->get(), lt->get()}) {
    for (DType ab : {DType::kF32, DType::kBF16}) {
      for (int flags = 0; flags < 4; ++flags) {
        const bool ta = flags & 1, tb = flags & 2;
        run_case(*engine, {33, 17, 9, ta, tb, ab, ab, true, false}, rng);
        run_case(*engine, {33, 17, 9, ta, tb, ab, DType::kF32, false, true, 3, 0.5f}, rng);
        run_case(*engine, {24, 16, 40, ta, tb, ab, ab, false, false, 2, 0.125f}, rng);
      }
    }
  }
  simple->reset();
  lt->reset();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace trident::cuda
