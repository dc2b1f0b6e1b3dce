// GELU (tanh form), SwiGLU and the add / accumulate / scale helpers.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace trident::testing {
namespace {

constexpr size_t kN = 37;

VecD ref_gelu(const VecD& x) {
  VecD y(x.size());
  const double s = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(s * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

VecD ref_swiglu(const VecD& gate, const VecD& up) {
  VecD y(gate.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return y;
}

TEST(CpuGelu, ForwardAndBackward) {
  auto ops = make_cpu_ops(2);
  VecF x = random_vec(kN, 61, -4, 4), g = random_vec(kN, 62);
  VecF y(kN);
  ops->gelu_forward(dev(*ops, y), dev(*ops, x), kN);
  expect_close(y, ref_gelu(to_d(x)), kTolF32, "out");
  const VecD gd = to_d(g);
  VecD want = numeric_grad([&](const VecD& v) { return weighted_sum(ref_gelu(v), gd); }, to_d(x));
  VecF dx(kN);
  ops->gelu_backward(dev(*ops, dx), dev(*ops, g), dev(*ops, x), kN);
  expect_close(dx, want, kTolF32, "dinp");
  VecF pre = random_vec(kN, 63), acc = pre;
  ops->gelu_backward(dev(*ops, acc), dev(*ops, g), dev(*ops, x), kN);
  expect_accumulated(acc, pre, dx, "dinp");
}

TEST(CpuGelu, LargeArrayTakesTheParallelPathCorrectly) {
  auto ops = make_cpu_ops(2);
  const size_t n = 100003;
  VecF x = random_vec(n, 64, -6, 6), y(n);
  ops->gelu_forward(dev(*ops, y), dev(*ops, x), n);
  expect_close(y, ref_gelu(to_d(x)), kTolF32, "out");
}

TEST(CpuSwiGlu, ForwardAndBackward) {
  auto ops = make_cpu_ops(2);
  VecF gate = random_vec(kN, 65, -5, 5), up = random_vec(kN, 66), g = random_vec(kN, 67);
  VecF y(kN);
  ops->swiglu_forward(dev(*ops, y), dev(*ops, gate), dev(*ops, up), kN);
  const VecD gated = to_d(gate), upd = to_d(up), gd = to_d(g);
  expect_close(y, ref_swiglu(gated, upd), kTolF32, "out");
  VecD want_gate = numeric_grad([&](const VecD& v) { return weighted_sum(ref_swiglu(v, upd), gd); },
                                gated);
  VecD want_up = numeric_grad([&](const VecD& v) { return weighted_sum(ref_swiglu(gated, v), gd); },
                              upd);
  VecF dgate(kN), dup(kN);
  ops->swiglu_backward(dev(*ops, dgate), dev(*ops, dup), dev(*ops, g), dev(*ops, gate),
                       dev(*ops, up), kN);
  expect_close(dgate, want_gate, kTolF32, "dgate");
  expect_close(dup, want_up, kTolF32, "dup");
  VecF pg = random_vec(kN, 68), pu = random_vec(kN, 69), ag = pg, au = pu;
  ops->swiglu_backward(dev(*ops, ag), dev(*ops, au), dev(*ops, g), dev(*ops, gate), dev(*ops, up),
                       kN);
  expect_accumulated(ag, pg, dgate, "dgate");
  expect_accumulated(au, pu, dup, "dup");
  VecF only_up(kN);
  ops->swiglu_backward(DevPtr(), dev(*ops, only_up), dev(*ops, g), dev(*ops, gate), dev(*ops, up),
                       kN);
  EXPECT_EQ(only_up, dup);
}

TEST(CpuPointwise, AddAccumulateScale) {
  auto ops = make_cpu_ops(2);
  for (size_t n : {size_t{37}, size_t{70001}}) {
    VecF a = random_vec(n, 70), b = random_vec(n, 71);
    VecF out(n);
    ops->add(dev(*ops, out), dev(*ops, a), dev(*ops, b), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
    VecF alias = a;  // out aliasing a
    {
      DevVec<float> d_alias(*ops, alias);  // one buffer passed twice; written back below
      ops->add(d_alias, d_alias, dev(*ops, b), n);
    }
    EXPECT_EQ(alias, out);
    VecF acc = a;
    ops->accumulate(dev(*ops, acc), dev(*ops, b), n);
    EXPECT_EQ(acc, out);
    VecF s = a;
    ops->scale(dev(*ops, s), -0.37f, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(s[i], a[i] * -0.37f) << i;
  }
}

}  // namespace
}  // namespace trident::testing
