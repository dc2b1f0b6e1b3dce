// Every op gives bitwise identical results run to run and for any OpenMP thread count
// (what makes parallel layouts reproducible on CPU). Sizes are large enough to take the
// parallel paths (multi-threaded sgemm, > 32 Ki-element pointwise, several column blocks).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

using Results = std::vector<std::pair<std::string, VecF>>;

// Runs every op once and returns all outputs and gradients, by name.
Results run_all_ops(Ops& ops) {
  Results all;
  auto keep_named = [&](const char* name, const VecF& v) { all.emplace_back(name, v); };
#define keep(v) keep_named(#v, v)
  uint32_t seed = 1000;
  auto rnd = [&](size_t n) { return random_vec(n, seed++); };

  {  // embedding, repeated tokens
    const int B = 4, T = 64, C = 160, vocab = 50;
    std::vector<int32_t> tok(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 13) % vocab;
    VecF wte = rnd(vocab * C), wpe = rnd(T * C), out(B * T * C), g = rnd(B * T * C);
    VecF dwte = rnd(vocab * C), dwpe = rnd(T * C);
    ops.embedding_forward(dev(ops, out), dev(ops, tok), dev(ops, wte), dev(ops, wpe), B, T, C, 0,
                          vocab);
    ops.embedding_backward(dev(ops, dwte), dev(ops, dwpe), dev(ops, g), dev(ops, tok), B, T, C, 0,
                           vocab);
    keep(out), keep(dwte), keep(dwpe);
  }
  {  // norms
    const int N = 300, C = 200;
    VecF x = rnd(N * C), w = rnd(C), b = rnd(C), g = rnd(N * C);
    VecF out(N * C), mean(N), rstd(N), dx = rnd(N * C), dw = rnd(C), db = rnd(C);
    ops.layernorm_forward(dev(ops, out), dev(ops, mean), dev(ops, rstd), dev(ops, x), dev(ops, w),
                          dev(ops, b), N, C, 1e-5f);
    ops.layernorm_backward(dev(ops, dx), dev(ops, dw), dev(ops, db), dev(ops, g), dev(ops, x),
                           dev(ops, w), dev(ops, mean), dev(ops, rstd), N, C);
    keep(out), keep(mean), keep(rstd), keep(dx), keep(dw), keep(db);
    ops.rmsnorm_forward(dev(ops, out), dev(ops, rstd), dev(ops, x), dev(ops, w), N, C, 1e-5f);
    ops.rmsnorm_backward(dev(ops, dx), dev(ops, dw), dev(ops, g), dev(ops, x), dev(ops, w),
                         dev(ops, rstd), N, C);
    keep(out), keep(rstd), keep(dx), keep(dw);
  }
  {  // matmul
    const int N = 300, IC = 200, OC = 160;
    VecF x = rnd(N * IC), w = rnd(OC * IC), b = rnd(OC), g = rnd(N * OC), out(N * OC);
    VecF dx = rnd(N * IC), dw = rnd(OC * IC), db = rnd(OC);
    ops.matmul_forward(dev(ops, out), dev(ops, x), dev(ops, w), dev(ops, b), N, IC, OC);
    ops.matmul_backward(dev(ops, dx), dev(ops, dw), dev(ops, db), dev(ops, g), dev(ops, x),
                        dev(ops, w), N, IC, OC);
    keep(out), keep(dx), keep(dw), keep(db);
  }
  {  // rope + attention (GQA, several row blocks)
    const int B = 2, T = 150, NH = 4, NKV = 2, HD = 16;
    VecF q = rnd(B * T * NH * HD), k = rnd(B * T * NKV * HD), v = rnd(B * T * NKV * HD);
    ops.rope_forward(dev(ops, q), B, T, NH, HD, 10000.0f, 0);
    ops.rope_forward(dev(ops, k), B, T, NKV, HD, 10000.0f, 0);
    VecF out(q.size()), g = rnd(q.size());
    VecF att(ops.attention_state_bytes(B, T, NH, NKV, HD, DType::kF32) / sizeof(float));  // CPU: floats
    VecF dq = rnd(q.size()), dk = rnd(k.size()), dv = rnd(v.size());
    ops.attention_forward(dev(ops, out), dev(ops, att).as(DType::kU8), dev(ops, q), dev(ops, k),
                          dev(ops, v), B, T, NH, NKV, HD);
    ops.attention_backward(dev(ops, dq), dev(ops, dk), dev(ops, dv), dev(ops, g), dev(ops, out),
                           dev(ops, att).as(DType::kU8), dev(ops, q), dev(ops, k), dev(ops, v), B,
                           T, NH, NKV, HD);
    ops.rope_backward(dev(ops, dq), B, T, NH, HD, 10000.0f, 0);
    keep(q), keep(out), keep(att), keep(dq), keep(dk), keep(dv);
  }
  {  // pointwise
    const size_t n = 70001;
    VecF x = rnd(n), u = rnd(n), g = rnd(n), y(n), dx = rnd(n), du = rnd(n);
    ops.gelu_forward(dev(ops, y), dev(ops, x), n);
    ops.gelu_backward(dev(ops, dx), dev(ops, g), dev(ops, x), n);
    keep(y), keep(dx);
    ops.swiglu_forward(dev(ops, y), dev(ops, x), dev(ops, u), n);
    ops.swiglu_backward(dev(ops, dx), dev(ops, du), dev(ops, g), dev(ops, x), dev(ops, u), n);
    keep(y), keep(dx), keep(du);
    ops.add(dev(ops, y), dev(ops, x), dev(ops, u), n);
    ops.accumulate(dev(ops, y), dev(ops, g), n);
    ops.scale(dev(ops, y), 0.3f, n);
    keep(y);
  }
  {  // loss
    const int N = 64, V = 1000, Vp = 1024;
    VecF logits = rnd(N * Vp), losses(N);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; ++n) tgt[n] = (n * 37) % V;
    ops.cross_entropy_forward(dev(ops, losses), dev(ops, logits), dev(ops, tgt), N, V, Vp);
    {
      DevVec<float> d_logits(ops, logits);  // in place, as the model calls it
      ops.cross_entropy_backward(d_logits, d_logits, dev(ops, tgt), 1.0f / N, N, V, Vp);
    }
    keep(losses), keep(logits);
  }
  {  // optimizer
    const size_t n = 70001;
    VecF param = rnd(n), grad = rnd(n), m(n), v(n);
    AdamWParams p;
    p.lr = 1e-3f;
    p.weight_decay = 0.1f;
    for (int step = 1; step <= 2; ++step) {
      p.step = step;
      ops.adamw_update(dev(ops, param), dev(ops, grad), dev(ops, m), dev(ops, v), DevPtr(), n, p);
    }
    keep(param), keep(m), keep(v);
    const double ss = ops.sum_squares(dev(ops, param), n);
    VecF bits(2);
    std::memcpy(bits.data(), &ss, sizeof ss);
    keep(bits);
  }
#undef keep
  return all;
}

// Names every result that is not bitwise equal; empty when all are.
std::string differences(const Results& got, const Results& want) {
  std::string diff;
  for (size_t i = 0; i < want.size(); ++i) {
    const VecF& a = got[i].second;
    const VecF& b = want[i].second;
    if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
      diff.append(want[i].first).append(" ");  // (append: GCC 12 -Wrestrict false positive)
  }
  return diff;
}

TEST(CpuDeterminism, BitwiseIdenticalAcrossRunsAndThreadCounts) {
  auto one = make_cpu_ops(1);
  auto two = make_cpu_ops(2);
  auto three = make_cpu_ops(3);
  const Results ref = run_all_ops(*one);
  EXPECT_EQ(differences(run_all_ops(*one), ref), "") << "second 1-thread run";
  EXPECT_EQ(differences(run_all_ops(*two), ref), "") << "2 threads vs 1";
  EXPECT_EQ(differences(run_all_ops(*three), ref), "") << "3 threads vs 1";
}

TEST(CpuOps, MemoryIsAlignedZeroedAndCopies) {
  auto ops = make_cpu_ops(1);
  EXPECT_STREQ(ops->name(), "cpu");
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096 + 3}}) {
    DeviceBuffer buf(*ops, bytes);
    ASSERT_FALSE(buf.get().is_null());
    EXPECT_EQ(buf.get().dtype(), DType::kU8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.get().raw()) % 64, 0u);
    std::vector<unsigned char> p(bytes, 1);
    ops->download(p.data(), buf.get(), bytes);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << i;
  }
  VecF host = random_vec(33, 7), back(33);
  DeviceBuffer a(*ops, 33 * sizeof(float)), b(*ops, 33 * sizeof(float));
  ops->upload(a.get(), host.data(), 33 * sizeof(float));
  ops->copy(b.get(), a.get(), 33 * sizeof(float));
  ops->download(back.data(), b.get(), 33 * sizeof(float));
  EXPECT_EQ(back, host);
  ops->zero(b.get(), 33 * sizeof(float));
  ops->download(back.data(), b.get(), 33 * sizeof(float));
  EXPECT_EQ(back, VecF(33, 0.0f));
}

}  // namespace
}  // namespace trident::testing
