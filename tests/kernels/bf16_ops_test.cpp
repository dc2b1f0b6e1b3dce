// bf16 storage on the CPU backend (kernels/ops.h "Dtypes" and "Precision"): every op with
// F arguments, called with some or all of them bf16, must give exactly the fp32 op on the
// same (bf16-representable) values followed by one round-to-nearest-even of each bf16
// output; f32 outputs (statistics, parameter gradients) must be bitwise the fp32 ones.
// Also: AdamW's bf16 compute copy, sum_squares over bf16, the dtype checks (death tests
// naming op and argument) and the allocation counts. cast (ties to even both ways, NaN,
// infinities, exact widening and copies): the op table's cast entries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/checked_memory.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

using VecH = std::vector<bf16_t>;

// Random values that bf16 represents exactly (so f32 and bf16 runs see the same inputs).
VecF bf16_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  VecF v = random_vec(n, seed, lo, hi);
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

bool representable(float x) { return bf16_to_float(float_to_bf16(x)) == x; }

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// The device arguments of one op call. F arguments take the dtype the policy gives their
// index (in call order); fixed ones the dtype they name. Afterwards values() reads every
// float argument back (bf16 widened).
class Args {
 public:
  Args(Ops& ops, std::function<DType(int)> policy) : ops_(ops), policy_(std::move(policy)) {}
  Ops& ops() { return ops_; }

  // An F argument with initial values `init` (bf16-representable).
  DevPtr f(const std::string& name, const VecF& init) {
    const DType dtype = policy_(next_f_++);
    for (float x : init) {
      if (!representable(x)) {
        ADD_FAILURE() << name << ": initial value " << x << " is not bf16-representable";
        break;
      }
    }
    return add(name, dtype, init);
  }
  DevPtr f32(const std::string& name, const VecF& init) { return add(name, DType::kF32, init); }
  DevPtr i32(const std::vector<int32_t>& values) {
    Entry& e = entries_.emplace_back(
        Entry{"(i32)", DType::kI32, values.size(), DeviceBuffer(ops_, values.size() * 4)});
    ops_.upload(e.buf.get(), values.data(), values.size() * 4);
    return e.buf.as(DType::kI32);
  }
  DevPtr bytes(size_t n) {
    Entry& e = entries_.emplace_back(Entry{"(u8)", DType::kU8, n, DeviceBuffer(ops_, n)});
    return e.buf.get();
  }

  struct Value {
    DType dtype;
    VecF values;
  };
  // name -> (dtype, values) of every f32 / bf16 argument.
  std::vector<std::pair<std::string, Value>> values() {
    std::vector<std::pair<std::string, Value>> out;
    for (Entry& e : entries_) {
      if (e.dtype != DType::kF32 && e.dtype != DType::kBF16) continue;
      VecF v(e.n);
      if (e.dtype == DType::kF32) {
        ops_.download(v.data(), e.buf.get(), e.n * 4);
      } else {
        VecH h(e.n);
        ops_.download(h.data(), e.buf.get(), e.n * 2);
        for (size_t i = 0; i < e.n; ++i) v[i] = bf16_to_float(h[i]);
      }
      out.push_back({e.name, Value{e.dtype, std::move(v)}});
    }
    return out;
  }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    size_t n;
    DeviceBuffer buf;
  };
  DevPtr add(const std::string& name, DType dtype, const VecF& init) {
    Entry& e = entries_.emplace_back(
        Entry{name, dtype, init.size(), DeviceBuffer(ops_, init.size() * dtype_size(dtype))});
    if (dtype == DType::kF32) {
      ops_.upload(e.buf.get(), init.data(), init.size() * 4);
    } else {
      VecH h(init.size());
      for (size_t i = 0; i < init.size(); ++i) h[i] = float_to_bf16(init[i]);
      ops_.upload(e.buf.get(), h.data(), h.size() * 2);
    }
    return e.buf.as(dtype);
  }

  Ops& ops_;
  std::function<DType(int)> policy_;
  int next_f_ = 0;
  std::vector<Entry> entries_;  // stable addresses not needed: buffers own device memory
};

// Runs `call` with every F argument f32 (the reference), then all bf16 and two mixes,
// and checks the storage contract on every argument. Returns how many elements of the
// all-bf16 run's outputs were changed by rounding (part (b): > 0 for every op).
size_t check_storage_contract(const std::function<void(Args&)>& call, const std::string& op) {
  auto ops = make_cpu_ops(2);
  Args ref(*ops, [](int) { return DType::kF32; });
  call(ref);
  const auto want = ref.values();
  size_t rounded = 0;
  const std::vector<std::pair<std::string, std::function<DType(int)>>> policies = {
      {"all bf16", [](int) { return DType::kBF16; }},
      {"even bf16", [](int i) { return i % 2 == 0 ? DType::kBF16 : DType::kF32; }},
      {"odd bf16", [](int i) { return i % 2 == 1 ? DType::kBF16 : DType::kF32; }},
  };
  for (const auto& [policy_name, policy] : policies) {
    Args run(*ops, policy);
    call(run);
    const auto got = run.values();
    EXPECT_EQ(got.size(), want.size());
    for (size_t a = 0; a < got.size() && a < want.size(); ++a) {
      const std::string what = op + " (" + policy_name + ") " + got[a].first;
      const VecF& g = got[a].second.values;
      const VecF& w = want[a].second.values;
      if (g.size() != w.size()) {
        ADD_FAILURE() << what << ": " << g.size() << " values, want " << w.size();
        continue;
      }
      const bool bf16 = got[a].second.dtype == DType::kBF16;
      int bad = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        const float expected = bf16 ? bf16_to_float(float_to_bf16(w[i])) : w[i];
        if (bits(g[i]) != bits(expected) && ++bad <= 3) {
          ADD_FAILURE() << what << "[" << i << "]: got " << g[i] << " want " << expected
                        << " (fp32 " << w[i] << ")";
        }
        if (bf16 && policy_name == "all bf16" && g[i] != w[i]) ++rounded;
      }
      EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " differ";
    }
  }
  return rounded;
}

constexpr int N = 19, C = 24, IC = 24, OC = 17;

TEST(CpuBf16, MatmulForward) {
  const VecF x = bf16_vec(N * IC, 1), w = bf16_vec(OC * IC, 2), b = bf16_vec(OC, 3);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  DevPtr out = a.f("out", VecF(N * OC, 0.0f));
                  DevPtr inp = a.f("inp", x), weight = a.f("weight", w), bias = a.f("bias", b);
                  a.ops().matmul_forward(out, inp, weight, bias, N, IC, OC);
                },
                "matmul_forward"),
            0u);
}

TEST(CpuBf16, MatmulBackwardAccumulates) {
  const VecF x = bf16_vec(N * IC, 4), w = bf16_vec(OC * IC, 5), dout = bf16_vec(N * OC, 6);
  const VecF dinp0 = bf16_vec(N * IC, 7), dw0 = random_vec(OC * IC, 8), db0 = random_vec(OC, 9);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  DevPtr dinp = a.f("dinp", dinp0);
                  DevPtr dweight = a.f32("dweight", dw0), dbias = a.f32("dbias", db0);
                  DevPtr g = a.f("dout", dout), inp = a.f("inp", x), weight = a.f("weight", w);
                  a.ops().matmul_backward(dinp, dweight, dbias, g, inp, weight, N, IC, OC);
                },
                "matmul_backward"),
            0u);
}

TEST(CpuBf16, LayerNormForwardAndBackward) {
  const VecF x = bf16_vec(N * C, 10, -2, 2), w = bf16_vec(C, 11), b = bf16_vec(C, 12);
  const VecF dout = bf16_vec(N * C, 13), dx0 = bf16_vec(N * C, 14);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  DevPtr out = a.f("out", VecF(N * C, 0.0f));
                  DevPtr mean = a.f32("mean", VecF(N)), rstd = a.f32("rstd", VecF(N));
                  DevPtr inp = a.f("inp", x), weight = a.f("weight", w), bias = a.f("bias", b);
                  a.ops().layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, 1e-5f);
                  DevPtr dinp = a.f("dinp", dx0), g = a.f("dout", dout);
                  DevPtr dweight = a.f32("dweight", VecF(C)), dbias = a.f32("dbias", VecF(C));
                  a.ops().layernorm_backward(dinp, dweight, dbias, g, inp, weight, mean, rstd, N,
                                             C);
                },
                "layernorm"),
            0u);
}

TEST(CpuBf16, RmsNormForwardAndBackward) {
  const VecF x = bf16_vec(N * C, 15, -2, 2), w = bf16_vec(C, 16);
  const VecF dout = bf16_vec(N * C, 17), dx0 = bf16_vec(N * C, 18);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  DevPtr out = a.f("out", VecF(N * C, 0.0f));
                  DevPtr rstd = a.f32("rstd", VecF(N));
                  DevPtr inp = a.f("inp", x), weight = a.f("weight", w);
                  a.ops().rmsnorm_forward(out, rstd, inp, weight, N, C, 1e-5f);
                  DevPtr dinp = a.f("dinp", dx0), g = a.f("dout", dout);
                  DevPtr dweight = a.f32("dweight", VecF(C));
                  a.ops().rmsnorm_backward(dinp, dweight, g, inp, weight, rstd, N, C);
                },
                "rmsnorm"),
            0u);
}

TEST(CpuBf16, AttentionAndRope) {
  constexpr int B = 2, T = 9, NH = 4, NKV = 2, HD = 8;
  const size_t nq = size_t{B} * T * NH * HD, nkv = size_t{B} * T * NKV * HD;
  const VecF q0 = bf16_vec(nq, 20), k0 = bf16_vec(nkv, 21), v0 = bf16_vec(nkv, 22);
  const VecF dout = bf16_vec(nq, 23), dq0 = bf16_vec(nq, 24), dk0 = bf16_vec(nkv, 25);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  Ops& ops = a.ops();
                  DevPtr q = a.f("q", q0), k = a.f("k", k0);
                  ops.rope_forward(q, B, T, NH, HD, 10000.0f, 3);
                  ops.rope_forward(k, B, T, NKV, HD, 10000.0f, 3);
                  // q and k now hold rounded results; attention gets fresh inputs, which
                  // both runs see alike.
                  DevPtr qa = a.f("qa", q0), ka = a.f("ka", k0), va = a.f("va", v0);
                  DevPtr out = a.f("out", VecF(nq, 0.0f));
                  DevPtr state = a.bytes(ops.attention_state_bytes(B, T, NH, NKV, HD, qa.dtype()));
                  ops.attention_forward(out, state, qa, ka, va, B, T, NH, NKV, HD);
                  DevPtr dq = a.f("dq", dq0), dk = a.f("dk", dk0), dv = a.f("dv", VecF(nkv));
                  DevPtr g = a.f("dout", dout);
                  ops.attention_backward(dq, dk, dv, g, out, state, qa, ka, va, B, T, NH, NKV, HD);
                  DevPtr dx = a.f("rope dx", dq0);
                  ops.rope_backward(dx, B, T, NH, HD, 10000.0f, 3);
                },
                "attention"),
            0u);
}

TEST(CpuBf16, GeluAndSwigluAndPointwise) {
  const size_t n = 40000;  // several blocks, parallel
  const VecF x = bf16_vec(n, 30, -3, 3), y = bf16_vec(n, 31, -3, 3), g = bf16_vec(n, 32);
  const VecF d0 = bf16_vec(n, 33), d1 = bf16_vec(n, 34);
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  Ops& ops = a.ops();
                  DevPtr out = a.f("gelu out", VecF(n)), inp = a.f("inp", x);
                  ops.gelu_forward(out, inp, n);
                  DevPtr dinp = a.f("gelu dinp", d0), dout = a.f("dout", g);
                  ops.gelu_backward(dinp, dout, inp, n);
                  DevPtr sout = a.f("swiglu out", VecF(n)), up = a.f("up", y);
                  ops.swiglu_forward(sout, inp, up, n);
                  DevPtr dgate = a.f("dgate", d0), dup = a.f("dup", d1);
                  ops.swiglu_backward(dgate, dup, dout, inp, up, n);
                  DevPtr sum = a.f("add out", VecF(n));
                  ops.add(sum, inp, up, n);
                  DevPtr acc = a.f("accumulate dst", d1);
                  ops.accumulate(acc, dout, n);
                  DevPtr scaled = a.f("scale x", d0);
                  ops.scale(scaled, 0.3f, n);
                },
                "pointwise"),
            0u);
}

TEST(CpuBf16, CrossEntropyForwardAndInPlaceBackward) {
  constexpr int V = 37, Vp = 40;
  const VecF logits0 = bf16_vec(N * Vp, 40, -4, 4);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 5) % V;
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  Ops& ops = a.ops();
                  DevPtr logits = a.f("logits", logits0), tgt = a.i32(targets);
                  DevPtr losses = a.f32("losses", VecF(N));
                  ops.cross_entropy_forward(losses, logits, tgt, N, V, Vp);
                  DevPtr d = a.f("dlogits", VecF(N * Vp, 0.0f));
                  ops.cross_entropy_backward(d, logits, tgt, 0.7f, N, V, Vp);
                  ops.cross_entropy_backward(logits, logits, tgt, 0.7f, N, V, Vp);  // in place
                  // Vocab-parallel steps on the (now gradient) logits: fresh inputs again.
                  DevPtr l2 = a.f("logits2", logits0);
                  DevPtr row_max = a.f32("row_max", VecF(N)), se = a.f32("sum_exp", VecF(N));
                  DevPtr tl = a.f32("target_logit", VecF(N));
                  ops.xent_local_max(row_max, l2, N, Vp, 0, V);
                  ops.xent_local_sums(se, tl, l2, row_max, tgt, N, Vp, 0, V);
                  DevPtr d2 = a.f("xent dlogits", VecF(N * Vp, 0.0f));
                  ops.xent_local_backward(d2, l2, row_max, se, tgt, 0.7f, N, Vp, 0, V);
                },
                "cross_entropy"),
            0u);
}

TEST(CpuBf16, Embedding) {
  constexpr int B = 3, T = 5, V = 11;
  const VecF wte0 = bf16_vec(V * C, 50), wpe0 = bf16_vec(T * C, 51);
  const VecF dout = bf16_vec(B * T * C, 52);
  std::vector<int32_t> tokens(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 7 + 3) % V;
  EXPECT_GT(check_storage_contract(
                [&](Args& a) {
                  Ops& ops = a.ops();
                  DevPtr out = a.f("out", VecF(B * T * C));
                  DevPtr tok = a.i32(tokens), wte = a.f("wte", wte0), wpe = a.f("wpe", wpe0);
                  ops.embedding_forward(out, tok, wte, wpe, B, T, C, 0, V);
                  DevPtr dwte = a.f32("dwte", VecF(V * C)), dwpe = a.f32("dwpe", VecF(T * C));
                  DevPtr g = a.f("dout", dout);
                  ops.embedding_backward(dwte, dwpe, g, tok, B, T, C, 0, V);
                },
                "embedding"),
            0u);
}

// AdamW on the f32 masters is unchanged by a compute copy, which is bf16(param) bitwise.
TEST(CpuBf16, AdamWWritesTheRoundedComputeCopy) {
  auto ops = make_cpu_ops(2);
  const size_t n = 40001;
  const VecF param0 = random_vec(n, 60), grad = random_vec(n, 61);
  AdamWParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  VecF param_a = param0, m_a(n), v_a(n), param_b = param0, m_b(n), v_b(n);
  VecH copy(n, 0x7fc0);  // garbage, overwritten
  for (int step = 1; step <= 2; ++step) {
    p.step = step;
    ops->adamw_update(dev(*ops, param_a), dev(*ops, grad), dev(*ops, m_a), dev(*ops, v_a), DevPtr(),
                      n, p);
    ops->adamw_update(dev(*ops, param_b), dev(*ops, grad), dev(*ops, m_b), dev(*ops, v_b),
                      dev(*ops, copy), n, p);
  }
  EXPECT_EQ(std::memcmp(param_a.data(), param_b.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m_a.data(), m_b.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(v_a.data(), v_b.data(), n * 4), 0);
  size_t changed = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(copy[i], float_to_bf16(param_b[i])) << i;
    changed += bf16_to_float(copy[i]) != param_b[i];
  }
  EXPECT_GT(changed, n / 2);  // really rounded, not a copy of fp32 bits that happen to fit
}

TEST(CpuBf16, SumSquaresOfBf16IsTheSumOfTheWidenedValues) {
  auto ops = make_cpu_ops(2);
  const size_t n = 50003;
  const VecF x = bf16_vec(n, 80, -3, 3);
  VecH h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(x[i]);
  const double want = ops->sum_squares(dev(*ops, x), n);
  EXPECT_GT(want, 0.0);
  EXPECT_EQ(ops->sum_squares(dev(*ops, h), n), want);
}

// A wrong dtype is a programming error: CHECK-fail naming the op and the argument.
TEST(CpuBf16DeathTest, WrongDtypeNamesOpAndArgument) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto ops = make_cpu_ops(1);
  DeviceBuffer buf(*ops, 4096);
  const DevPtr f = buf.as(DType::kF32), i = buf.as(DType::kI32), h = buf.as(DType::kBF16);
  EXPECT_DEATH(ops->matmul_forward(f, f, i, DevPtr(), 2, 2, 2),
               "cpu matmul_forward: argument weight has dtype i32, want f32 or bf16");
  EXPECT_DEATH(ops->layernorm_forward(f, h, f, f, f, DevPtr(), 2, 2, 1e-5f),
               "cpu layernorm_forward: argument mean has dtype bf16, want f32");
  EXPECT_DEATH(ops->embedding_forward(f, f, f, DevPtr(), 1, 1, 2, 0, 1),
               "cpu embedding_forward: argument tokens has dtype f32, want i32");
  EXPECT_DEATH(ops->attention_forward(f, f, f, f, f, 1, 1, 1, 1, 2),
               "cpu attention_forward: argument state has dtype f32, want u8");
  EXPECT_DEATH(ops->matmul_backward(f, h, DevPtr(), f, f, f, 2, 2, 2),
               "cpu matmul_backward: argument dweight has dtype bf16, want f32");
  EXPECT_DEATH(ops->adamw_update(f, f, f, f, f, 4, AdamWParams{}),
               "cpu adamw_update: argument compute_copy has dtype f32, want bf16");
  EXPECT_DEATH(ops->sum_squares_accumulate(f, f, 4),
               "cpu sum_squares_accumulate: argument acc has dtype f32, want f64");
  EXPECT_DEATH(ops->cast(i, f, 4), "cpu cast: argument dst has dtype i32, want f32 or bf16");
}

TEST(CpuOps, CountsAllocationsAndPeakLiveBytes) {
  auto ops = make_cpu_ops(1);
  EXPECT_EQ(ops->allocation_counts().allocations, 0u);
  DevPtr a = ops->allocate(100);
  {
    DeviceBuffer b(*ops, 200);
    DeviceBuffer moved = std::move(b);  // a move is not an allocation
    EXPECT_EQ(ops->allocation_counts().allocations, 2u);
    EXPECT_EQ(ops->allocation_counts().live_bytes, 300u);
    EXPECT_EQ(ops->allocation_counts().peak_live_bytes, 300u);
  }
  EXPECT_EQ(ops->allocation_counts().deallocations, 1u);
  EXPECT_EQ(ops->allocation_counts().live_bytes, 100u);
  DevPtr c = ops->allocate(50);
  EXPECT_EQ(ops->allocation_counts().live_bytes, 150u);
  EXPECT_EQ(ops->allocation_counts().peak_live_bytes, 300u);
  ops->deallocate(a);
  ops->deallocate(c);
  ops->deallocate(DevPtr());  // ignored
  const Ops::AllocationCounts& n = ops->allocation_counts();
  EXPECT_EQ(n.allocations, 3u);
  EXPECT_EQ(n.deallocations, 3u);
  EXPECT_EQ(n.live_bytes, 0u);
  EXPECT_EQ(n.peak_live_bytes, 300u);
}

// The checked backend takes its device memory from kernels/cpu/checked_memory.h.
TEST(CpuOps, CheckedBackendAllocatesCheckedMemory) {
  auto ops = make_cpu_ops(1, /*checked=*/true);
  const size_t before = cpu::checked_live_allocations();
  {
    DeviceBuffer buf(*ops, 1000);
    EXPECT_EQ(cpu::checked_live_allocations(), before + 1);
    const VecF host = random_vec(250, 90);
    VecF back(250);
    ops->upload(buf.get(), host.data(), 1000);
    ops->scale(buf.as(DType::kF32), 2.0f, 250);
    ops->download(back.data(), buf.get(), 1000);
    for (size_t i = 0; i < 250; ++i) ASSERT_EQ(back[i], host[i] * 2.0f) << i;
  }
  EXPECT_EQ(cpu::checked_live_allocations(), before);
}

}  // namespace
}  // namespace trident::testing
