// The op table: every Ops compute op x {f32, bf16} x odd shapes, each against a float64
// reference, and each backward also against central differences of the backend's own
// forward (harness and tolerances: tests/kernels/op_table.h). Every backend of the build
// runs the same table: today the CPU backend and the checked CPU backend (device memory
// inaccessible to host code outside Ops calls) and, in a build with CUDA on a machine with a
// GPU, the CUDA backend, plus a comparison of the CUDA backend against the CPU backend on
// the same inputs (OpTable.cuda_vs_cpu). Without a device the CUDA cases skip, saying why.
//
// Test names: OpTable.<backend>/<op>[_forward|_backward|_gradcheck]_<dtype>_<shape>, e.g.
// OpTable.cpu/matmul_forward_bf16_N7_IC13_OC5; --gtest_filter='OpTable.cpu/*' runs one
// backend. "bf16" means every F argument of the op is bf16 (kernels/ops.h says which
// arguments are F; the rest keep their fixed dtypes); "mixed" entries pick F per argument.
#include "tests/kernels/op_table.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "kernels/backend.h"
#include "kernels/forwarding_ops.h"
#include "kernels/ops.h"

namespace trident::testing::op_table {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16, kI32 = DType::kI32, kF64 = DType::kF64,
                kU8 = DType::kU8;

Arg arg(std::string name, DType dtype, size_t count, Role role, double lo = -1.0, double hi = 1.0) {
  Arg a;
  a.name = std::move(name);
  a.dtype = dtype;
  a.count = count;
  a.role = role;
  a.lo = lo;
  a.hi = hi;
  return a;
}
Arg given(std::string name, DType dtype, VecD values, Role role = Role::kIn) {
  Arg a = arg(std::move(name), dtype, values.size(), role);
  a.values = std::move(values);
  return a;
}
Arg aliased(std::string name, std::string of, DType dtype, size_t count, Role role) {
  Arg a = arg(std::move(name), dtype, count, role);
  a.alias = std::move(of);
  return a;
}
// An output the op determines exactly (a max, a picked element, one rounded operation).
Arg exact(Arg a) {
  a.tol = 0.0;
  return a;
}
Arg clears_padding(Arg a) {  // an output whose padded columns the op must set to exactly 0
  a.zeros_exact = true;
  return a;
}

// "n<count>", built by appending (GCC 12 -Wrestrict misfires on "literal" + std::string).
std::string n_label(size_t n) {
  std::string s = "n";
  s += std::to_string(n);
  return s;
}

std::string dims(std::initializer_list<std::pair<const char*, long>> ds) {
  std::string s;
  for (const auto& [k, v] : ds) {  // appends only: GCC 12 -Wrestrict misfires on "lit" + string
    if (!s.empty()) s += '_';
    s.append(k).append(std::to_string(v));
  }
  return s;
}

// Token / target ids in [0, V), spread so that a vocab-parallel rank sees some of its
// own ids and some of others'.
VecD ids(int n, int V, int salt) {
  VecD v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7 + salt) % V;
  return v;
}

size_t sz(long n) { return static_cast<size_t>(n); }
using Def = std::shared_ptr<OpDef>;
Def make(std::string op, std::string dtype, std::string shape) {
  auto d = std::make_shared<OpDef>();
  d->op = std::move(op);
  d->dtype = std::move(dtype);
  d->shape = std::move(shape);
  return d;
}

// The entry with the gradients `absent` not needed (null pointers): the op skips them and
// gives the others as before. The entry itself has the gradcheck.
Def without(const Def& entry, const std::vector<std::string>& absent) {
  auto d = std::make_shared<OpDef>(*entry);
  d->absent = absent;
  for (const std::string& g : absent) {
    d->shape.append("_no_").append(g);
    std::erase_if(d->wrt, [&](const auto& pair) { return pair.second == g; });
  }
  d->gradcheck = false;
  return d;
}

// ---- embedding ------------------------------------------------------------------
// wte holds rows [vb, vb + vl) of a V-row table (vocab-parallel); vb >= V is a rank that
// holds padding rows only, whose output is wpe alone and whose dwte stays untouched.
Def embedding(DType F, int B, int T, int C, int V, int vb, int vl, bool wpe) {
  auto d = make("embedding", dtype_name(F),
                dims({{"B", B}, {"T", T}, {"C", C}, {"V", V}, {"vb", vb}, {"vl", vl}}) +
                    (wpe ? "" : "_nowpe"));
  const int N = B * T;
  // A copy, or one fp32 addition rounded once: exact.
  d->args = {exact(arg("out", F, sz(N) * C, Role::kOut)), given("tokens", kI32, ids(N, V, 3)),
             arg("wte", F, sz(vl) * C, Role::kIn)};
  if (wpe) d->args.push_back(arg("wpe", F, sz(T) * C, Role::kIn));
  d->args.push_back(arg("dout", F, sz(N) * C, Role::kGradIn));
  d->args.push_back(arg("dwte", kF32, sz(vl) * C, Role::kGradOut));
  if (wpe) d->args.push_back(arg("dwpe", kF32, sz(T) * C, Role::kGradOut));
  d->reduction = sz(N);
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.embedding_forward(b["out"], b["tokens"], b["wte"], wpe ? b["wpe"] : DevPtr(), B, T, C, vb,
                          vl);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.embedding_backward(b["dwte"], wpe ? b["dwpe"] : DevPtr(), b["dout"], b["tokens"], B, T, C,
                           vb, vl);
  };
  d->ref_forward = [=](Host& h) {
    for (int n = 0; n < N; ++n) {
      const int r = static_cast<int>(h.at("tokens")[sz(n)]) - vb;
      for (int c = 0; c < C; ++c) {
        double x = r >= 0 && r < vl ? h.at("wte")[sz(r) * C + c] : 0.0;
        if (wpe) x += h.at("wpe")[sz(n % T) * C + c];
        h.at("out")[sz(n) * C + c] = x;
      }
    }
  };
  d->ref_backward = [=](Host& h) {
    for (int n = 0; n < N; ++n) {
      const int r = static_cast<int>(h.at("tokens")[sz(n)]) - vb;
      for (int c = 0; c < C; ++c) {
        const double g = h.at("dout")[sz(n) * C + c];
        if (r >= 0 && r < vl) h.at("dwte")[sz(r) * C + c] += g;
        if (wpe) h.at("dwpe")[sz(n % T) * C + c] += g;
      }
    }
  };
  d->wrt = {{"wte", "dwte"}};
  if (wpe) d->wrt.push_back({"wpe", "dwpe"});
  d->project = {{"out", "dout"}};
  return d;
}

// ---- normalisation --------------------------------------------------------------
constexpr float kNormEps = 1e-5f;

Def layernorm(DType F, int N, int C, bool bias) {
  auto d = make("layernorm", dtype_name(F), dims({{"N", N}, {"C", C}}) + (bias ? "" : "_nobias"));
  d->args = {arg("out", F, sz(N) * C, Role::kOut), arg("mean", kF32, sz(N), Role::kOut),
             arg("rstd", kF32, sz(N), Role::kOut), arg("inp", F, sz(N) * C, Role::kIn),
             arg("weight", F, sz(C), Role::kIn, 0.5, 1.5)};
  if (bias) d->args.push_back(arg("bias", F, sz(C), Role::kIn));
  d->args.push_back(arg("dout", F, sz(N) * C, Role::kGradIn));
  d->args.push_back(arg("dinp", F, sz(N) * C, Role::kGradOut));
  d->args.push_back(arg("dweight", kF32, sz(C), Role::kGradOut));
  if (bias) d->args.push_back(arg("dbias", kF32, sz(C), Role::kGradOut));
  d->reduction = sz(std::max(N, C));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.layernorm_forward(b["out"], b["mean"], b["rstd"], b["inp"], b["weight"],
                          bias ? b["bias"] : DevPtr(), N, C, kNormEps);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.layernorm_backward(b["dinp"], b["dweight"], bias ? b["dbias"] : DevPtr(), b["dout"],
                           b["inp"], b["weight"], b["mean"], b["rstd"], N, C);
  };
  d->ref_forward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight");
    for (int n = 0; n < N; ++n) {
      const double* xr = &x[sz(n) * C];
      double mean = 0, var = 0;
      for (int c = 0; c < C; ++c) mean += xr[c];
      mean /= C;
      for (int c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      var /= C;
      const double rstd = 1.0 / std::sqrt(var + static_cast<double>(kNormEps));
      h.at("mean")[sz(n)] = mean;
      h.at("rstd")[sz(n)] = rstd;
      for (int c = 0; c < C; ++c)
        h.at("out")[sz(n) * C + c] =
            (xr[c] - mean) * rstd * w[sz(c)] + (bias ? h.at("bias")[sz(c)] : 0.0);
    }
  };
  d->ref_backward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight"), &g = h.at("dout");
    for (int n = 0; n < N; ++n) {
      const double mean = h.at("mean")[sz(n)], rstd = h.at("rstd")[sz(n)];
      double m1 = 0, m2 = 0;
      for (int c = 0; c < C; ++c) {
        const size_t i = sz(n) * C + c;
        const double xhat = (x[i] - mean) * rstd, dxhat = g[i] * w[sz(c)];
        m1 += dxhat;
        m2 += dxhat * xhat;
      }
      m1 /= C;
      m2 /= C;
      for (int c = 0; c < C; ++c) {
        const size_t i = sz(n) * C + c;
        const double xhat = (x[i] - mean) * rstd, dxhat = g[i] * w[sz(c)];
        h.at("dinp")[i] += rstd * (dxhat - m1 - xhat * m2);
        h.at("dweight")[sz(c)] += g[i] * xhat;
        if (bias) h.at("dbias")[sz(c)] += g[i];
      }
    }
  };
  d->wrt = {{"inp", "dinp"}, {"weight", "dweight"}};
  if (bias) d->wrt.push_back({"bias", "dbias"});
  d->project = {{"out", "dout"}};
  return d;
}

Def rmsnorm(DType F, int N, int C) {
  auto d = make("rmsnorm", dtype_name(F), dims({{"N", N}, {"C", C}}));
  d->args = {
      arg("out", F, sz(N) * C, Role::kOut),       arg("rstd", kF32, sz(N), Role::kOut),
      arg("inp", F, sz(N) * C, Role::kIn),        arg("weight", F, sz(C), Role::kIn, 0.5, 1.5),
      arg("dout", F, sz(N) * C, Role::kGradIn),   arg("dinp", F, sz(N) * C, Role::kGradOut),
      arg("dweight", kF32, sz(C), Role::kGradOut)};
  d->reduction = sz(std::max(N, C));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.rmsnorm_forward(b["out"], b["rstd"], b["inp"], b["weight"], N, C, kNormEps);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.rmsnorm_backward(b["dinp"], b["dweight"], b["dout"], b["inp"], b["weight"], b["rstd"], N,
                         C);
  };
  d->ref_forward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight");
    for (int n = 0; n < N; ++n) {
      double ms = 0;
      for (int c = 0; c < C; ++c) ms += x[sz(n) * C + c] * x[sz(n) * C + c];
      const double rstd = 1.0 / std::sqrt(ms / C + static_cast<double>(kNormEps));
      h.at("rstd")[sz(n)] = rstd;
      for (int c = 0; c < C; ++c) h.at("out")[sz(n) * C + c] = x[sz(n) * C + c] * rstd * w[sz(c)];
    }
  };
  d->ref_backward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight"), &g = h.at("dout");
    for (int n = 0; n < N; ++n) {
      const double rstd = h.at("rstd")[sz(n)];
      double m2 = 0;
      for (int c = 0; c < C; ++c) {
        const size_t i = sz(n) * C + c;
        m2 += g[i] * w[sz(c)] * x[i] * rstd;
      }
      m2 /= C;
      for (int c = 0; c < C; ++c) {
        const size_t i = sz(n) * C + c;
        const double xhat = x[i] * rstd;
        h.at("dinp")[i] += rstd * (g[i] * w[sz(c)] - xhat * m2);
        h.at("dweight")[sz(c)] += g[i] * xhat;
      }
    }
  };
  d->wrt = {{"inp", "dinp"}, {"weight", "dweight"}};
  d->project = {{"out", "dout"}};
  return d;
}

// ---- linear ---------------------------------------------------------------------
// F: the activations (inp, out, dout, dinp); W: the weights (weight, bias). write kSet:
// dinp is set, not accumulated (the first writer of a gradient); it starts as NaN, so a
// backend that reads it (beta 1) gives NaN. The weight and bias gradients accumulate.
Def matmul(DType F, DType W, int N, int IC, int OC, bool bias,
           GradWrite write = GradWrite::kAdd) {
  const std::string tag =
      F == W ? dtype_name(F) : std::string("mixed_act") + dtype_name(F) + "_w" + dtype_name(W);
  const bool set = write == GradWrite::kSet;
  auto d = make("matmul", tag,
                dims({{"N", N}, {"IC", IC}, {"OC", OC}}) + (bias ? "" : "_nobias") +
                    (set ? "_setdinp" : ""));
  d->args = {arg("out", F, sz(N) * OC, Role::kOut), arg("inp", F, sz(N) * IC, Role::kIn),
             arg("weight", W, sz(OC) * IC, Role::kIn)};
  if (bias) d->args.push_back(arg("bias", W, sz(OC), Role::kIn));
  d->args.push_back(arg("dout", F, sz(N) * OC, Role::kGradIn));
  d->args.push_back(arg("dinp", F, sz(N) * IC, set ? Role::kGradSet : Role::kGradOut));
  d->args.push_back(arg("dweight", kF32, sz(OC) * IC, Role::kGradOut));
  if (bias) d->args.push_back(arg("dbias", kF32, sz(OC), Role::kGradOut));
  d->reduction = sz(std::max({N, IC, OC}));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.matmul_forward(b["out"], b["inp"], b["weight"], bias ? b["bias"] : DevPtr(), N, IC, OC);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.matmul_backward(b["dinp"], b["dweight"], bias ? b["dbias"] : DevPtr(), b["dout"], b["inp"],
                        b["weight"], N, IC, OC, write);
  };
  d->ref_forward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight");
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double s = bias ? h.at("bias")[sz(o)] : 0.0;
        for (int i = 0; i < IC; ++i) s += x[sz(n) * IC + i] * w[sz(o) * IC + i];
        h.at("out")[sz(n) * OC + o] = s;
      }
  };
  d->ref_backward = [=](Host& h) {
    const VecD &x = h.at("inp"), &w = h.at("weight"), &g = h.at("dout");
    if (set) std::fill(h.at("dinp").begin(), h.at("dinp").end(), 0.0);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        const double go = g[sz(n) * OC + o];
        for (int i = 0; i < IC; ++i) {
          h.at("dinp")[sz(n) * IC + i] += go * w[sz(o) * IC + i];
          h.at("dweight")[sz(o) * IC + i] += go * x[sz(n) * IC + i];
        }
        if (bias) h.at("dbias")[sz(o)] += go;
      }
  };
  d->wrt = {{"inp", "dinp"}, {"weight", "dweight"}};
  if (bias) d->wrt.push_back({"bias", "dbias"});
  d->project = {{"out", "dout"}};
  return d;
}

// ---- rope -----------------------------------------------------------------------
void ref_rope(VecD& x, int B, int T, int H, int HD, double theta, int pos_offset, double sign) {
  const int half = HD / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < H; ++hh) {
        double* v = &x[((sz(b) * T + t) * H + hh) * HD];
        for (int i = 0; i < half; ++i) {
          const double angle = (t + pos_offset) * std::pow(theta, -2.0 * i / HD);
          const double c = std::cos(angle), s = sign * std::sin(angle);
          const double x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
}

Def rope(DType F, int B, int T, int H, int HD, int pos_offset) {
  constexpr float theta = 10000.0f;
  auto d = make("rope", dtype_name(F),
                dims({{"B", B}, {"T", T}, {"H", H}, {"HD", HD}, {"pos", pos_offset}}));
  const size_t n = sz(B) * T * H * HD;
  d->args = {arg("x", F, n, Role::kInOut), arg("dx", F, n, Role::kGradInOut)};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.rope_forward(b["x"], B, T, H, HD, theta, pos_offset);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.rope_backward(b["dx"], B, T, H, HD, theta, pos_offset);
  };
  d->ref_forward = [=](Host& h) { ref_rope(h.at("x"), B, T, H, HD, theta, pos_offset, 1.0); };
  d->ref_backward = [=](Host& h) { ref_rope(h.at("dx"), B, T, H, HD, theta, pos_offset, -1.0); };
  d->wrt = {{"x", "dx"}};
  d->project = {{"x", "dx"}};
  return d;
}

// ---- the fused q/k/v rows --------------------------------------------------------
// qkv [B, T, (NH + 2 NKV) HD] split into q, k, v (q and k rotated when `rotate`); the
// backward merges dq, dk (rotated back) and dv into dqkv, which it sets (NaN prefill).
Def qkv(DType F, int B, int T, int NH, int NKV, int HD, int pos_offset, bool rotate) {
  constexpr float theta = 10000.0f;
  auto d = make("qkv", dtype_name(F),
                dims({{"B", B}, {"T", T}, {"NH", NH}, {"NKV", NKV}, {"HD", HD}, {"pos", pos_offset}}) +
                    (rotate ? "" : "_norope"));
  const size_t rows = sz(B) * T, qd = sz(NH) * HD, kvd = sz(NKV) * HD, W = qd + 2 * kvd;
  d->args = {arg("qkv", F, rows * W, Role::kIn),      arg("q", F, rows * qd, Role::kOut),
             arg("k", F, rows * kvd, Role::kOut),     arg("v", F, rows * kvd, Role::kOut),
             arg("dq", F, rows * qd, Role::kGradIn),  arg("dk", F, rows * kvd, Role::kGradIn),
             arg("dv", F, rows * kvd, Role::kGradIn), arg("dqkv", F, rows * W, Role::kGradSet)};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.qkv_split(b["q"], b["k"], b["v"], b["qkv"], B, T, NH, NKV, HD, rotate, theta, pos_offset);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.qkv_merge(b["dqkv"], b["dq"], b["dk"], b["dv"], B, T, NH, NKV, HD, rotate, theta,
                  pos_offset);
  };
  // Row r of the fused tensor holds q | k | v; `to_parts` copies out, else in.
  auto permute = [=](VecD& fused, VecD& q, VecD& k, VecD& v, bool to_parts) {
    for (size_t r = 0; r < rows; ++r) {
      VecD* parts[3] = {&q, &k, &v};
      const size_t width[3] = {qd, kvd, kvd}, at[3] = {0, qd, qd + kvd};
      for (int j = 0; j < 3; ++j)
        for (size_t e = 0; e < width[j]; ++e) {
          double& part = (*parts[j])[r * width[j] + e];
          double& row = fused[r * W + at[j] + e];
          if (to_parts) part = row; else row = part;
        }
    }
  };
  d->ref_forward = [=](Host& h) {
    permute(h.at("qkv"), h.at("q"), h.at("k"), h.at("v"), true);
    if (!rotate) return;
    ref_rope(h.at("q"), B, T, NH, HD, theta, pos_offset, 1.0);
    ref_rope(h.at("k"), B, T, NKV, HD, theta, pos_offset, 1.0);
  };
  d->ref_backward = [=](Host& h) {
    VecD dq = h.at("dq"), dk = h.at("dk"), dv = h.at("dv");
    if (rotate) {
      ref_rope(dq, B, T, NH, HD, theta, pos_offset, -1.0);
      ref_rope(dk, B, T, NKV, HD, theta, pos_offset, -1.0);
    }
    permute(h.at("dqkv"), dq, dk, dv, false);
  };
  d->wrt = {{"qkv", "dqkv"}};
  d->project = {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}};
  return d;
}

// ---- attention ------------------------------------------------------------------
Def attention(DType F, AttnShape s) {
  auto d = make("attention", dtype_name(F),
                dims({{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"NKV", s.NKV}, {"HD", s.HD}}));
  const size_t nq = sz(s.B) * s.T * s.NH * s.HD, nkv = sz(s.B) * s.T * s.NKV * s.HD;
  Arg state = arg("state", kU8, 0, Role::kState);
  state.count_of = [=](const Ops& ops) {
    return ops.attention_state_bytes(s.B, s.T, s.NH, s.NKV, s.HD, F);
  };
  d->args = {arg("out", F, nq, Role::kOut),     state,
             arg("q", F, nq, Role::kIn, -2, 2), arg("k", F, nkv, Role::kIn, -2, 2),
             arg("v", F, nkv, Role::kIn),       arg("dout", F, nq, Role::kGradIn),
             arg("dq", F, nq, Role::kGradOut),  arg("dk", F, nkv, Role::kGradOut),
             arg("dv", F, nkv, Role::kGradOut)};
  d->reduction = sz(std::max(s.T, s.HD) * (s.NH / s.NKV));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.attention_forward(b["out"], b["state"], b["q"], b["k"], b["v"], s.B, s.T, s.NH, s.NKV,
                          s.HD);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.attention_backward(b["dq"], b["dk"], b["dv"], b["dout"], b["out"], b["state"], b["q"],
                           b["k"], b["v"], s.B, s.T, s.NH, s.NKV, s.HD);
  };
  d->ref_forward = [=](Host& h) {
    VecD P;
    ref_attention(s, h.at("q"), h.at("k"), h.at("v"), h.at("out"), P);
  };
  d->ref_backward = [=](Host& h) {
    const VecD &q = h.at("q"), &k = h.at("k"), &v = h.at("v"), &g = h.at("dout");
    VecD out(q.size()), P;
    ref_attention(s, q, k, v, out, P);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.HD));
    for (int b = 0; b < s.B; ++b)
      for (int hh = 0; hh < s.NH; ++hh) {
        const int kv = hh / (s.NH / s.NKV);
        for (int i = 0; i < s.T; ++i) {
          const double* p = &P[((sz(b) * s.NH + hh) * s.T + i) * s.T];
          VecD dp(sz(i) + 1, 0.0);
          double rowdot = 0;
          for (int j = 0; j <= i; ++j) {
            for (int e = 0; e < s.HD; ++e) {
              dp[sz(j)] += g[s.qi(b, i, hh, e)] * v[s.ki(b, j, kv, e)];
              h.at("dv")[s.ki(b, j, kv, e)] += p[j] * g[s.qi(b, i, hh, e)];
            }
            rowdot += p[j] * dp[sz(j)];
          }
          for (int j = 0; j <= i; ++j) {
            const double ds = p[j] * (dp[sz(j)] - rowdot) * scale;
            for (int e = 0; e < s.HD; ++e) {
              h.at("dq")[s.qi(b, i, hh, e)] += ds * k[s.ki(b, j, kv, e)];
              h.at("dk")[s.ki(b, j, kv, e)] += ds * q[s.qi(b, i, hh, e)];
            }
          }
        }
      }
  };
  d->wrt = {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}};
  d->project = {{"out", "dout"}};
  return d;
}

// ---- attention over a key/value cache ----------------------------------------------
// Queries at positions pos .. pos+Tq-1 over a cache of `capacity` positions, of which
// 0 .. pos+Tq-1 hold keys and values and the rest NaN: a kernel reading a position beyond
// pos + Tq returns NaN, and one reading past its row's causal limit (a later real
// position) disagrees with the reference.
struct CachedShape {
  int B, Tq, pos, capacity, NH, NKV, HD;
};

VecD cache_values(const CachedShape& s, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  const size_t row = sz(s.NKV) * s.HD;
  VecD v(sz(s.B) * s.capacity * row, std::numeric_limits<double>::quiet_NaN());
  for (int b = 0; b < s.B; ++b)
    for (size_t i = 0; i < sz(s.pos + s.Tq) * row; ++i) v[sz(b) * s.capacity * row + i] = dist(gen);
  return v;
}

Def attention_cached(DType F, CachedShape s) {
  auto d = make("attention_cached", dtype_name(F),
                dims({{"B", s.B}, {"Tq", s.Tq}, {"pos", s.pos}, {"cap", s.capacity}, {"NH", s.NH},
                      {"NKV", s.NKV}, {"HD", s.HD}}));
  const size_t nq = sz(s.B) * s.Tq * s.NH * s.HD;
  d->args = {arg("out", F, nq, Role::kOut), arg("q", F, nq, Role::kIn, -2, 2),
             given("k_cache", F, cache_values(s, -2, 2, 11)),
             given("v_cache", F, cache_values(s, -1, 1, 12))};
  d->reduction = sz(std::max(s.pos + s.Tq, s.HD) * (s.NH / s.NKV));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.attention_cached_forward(b["out"], b["q"], b["k_cache"], b["v_cache"], s.B, s.Tq, s.pos,
                                 s.capacity, s.NH, s.NKV, s.HD);
  };
  d->ref_forward = [=](Host& h) {
    VecD P;
    ref_attention({s.B, s.Tq, s.NH, s.NKV, s.HD, s.pos, s.capacity}, h.at("q"), h.at("k_cache"),
                  h.at("v_cache"), h.at("out"), P);
  };
  return d;
}

std::vector<Def> attention_cached_defs(DType F) {
  return {attention_cached(F, {2, 1, 0, 6, 3, 3, 4}),      // a decode step at position 0
          attention_cached(F, {2, 1, 5, 9, 4, 2, 5}),      // at position 5, GQA, odd head_dim
          attention_cached(F, {1, 4, 3, 10, 4, 1, 6}),     // a prefill continuing a cache
          attention_cached(F, {2, 70, 5, 80, 2, 1, 3})};   // more rows than one CPU row block
}

// An op that, for some arguments, is attention_forward (kernels/ops.h): `other` writes its
// out from the same q, k, v; bitwise on the CPU backends (one kernel), within the op's
// tolerance elsewhere.
using AttentionLike =
    std::function<void(Ops&, DevPtr out, DevPtr q, DevPtr k, DevPtr v, const AttnShape&)>;
void expect_equals_attention_forward(Ops& ops, DType F, bool bitwise, const char* what,
                                     uint32_t seed, const AttentionLike& other) {
  const AttnShape s{2, 9, 4, 2, 6};
  const size_t nq = sz(s.B) * s.T * s.NH * s.HD, nkv = sz(s.B) * s.T * s.NKV * s.HD;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-2, 2);
  auto random = [&](size_t n) {
    VecD v(n);
    for (double& x : v) x = dist(gen);
    return detail::encode(v, F);
  };
  const size_t es = dtype_size(F);
  DeviceBuffer q(ops, nq * es), k(ops, nkv * es), v(ops, nkv * es), out(ops, nq * es),
      other_out(ops, nq * es),
      state(ops, ops.attention_state_bytes(s.B, s.T, s.NH, s.NKV, s.HD, F));
  ops.upload(q.get(), random(nq).data(), nq * es);
  ops.upload(k.get(), random(nkv).data(), nkv * es);
  ops.upload(v.get(), random(nkv).data(), nkv * es);
  ops.attention_forward(out.as(F), state.get(), q.as(F), k.as(F), v.as(F), s.B, s.T, s.NH, s.NKV,
                        s.HD);
  other(ops, other_out.as(F), q.as(F), k.as(F), v.as(F), s);
  std::vector<unsigned char> a(nq * es), b(nq * es);
  ops.download(a.data(), out.get(), a.size());
  ops.download(b.data(), other_out.get(), b.size());
  if (bitwise) {
    EXPECT_EQ(a, b) << what << " " << ops.name() << " " << dtype_name(F);
    return;
  }
  Report r;
  detail::compare(r, what, detail::decode(b, nq, F), detail::decode(a, nq, F),
                  tolerance_for(F, sz(s.T) * (s.NH / s.NKV)));
  EXPECT_TRUE(r.ok()) << what << " " << ops.name() << " " << dtype_name(F) << ":\n" << r.str();
}

// On the CPU backends (bitwise) and, where there is a GPU, on CUDA.
void expect_equals_attention_forward_everywhere(const char* what, uint32_t seed,
                                                const AttentionLike& other) {
  for (DType F : {kF32, kBF16}) {
    for (bool checked : {false, true}) {
      auto cpu = make_cpu_ops(2, checked);
      expect_equals_attention_forward(*cpu, F, /*bitwise=*/true, what, seed, other);
    }
    auto cuda = make_ops(DeviceKind::kCuda, 0, 1);
    if (cuda.is_ok()) {
      expect_equals_attention_forward(**cuda, F, /*bitwise=*/false, what, seed, other);
    }
  }
}

// The fused rows split into q, k and v are, bit for bit, those parts copied out and then
// rotated by rope_forward (the three-GEMM path of Transformer::block_forward), and the
// merge is rope_backward then copies, on both CPU backends in f32 and bf16.
TEST(OpTableQkv, SplitAndMergeEqualRopeAndCopiesBitwise) {
  const int B = 2, T = 9, NH = 4, NKV = 2, HD = 8, pos = 3;
  const float theta = 10000.0f;
  const size_t rows = sz(B) * T, qd = sz(NH) * HD, kvd = sz(NKV) * HD, W = qd + 2 * kvd;
  for (DType F : {kF32, kBF16}) {
    for (bool checked : {false, true}) {
      auto ops = make_cpu_ops(2, checked);
      const size_t es = dtype_size(F);
      std::mt19937 gen(17);
      std::uniform_real_distribution<double> dist(-2, 2);
      VecD fused(rows * W);
      for (double& x : fused) x = dist(gen);
      const std::vector<unsigned char> fused_bytes = detail::encode(fused, F);
      DeviceBuffer qkv_buf(*ops, rows * W * es), q(*ops, rows * qd * es), k(*ops, rows * kvd * es),
          v(*ops, rows * kvd * es), merged(*ops, rows * W * es);
      ops->upload(qkv_buf.get(), fused_bytes.data(), fused_bytes.size());
      ops->qkv_split(q.as(F), k.as(F), v.as(F), qkv_buf.as(F), B, T, NH, NKV, HD, true, theta, pos);
      // The reference: each row's parts copied out of the fused bytes, then rope_forward.
      std::vector<unsigned char> parts[3] = {std::vector<unsigned char>(rows * qd * es),
                                             std::vector<unsigned char>(rows * kvd * es),
                                             std::vector<unsigned char>(rows * kvd * es)};
      const size_t width[3] = {qd, kvd, kvd}, at[3] = {0, qd, qd + kvd};
      for (size_t r = 0; r < rows; ++r)
        for (int j = 0; j < 3; ++j)
          std::memcpy(parts[j].data() + r * width[j] * es, fused_bytes.data() + (r * W + at[j]) * es,
                      width[j] * es);
      DeviceBuffer rq(*ops, rows * qd * es), rk(*ops, rows * kvd * es), rv(*ops, rows * kvd * es);
      DeviceBuffer* ref[3] = {&rq, &rk, &rv};
      for (int j = 0; j < 3; ++j) ops->upload(ref[j]->get(), parts[j].data(), parts[j].size());
      ops->rope_forward(rq.as(F), B, T, NH, HD, theta, pos);
      ops->rope_forward(rk.as(F), B, T, NKV, HD, theta, pos);
      DeviceBuffer* got[3] = {&q, &k, &v};
      for (int j = 0; j < 3; ++j) {
        std::vector<unsigned char> a(parts[j].size()), b(parts[j].size());
        ops->download(a.data(), got[j]->get(), a.size());
        ops->download(b.data(), ref[j]->get(), b.size());
        EXPECT_EQ(a, b) << "split part " << j << " " << ops->name() << " " << dtype_name(F);
      }
      // Merge the split parts back: rope_backward undoes the rotation only up to rounding,
      // so the reference is rope_backward on copies of the parts, then the copies in.
      ops->qkv_merge(merged.as(F), q.as(F), k.as(F), v.as(F), B, T, NH, NKV, HD, true, theta, pos);
      ops->rope_backward(rq.as(F), B, T, NH, HD, theta, pos);
      ops->rope_backward(rk.as(F), B, T, NKV, HD, theta, pos);
      std::vector<unsigned char> want(rows * W * es), have(rows * W * es);
      for (int j = 0; j < 3; ++j) {
        ops->download(parts[j].data(), ref[j]->get(), parts[j].size());
        for (size_t r = 0; r < rows; ++r)
          std::memcpy(want.data() + (r * W + at[j]) * es, parts[j].data() + r * width[j] * es,
                      width[j] * es);
      }
      ops->download(have.data(), merged.get(), have.size());
      EXPECT_EQ(have, want) << "merge " << ops->name() << " " << dtype_name(F);
    }
  }
}

// With pos 0 and Tq = capacity = T the cached op is attention_forward.
TEST(OpTableCachedAttention, PrefillAtPositionZeroEqualsAttentionForward) {
  expect_equals_attention_forward_everywhere(
      "cached", 5, [](Ops& ops, DevPtr out, DevPtr q, DevPtr k, DevPtr v, const AttnShape& s) {
        ops.attention_cached_forward(out, q, k, v, s.B, s.T, 0, s.T, s.NH, s.NKV, s.HD);
      });
}

// The checked backend refuses a cache shorter than the capacity the call names.
TEST(OpTableCachedAttention, CheckedBackendRefusesACacheShorterThanItsCapacity) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto ops = make_cpu_ops(1, /*checked=*/true);
  const int NH = 2, HD = 4, capacity = 8;
  DeviceBuffer q(*ops, sz(NH) * HD * 4), out(*ops, sz(NH) * HD * 4);
  DeviceBuffer short_cache(*ops, sz(capacity - 1) * NH * HD * 4);  // one position short
  DeviceBuffer cache(*ops, sz(capacity) * NH * HD * 4);
  EXPECT_DEATH(ops->attention_cached_forward(out.as(kF32), q.as(kF32), short_cache.as(kF32),
                                             cache.as(kF32), 1, 1, 0, capacity, NH, NH, HD),
               "cpu-checked attention_cached_forward: argument k_cache is not 256 bytes");
}

// ---- block attention (ring attention's pieces) ---------------------------------------
// A block of Tq queries at positions q_pos.. over Tk keys at k_pos.., its rows at q_off of
// q_rows per sequence (k_off of kv_rows for the keys): the rows between blocks hold 100, far
// outside the data's range, so a kernel that reads them is wrong by a lot, and outputs there
// must keep their prefill. split > 0: the keys as two blocks, [0, split) and [split, Tk),
// each through attention_block_forward and the second merged into the first, so the entry
// checks that the merge of two blocks is one block over their keys; backward then runs
// block by block from the merged out and lse. The merged out and the gradients are f32
// then, as ring attention keeps them (a bf16 one would be rounded at every merge or
// block).
struct BlockCase {
  int B, Tq, Tk, NH, NKV, HD, q_pos, k_pos;
  int q_off = 0, q_rows = 0, k_off = 0, kv_rows = 0;
  int split = 0;
  int QR() const { return q_rows > 0 ? q_rows : Tq; }
  int KR() const { return kv_rows > 0 ? kv_rows : Tk; }
  bool strided() const { return QR() != Tq || KR() != Tk; }
  size_t qi(int b, int i, int h, int e) const {
    return ((sz(b) * QR() + q_off + i) * NH + h) * HD + e;
  }
  size_t ki(int b, int j, int h, int e) const {
    return ((sz(b) * KR() + k_off + j) * NKV + h) * HD + e;
  }
  size_t li(int b, int h, int i) const { return (sz(b) * NH + h) * QR() + q_off + i; }
  // The keys row i sees (kernels/ops.h "Block attention"), by brute force over positions.
  int visible(int i) const {
    int n = 0;
    for (int j = 0; j < Tk; ++j) n += k_pos + j <= q_pos + i ? 1 : 0;
    return n;
  }
};

// Values in [lo, hi) in the block's rows of a [B, rows, width] buffer, 100 elsewhere.
VecD block_values(int B, int rows, int off, int used, int width, double lo, double hi,
                  uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  VecD v(sz(B) * rows * width, 100.0);
  for (int b = 0; b < B; ++b)
    for (size_t x = 0; x < sz(used) * width; ++x) v[(sz(b) * rows + off) * width + x] = dist(gen);
  return v;
}

// Row (b, h, i)'s probabilities over the block's keys in float64, and its log-sum-exp
// (-inf for a row that sees no key).
VecD ref_block_row(const BlockCase& c, const VecD& q, const VecD& k, int b, int h, int i,
                   double& lse) {
  const int kv = h / (c.NH / c.NKV), n = c.visible(i);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HD));
  VecD p(sz(n));
  double mx = -1e300, sum = 0;
  for (int j = 0; j < n; ++j) {
    double dot = 0;
    for (int e = 0; e < c.HD; ++e) dot += q[c.qi(b, i, h, e)] * k[c.ki(b, j, kv, e)];
    mx = std::max(mx, p[sz(j)] = dot * scale);
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (double& x : p) x /= sum;
  lse = n == 0 ? -std::numeric_limits<double>::infinity() : mx + std::log(sum);
  return p;
}

Def attention_block(DType F, BlockCase c) {
  auto d = make("attention_block", dtype_name(F),
                dims({{"B", c.B}, {"Tq", c.Tq}, {"Tk", c.Tk}, {"NH", c.NH}, {"NKV", c.NKV},
                      {"HD", c.HD}, {"qpos", c.q_pos}, {"kpos", c.k_pos}}) +
                    (c.strided() ? dims({{"_qrows", c.QR()}, {"qoff", c.q_off},
                                         {"kvrows", c.KR()}, {"koff", c.k_off}})
                                 : "") +
                    (c.split > 0 ? dims({{"_split", c.split}}) : ""));
  const size_t nq = sz(c.B) * c.QR() * c.NH * c.HD, nkv = sz(c.B) * c.KR() * c.NKV * c.HD;
  const size_t nl = sz(c.B) * c.NH * c.QR();
  const int wq = c.NH * c.HD, wkv = c.NKV * c.HD;
  const DType G = c.split > 0 ? kF32 : F;  // the running out and the gradients
  d->args = {arg("out", G, nq, Role::kOut),
             arg("lse", kF32, nl, Role::kOut),
             given("q", F, block_values(c.B, c.QR(), c.q_off, c.Tq, wq, -2, 2, 21)),
             given("k", F, block_values(c.B, c.KR(), c.k_off, c.Tk, wkv, -2, 2, 22)),
             given("v", F, block_values(c.B, c.KR(), c.k_off, c.Tk, wkv, -1, 1, 23)),
             given("dout", F, block_values(c.B, c.QR(), c.q_off, c.Tq, wq, -1, 1, 24),
                   Role::kGradIn),
             arg("dq", G, nq, Role::kGradOut),
             arg("dk", G, nkv, Role::kGradOut),
             arg("dv", G, nkv, Role::kGradOut)};
  if (c.split > 0) {  // the second block's own out and lse
    d->args.push_back(arg("out2", kF32, nq, Role::kState));
    d->args.push_back(arg("lse2", kF32, nl, Role::kState));
  }
  d->reduction = sz(std::max(c.Tk, c.HD) * (c.NH / c.NKV));
  // The key blocks: (first key row, keys).
  std::vector<std::pair<int, int>> blocks = {{0, c.Tk}};
  if (c.split > 0) blocks = {{0, c.split}, {c.split, c.Tk - c.split}};
  auto shape = [c](int j0, int keys) {
    Ops::AttentionBlock s;
    s.B = c.B, s.Tq = c.Tq, s.Tk = keys, s.q_rows = c.QR(), s.kv_rows = c.KR();
    s.q_pos = c.q_pos, s.k_pos = c.k_pos + j0, s.NH = c.NH, s.NKV = c.NKV, s.HD = c.HD;
    return s;
  };
  const size_t qo = sz(c.q_off) * wq, lo = sz(c.q_off);
  auto ko = [c, wkv](int j0) { return sz(c.k_off + j0) * wkv; };
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.attention_block_forward(b["out"] + qo, b["lse"] + lo, b["q"] + qo, b["k"] + ko(0),
                                b["v"] + ko(0), shape(0, blocks[0].second));
    if (c.split == 0) return;
    const auto [j0, keys] = blocks[1];
    ops.attention_block_forward(b["out2"] + qo, b["lse2"] + lo, b["q"] + qo, b["k"] + ko(j0),
                                b["v"] + ko(j0), shape(j0, keys));
    ops.attention_block_merge(b["out"] + qo, b["lse"] + lo, b["out2"] + qo, b["lse2"] + lo,
                              shape(j0, keys));
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    for (const auto& [j0, keys] : blocks) {
      ops.attention_block_backward(b["dq"] + qo, b["dk"] + ko(j0), b["dv"] + ko(j0),
                                   b["dout"] + qo, b["out"] + qo, b["lse"] + lo, b["q"] + qo,
                                   b["k"] + ko(j0), b["v"] + ko(j0), shape(j0, keys));
    }
  };
  d->ref_forward = [=](Host& h) {
    for (int b = 0; b < c.B; ++b)
      for (int hh = 0; hh < c.NH; ++hh) {
        const int kv = hh / (c.NH / c.NKV);
        for (int i = 0; i < c.Tq; ++i) {
          double lse = 0;
          const VecD p = ref_block_row(c, h.at("q"), h.at("k"), b, hh, i, lse);
          h.at("lse")[c.li(b, hh, i)] = lse;
          for (int e = 0; e < c.HD; ++e) {
            double o = 0;
            for (size_t j = 0; j < p.size(); ++j)
              o += p[j] * h.at("v")[c.ki(b, static_cast<int>(j), kv, e)];
            h.at("out")[c.qi(b, i, hh, e)] = o;
          }
        }
      }
  };
  // The op's formula on its inputs: D = rowsum(dout * out) from `out` as the backend holds
  // it (rounded to its dtype: a bf16 out's rounding is part of what the op is given, and
  // moves D by far more than the fp32 arithmetic does), P in float64.
  d->ref_backward = [=](Host& h) {
    const VecD &q = h.at("q"), &k = h.at("k"), &v = h.at("v"), &g = h.at("dout");
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.HD));
    for (int b = 0; b < c.B; ++b)
      for (int hh = 0; hh < c.NH; ++hh) {
        const int kv = hh / (c.NH / c.NKV);
        for (int i = 0; i < c.Tq; ++i) {
          double lse = 0, rowdot = 0;
          const VecD p = ref_block_row(c, q, k, b, hh, i, lse);
          const int n = static_cast<int>(p.size());
          for (int e = 0; e < c.HD; ++e)
            rowdot += g[c.qi(b, i, hh, e)] * detail::stored(h.at("out")[c.qi(b, i, hh, e)], G);
          VecD dp(p.size(), 0.0);
          for (int j = 0; j < n; ++j) {
            for (int e = 0; e < c.HD; ++e) {
              dp[sz(j)] += g[c.qi(b, i, hh, e)] * v[c.ki(b, j, kv, e)];
              h.at("dv")[c.ki(b, j, kv, e)] += p[sz(j)] * g[c.qi(b, i, hh, e)];
            }
          }
          for (int j = 0; j < n; ++j) {
            const double ds = p[sz(j)] * (dp[sz(j)] - rowdot) * scale;
            for (int e = 0; e < c.HD; ++e) {
              h.at("dq")[c.qi(b, i, hh, e)] += ds * k[c.ki(b, j, kv, e)];
              h.at("dk")[c.ki(b, j, kv, e)] += ds * q[c.qi(b, i, hh, e)];
            }
          }
        }
      }
  };
  // The gradcheck and the reference's own check project every element of out: a strided
  // entry's rows between blocks keep their NaN prefill, so only contiguous entries get
  // them (the float64 backward of a strided entry is the one they check).
  if (!c.strided()) {
    d->wrt = {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}};
    d->project = {{"out", "dout"}};
  }
  return d;
}

std::vector<Def> attention_block_defs(DType F) {
  // {B, Tq, Tk, NH, NKV, HD, q_pos, k_pos, q_off, q_rows, k_off, kv_rows, split}
  return {
      attention_block(F, {2, 5, 5, 4, 2, 3, 7, 7}),          // a causal diagonal block, GQA
      attention_block(F, {1, 4, 6, 2, 2, 5, 10, 0}),         // full, Tq != Tk
      attention_block(F, {2, 6, 4, 4, 1, 4, 0, 2}),          // rows 0, 1 masked, the rest partial
      attention_block(F, {1, 3, 4, 2, 1, 3, 0, 5}),          // every row masked
      attention_block(F, {2, 70, 70, 2, 1, 3, 0, 0}),        // past the CPU's 64-row blocks
      // A rank's blocks of ring attention with chunks of 3 rows (c = 3, rows 2c = 6): its
      // second chunk's queries over both of its chunks (causal, a virtual offset of c), all
      // its queries over a lower rank's first chunk (full), its second chunk over a higher
      // rank's both (full).
      attention_block(F, {2, 3, 6, 4, 2, 3, 3, 0, 3, 6, 0, 6}),
      attention_block(F, {2, 6, 3, 4, 2, 3, 3, 0, 0, 6, 0, 6}),
      attention_block(F, {2, 3, 6, 4, 2, 3, 6, 0, 3, 6, 0, 6}),
      // Two key blocks merged: causal, the first half of a row's keys in block one; full
      // with Tq != Tk; and rows 0, 1 that see no key of the second block (a -inf merged).
      attention_block(F, {2, 7, 7, 2, 1, 4, 0, 0, 0, 0, 0, 0, 3}),
      attention_block(F, {1, 4, 9, 4, 2, 3, 12, 0, 0, 0, 0, 0, 5}),
      attention_block(F, {2, 6, 6, 2, 2, 3, 0, 0, 0, 0, 0, 0, 2}),
      // Merged and strided: the second block masked for row 0 and in part for the others.
      attention_block(F, {1, 3, 6, 2, 1, 4, 6, 4, 0, 6, 0, 6, 3}),
      without(attention_block(F, {2, 5, 5, 4, 2, 3, 7, 7}), {"dq", "dk"}),
  };
}

// The merge alone, with running and block rows of every kind: both seen keys, one of
// them -inf (the other copied), both -inf (out becomes 0); rows q_off.. of q_rows.
Def attention_merge(DType F, int B, int Tq, int NH, int HD, int q_off, int q_rows) {
  auto d = make("attention_block_merge", dtype_name(F),
                dims({{"B", B}, {"Tq", Tq}, {"NH", NH}, {"HD", HD}, {"qoff", q_off},
                      {"qrows", q_rows}}));
  const size_t nq = sz(B) * q_rows * NH * HD, nl = sz(B) * NH * q_rows;
  const double inf = std::numeric_limits<double>::infinity();
  auto lse_values = [&](int every, int salt) {
    VecD v(nl);
    for (size_t r = 0; r < nl; ++r)
      v[r] = r % sz(every) == sz(salt) ? -inf : 2.5 * std::sin(static_cast<double>(r * 7 + salt));
    return v;
  };
  d->args = {arg("out", F, nq, Role::kInOut), given("lse", kF32, lse_values(4, 1), Role::kInOut),
             arg("block_out", F, nq, Role::kIn), given("block_lse", kF32, lse_values(3, 2))};
  d->forward = [=](Ops& ops, const Bufs& b) {
    Ops::AttentionBlock s;
    s.B = B, s.Tq = Tq, s.q_rows = q_rows, s.NH = NH, s.HD = HD;
    const size_t qo = sz(q_off) * NH * HD;
    ops.attention_block_merge(b["out"] + qo, b["lse"] + sz(q_off), b["block_out"] + qo,
                              b["block_lse"] + sz(q_off), s);
  };
  d->ref_forward = [=](Host& h) {
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < NH; ++hh)
        for (int i = q_off; i < q_off + Tq; ++i) {
          double& l = h.at("lse")[(sz(b) * NH + hh) * q_rows + i];
          const double bl = h.at("block_lse")[(sz(b) * NH + hh) * q_rows + i];
          const double merged = std::log(std::exp(l) + std::exp(bl));  // log(0) = -inf
          for (int e = 0; e < HD; ++e) {
            const size_t x = ((sz(b) * q_rows + i) * NH + hh) * HD + e;
            double& o = h.at("out")[x];
            o = std::isinf(merged) ? 0.0
                                   : std::exp(l - merged) * o +
                                         std::exp(bl - merged) * h.at("block_out")[x];
          }
          l = merged;
        }
  };
  return d;
}

// With q_pos = k_pos and Tq = Tk = T the block forward is attention_forward (its lse is
// checked by the table).
TEST(OpTableBlockAttention, CausalDiagonalBlockEqualsAttentionForward) {
  expect_equals_attention_forward_everywhere(
      "block", 6, [](Ops& ops, DevPtr out, DevPtr q, DevPtr k, DevPtr v, const AttnShape& s) {
        Ops::AttentionBlock b;
        b.B = s.B, b.Tq = s.T, b.Tk = s.T, b.q_pos = 3, b.k_pos = 3, b.NH = s.NH,
        b.NKV = s.NKV, b.HD = s.HD;
        DeviceBuffer lse(ops, sz(s.B) * s.NH * s.T * sizeof(float));
        ops.attention_block_forward(out, lse.as(kF32), q, k, v, b);
      });
}

// The checked backend refuses a buffer shorter than the block's rows at their strides: a
// key block of 4 rows at a stride of 6 needs 6 + 4 rows for two sequences, not 9.
TEST(OpTableBlockAttention, CheckedBackendRefusesAShortStridedBuffer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto ops = make_cpu_ops(1, /*checked=*/true);
  Ops::AttentionBlock s;
  s.B = 2, s.Tq = 4, s.Tk = 4, s.q_rows = 6, s.kv_rows = 6, s.NH = 1, s.NKV = 1, s.HD = 4;
  DeviceBuffer q(*ops, sz(10) * 16), out(*ops, sz(10) * 16), lse(*ops, sz(10) * 4);
  DeviceBuffer k(*ops, sz(10) * 16), short_v(*ops, sz(9) * 16);
  EXPECT_DEATH(ops->attention_block_forward(out.as(kF32), lse.as(kF32), q.as(kF32), k.as(kF32),
                                            short_v.as(kF32), s),
               "cpu-checked attention_block_forward: argument v is not 160 bytes");
}

// ---- pointwise ------------------------------------------------------------------
double gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

Def gelu_def(DType F, size_t n) {
  auto d = make("gelu", dtype_name(F), n_label(n));
  d->args = {arg("out", F, n, Role::kOut), arg("inp", F, n, Role::kIn, -3, 3),
             arg("dout", F, n, Role::kGradIn), arg("dinp", F, n, Role::kGradOut)};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.gelu_forward(b["out"], b["inp"], n); };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.gelu_backward(b["dinp"], b["dout"], b["inp"], n);
  };
  d->ref_forward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) h.at("out")[i] = gelu(h.at("inp")[i]);
  };
  d->ref_backward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) h.at("dinp")[i] += h.at("dout")[i] * gelu_grad(h.at("inp")[i]);
  };
  d->wrt = {{"inp", "dinp"}};
  d->project = {{"out", "dout"}};
  return d;
}

Def swiglu(DType F, size_t n) {
  auto d = make("swiglu", dtype_name(F), n_label(n));
  d->args = {arg("out", F, n, Role::kOut),       arg("gate", F, n, Role::kIn, -3, 3),
             arg("up", F, n, Role::kIn),         arg("dout", F, n, Role::kGradIn),
             arg("dgate", F, n, Role::kGradOut), arg("dup", F, n, Role::kGradOut)};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.swiglu_forward(b["out"], b["gate"], b["up"], n);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.swiglu_backward(b["dgate"], b["dup"], b["dout"], b["gate"], b["up"], n);
  };
  d->ref_forward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) {
      const double g = h.at("gate")[i];
      h.at("out")[i] = g / (1.0 + std::exp(-g)) * h.at("up")[i];
    }
  };
  d->ref_backward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) {
      const double g = h.at("gate")[i], u = h.at("up")[i], go = h.at("dout")[i];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      h.at("dgate")[i] += go * u * sig * (1.0 + g * (1.0 - sig));
      h.at("dup")[i] += go * g * sig;
    }
  };
  d->wrt = {{"gate", "dgate"}, {"up", "dup"}};
  d->project = {{"out", "dout"}};
  return d;
}

// add, accumulate and scale are one fp32 operation rounded once to the output's dtype:
// exact (op_table.h, exact_want).

// out = a + b; `alias_a`: out is a's buffer.
Def add(DType F, size_t n, bool alias_a) {
  auto d = make("add", dtype_name(F), n_label(n) + (alias_a ? "_inplace" : ""));
  d->args = {arg("a", F, n, Role::kIn), arg("b", F, n, Role::kIn),
             exact(alias_a ? aliased("out", "a", F, n, Role::kOut)
                           : arg("out", F, n, Role::kOut))};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.add(b["out"], b["a"], b["b"], n); };
  d->ref_forward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) h.at("out")[i] = h.at("a")[i] + h.at("b")[i];
  };
  return d;
}

Def accumulate(DType dst, DType src, size_t n) {
  auto d = make("accumulate",
                dst == src ? dtype_name(dst)
                           : std::string("mixed_dst") + dtype_name(dst) + "_src" + dtype_name(src),
                n_label(n));
  d->args = {exact(arg("dst", dst, n, Role::kInOut)), arg("src", src, n, Role::kIn)};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.accumulate(b["dst"], b["src"], n); };
  d->ref_forward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) h.at("dst")[i] += h.at("src")[i];
  };
  return d;
}

Def scale(DType F, size_t n, float s) {
  auto d = make("scale", dtype_name(F), n_label(n));
  d->args = {exact(arg("x", F, n, Role::kInOut))};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.scale(b["x"], s, n); };
  d->ref_forward = [=](Host& h) {
    for (auto& x : h.at("x")) x *= s;
  };
  return d;
}

// ---- loss -----------------------------------------------------------------------
constexpr float kDloss = 0.7f;

Def cross_entropy(DType F, int N, int V, int Vp, bool inplace) {
  auto d = make("cross_entropy", dtype_name(F),
                dims({{"N", N}, {"V", V}, {"Vp", Vp}}) + (inplace ? "_inplace" : ""));
  d->args = {arg("losses", kF32, sz(N), Role::kOut), arg("logits", F, sz(N) * Vp, Role::kIn, -2, 2),
             given("targets", kI32, ids(N, V, 1)),
             clears_padding(inplace ? aliased("dlogits", "logits", F, sz(N) * Vp, Role::kGradSet)
                                    : arg("dlogits", F, sz(N) * Vp, Role::kGradSet))};
  d->reduction = sz(V);
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.cross_entropy_forward(b["losses"], b["logits"], b["targets"], N, V, Vp);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.cross_entropy_backward(b["dlogits"], b["logits"], b["targets"], kDloss, N, V, Vp);
  };
  d->ref_forward = [=](Host& h) {
    for (int n = 0; n < N; ++n)
      h.at("losses")[sz(n)] = ref_xent_row(&h.at("logits")[sz(n) * Vp], V,
                                           static_cast<int>(h.at("targets")[sz(n)]), 0.0, nullptr);
  };
  d->ref_backward = [=](Host& h) {
    for (int n = 0; n < N; ++n) {
      double* dl = &h.at("dlogits")[sz(n) * Vp];
      ref_xent_row(&h.at("logits")[sz(n) * Vp], V, static_cast<int>(h.at("targets")[sz(n)]),
                   kDloss, dl);
      for (int v = V; v < Vp; ++v) dl[v] = 0.0;
    }
  };
  d->wrt = {{"logits", "dlogits"}};
  d->project = {{"losses", ""}};
  d->uniform_weight = kDloss;
  return d;
}

// The vocab-parallel pieces on one rank holding global columns [vb, vb + Vpl).
std::string rank_shape(int N, int Vpl, int vb, int V) {
  return dims({{"N", N}, {"Vpl", Vpl}, {"vb", vb}, {"V", V}});
}
int real_columns(int Vpl, int vb, int V) { return std::clamp(V - vb, 0, Vpl); }

Def xent_local_max(DType F, int N, int Vpl, int vb, int V) {
  auto d = make("xent_local_max", dtype_name(F), rank_shape(N, Vpl, vb, V));
  d->args = {exact(arg("row_max", kF32, sz(N), Role::kOut)),
             arg("logits", F, sz(N) * Vpl, Role::kIn, -2, 2)};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.xent_local_max(b["row_max"], b["logits"], N, Vpl, vb, V);
  };
  d->ref_forward = [=](Host& h) {
    const int real = real_columns(Vpl, vb, V);
    for (int n = 0; n < N; ++n) {
      double mx = -FLT_MAX;
      for (int v = 0; v < real; ++v) mx = std::max(mx, h.at("logits")[sz(n) * Vpl + v]);
      h.at("row_max")[sz(n)] = mx;
    }
  };
  return d;
}

Def xent_local_sums(DType F, int N, int Vpl, int vb, int V) {
  auto d = make("xent_local_sums", dtype_name(F), rank_shape(N, Vpl, vb, V));
  d->args = {arg("sum_exp", kF32, sz(N), Role::kOut),
             exact(arg("target_logit", kF32, sz(N), Role::kOut)),
             arg("logits", F, sz(N) * Vpl, Role::kIn, -2, 2),
             arg("row_max", kF32, sz(N), Role::kIn, 1, 2), given("targets", kI32, ids(N, V, 5))};
  d->reduction = sz(Vpl);
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.xent_local_sums(b["sum_exp"], b["target_logit"], b["logits"], b["row_max"], b["targets"], N,
                        Vpl, vb, V);
  };
  d->ref_forward = [=](Host& h) {
    const int real = real_columns(Vpl, vb, V);
    for (int n = 0; n < N; ++n) {
      const double* x = &h.at("logits")[sz(n) * Vpl];
      double s = 0;
      for (int v = 0; v < real; ++v) s += std::exp(x[v] - h.at("row_max")[sz(n)]);
      const int t = static_cast<int>(h.at("targets")[sz(n)]) - vb;
      h.at("sum_exp")[sz(n)] = s;
      h.at("target_logit")[sz(n)] = t >= 0 && t < real ? x[t] : 0.0;
    }
  };
  return d;
}

Def xent_local_backward(DType F, int N, int Vpl, int vb, int V, bool inplace) {
  auto d = make("xent_local_backward", dtype_name(F),
                rank_shape(N, Vpl, vb, V) + (inplace ? "_inplace" : ""));
  d->args = {arg("logits", F, sz(N) * Vpl, Role::kIn, -2, 2),
             clears_padding(inplace ? aliased("dlogits", "logits", F, sz(N) * Vpl, Role::kOut)
                                    : arg("dlogits", F, sz(N) * Vpl, Role::kOut)),
             arg("row_max", kF32, sz(N), Role::kIn, 1, 2),
             arg("sum_exp", kF32, sz(N), Role::kIn, 1, 8), given("targets", kI32, ids(N, V, 5))};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.xent_local_backward(b["dlogits"], b["logits"], b["row_max"], b["sum_exp"], b["targets"],
                            kDloss, N, Vpl, vb, V);
  };
  d->ref_forward = [=](Host& h) {
    const int real = real_columns(Vpl, vb, V);
    const VecD x = h.at("logits");  // dlogits may be the same host copy's twin
    for (int n = 0; n < N; ++n) {
      const int t = static_cast<int>(h.at("targets")[sz(n)]) - vb;
      for (int v = 0; v < Vpl; ++v) {
        const size_t i = sz(n) * Vpl + v;
        h.at("dlogits")[i] =
            v < real ? kDloss * (std::exp(x[i] - h.at("row_max")[sz(n)]) / h.at("sum_exp")[sz(n)] -
                                 (v == t ? 1.0 : 0.0))
                     : 0.0;
      }
    }
  };
  return d;
}

Def xent_finish(int N) {
  auto d = make("xent_finish", "f32", dims({{"N", N}}));
  d->args = {arg("losses", kF32, sz(N), Role::kOut), arg("row_max", kF32, sz(N), Role::kIn),
             arg("sum_exp", kF32, sz(N), Role::kIn, 0.5, 8),
             arg("target_logit", kF32, sz(N), Role::kIn)};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.xent_finish(b["losses"], b["row_max"], b["sum_exp"], b["target_logit"], N);
  };
  d->ref_forward = [=](Host& h) {
    for (size_t n = 0; n < sz(N); ++n)
      h.at("losses")[n] =
          std::log(h.at("sum_exp")[n]) + h.at("row_max")[n] - h.at("target_logit")[n];
  };
  return d;
}

// The whole vocab-parallel cross-entropy over R ranks of Vpl columns each (global V real
// columns), as the model runs it: local max, all-reduce max, local sums, all-reduce sum,
// finish; backward per rank. The all-reduces are done here on the host, in rank order.
// logits and dlogits hold rank r's [N, Vpl] block at r * N * Vpl.
Def xent_parallel(DType F, int N, int R, int Vpl, int V) {
  auto d = make("xent_parallel", dtype_name(F), dims({{"N", N}, {"R", R}, {"Vpl", Vpl}, {"V", V}}));
  const size_t block = sz(N) * Vpl;
  d->args = {arg("logits", F, block * R, Role::kIn, -2, 2),
             given("targets", kI32, ids(N, V, 2)),
             arg("part_max", kF32, sz(N) * R, Role::kState),
             arg("part_sum", kF32, sz(N) * R, Role::kState),
             arg("part_tl", kF32, sz(N) * R, Role::kState),
             exact(arg("row_max", kF32, sz(N), Role::kOut)),
             arg("sum_exp", kF32, sz(N), Role::kOut),
             exact(arg("target_logit", kF32, sz(N), Role::kOut)),
             arg("losses", kF32, sz(N), Role::kOut),
             clears_padding(arg("dlogits", F, block * R, Role::kGradSet))};
  d->reduction = sz(V);
  d->forward = [=](Ops& ops, const Bufs& b) {
    std::vector<float> part(sz(N) * R), a(sz(N)), c(sz(N));
    for (int r = 0; r < R; ++r)
      ops.xent_local_max(b["part_max"] + sz(r) * N, b["logits"] + block * r, N, Vpl, r * Vpl, V);
    ops.download(part.data(), b["part_max"], part.size() * sizeof(float));
    for (int n = 0; n < N; ++n) {
      a[sz(n)] = -FLT_MAX;
      for (int r = 0; r < R; ++r) a[sz(n)] = std::max(a[sz(n)], part[sz(r) * N + n]);
    }
    ops.upload(b["row_max"], a.data(), a.size() * sizeof(float));
    for (int r = 0; r < R; ++r)
      ops.xent_local_sums(b["part_sum"] + sz(r) * N, b["part_tl"] + sz(r) * N,
                          b["logits"] + block * r, b["row_max"], b["targets"], N, Vpl, r * Vpl, V);
    std::vector<float> tl(part.size());
    ops.download(part.data(), b["part_sum"], part.size() * sizeof(float));
    ops.download(tl.data(), b["part_tl"], tl.size() * sizeof(float));
    for (int n = 0; n < N; ++n) {
      a[sz(n)] = c[sz(n)] = 0.0f;
      for (int r = 0; r < R; ++r) {
        a[sz(n)] += part[sz(r) * N + n];
        c[sz(n)] += tl[sz(r) * N + n];
      }
    }
    ops.upload(b["sum_exp"], a.data(), a.size() * sizeof(float));
    ops.upload(b["target_logit"], c.data(), c.size() * sizeof(float));
    ops.xent_finish(b["losses"], b["row_max"], b["sum_exp"], b["target_logit"], N);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    for (int r = 0; r < R; ++r)
      ops.xent_local_backward(b["dlogits"] + block * r, b["logits"] + block * r, b["row_max"],
                              b["sum_exp"], b["targets"], kDloss, N, Vpl, r * Vpl, V);
  };
  // The real row of n, gathered from the ranks.
  auto row = [=](const VecD& logits, int n) {
    VecD x(sz(V));
    for (int g = 0; g < V; ++g) x[sz(g)] = logits[block * (g / Vpl) + sz(n) * Vpl + g % Vpl];
    return x;
  };
  d->ref_forward = [=](Host& h) {
    for (int n = 0; n < N; ++n) {
      const VecD x = row(h.at("logits"), n);
      const int t = static_cast<int>(h.at("targets")[sz(n)]);
      double mx = -1e300, sum = 0;
      for (double e : x) mx = std::max(mx, e);
      for (double e : x) sum += std::exp(e - mx);
      h.at("row_max")[sz(n)] = mx;
      h.at("sum_exp")[sz(n)] = sum;
      h.at("target_logit")[sz(n)] = x[sz(t)];
      h.at("losses")[sz(n)] = std::log(sum) + mx - x[sz(t)];
    }
  };
  d->ref_backward = [=](Host& h) {
    VecD& dl = h.at("dlogits");
    std::fill(dl.begin(), dl.end(), 0.0);  // padded columns
    for (int n = 0; n < N; ++n) {
      const VecD x = row(h.at("logits"), n);
      VecD g(sz(V));
      ref_xent_row(x.data(), V, static_cast<int>(h.at("targets")[sz(n)]), kDloss, g.data());
      for (int c = 0; c < V; ++c) dl[block * (c / Vpl) + sz(n) * Vpl + c % Vpl] = g[sz(c)];
    }
  };
  d->wrt = {{"logits", "dlogits"}};
  d->project = {{"losses", ""}};
  d->uniform_weight = kDloss;
  return d;
}

// acc (f64) += float(sum_n losses[n] / N), the sum in double in row order: the contract
// fixes the arithmetic, so the result is exact.
Def loss_accumulate(int N) {
  auto d = make("loss_accumulate", "f32", dims({{"N", N}}));
  d->args = {exact(arg("acc", kF64, 1, Role::kInOut, 0, 1)),
             arg("losses", kF32, sz(N), Role::kIn, 0, 4)};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.loss_accumulate(b["acc"], b["losses"], N); };
  d->ref_forward = [=](Host& h) {
    double s = 0;
    for (double l : h.at("losses")) s += l;
    h.at("acc")[0] += static_cast<float>(s / N);
  };
  return d;
}

// ---- optimizer ------------------------------------------------------------------
Def adamw(size_t n, bool compute_copy, int step = 3) {
  std::string shape = n_label(n);
  if (step != 3) shape.append("_step").append(std::to_string(step));
  auto d = make("adamw_update", compute_copy ? "bf16copy" : "f32", shape);
  d->args = {arg("param", kF32, n, Role::kInOut), arg("grad", kF32, n, Role::kIn),
             arg("m", kF32, n, Role::kInOut, -0.1, 0.1), arg("v", kF32, n, Role::kInOut, 0, 0.01)};
  if (compute_copy) d->args.push_back(arg("copy", kBF16, n, Role::kOut));
  AdamWParams p;
  p.lr = 0.01f;
  p.weight_decay = 0.1f;
  p.step = step;
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.adamw_update(b["param"], b["grad"], b["m"], b["v"], compute_copy ? b["copy"] : DevPtr(), n,
                     p);
  };
  d->ref_forward = [=](Host& h) {
    const double b1 = p.beta1, b2 = p.beta2;
    const double bc1 = 1.0 - std::pow(b1, p.step), bc2 = 1.0 - std::pow(b2, p.step);
    for (size_t i = 0; i < n; ++i) {
      const double g = h.at("grad")[i];
      double& m = h.at("m")[i];
      double& v = h.at("v")[i];
      double& w = h.at("param")[i];
      m = b1 * m + (1.0 - b1) * g;
      v = b2 * v + (1.0 - b2) * g * g;
      w -=
          static_cast<double>(p.lr) * (m / bc1 / (std::sqrt(v / bc2) + static_cast<double>(p.eps)) +
                                       static_cast<double>(p.weight_decay) * w);
      if (compute_copy) h.at("copy")[i] = w;  // rounded by the op: the bf16 tolerance
    }
  };
  return d;
}

// acc (f64) += sum of x^2 in double: exact products, a sum of n doubles (relative 1e-16).
Def sum_squares(DType F, size_t n) {
  auto d = make("sum_squares_accumulate", dtype_name(F), n_label(n));
  Arg acc = arg("acc", kF64, 1, Role::kInOut, 0, 1);
  acc.tol = 1e-12;
  d->args = {acc, arg("x", F, n, Role::kIn)};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.sum_squares_accumulate(b["acc"], b["x"], n); };
  d->ref_forward = [=](Host& h) {
    for (double x : h.at("x")) h.at("acc")[0] += x * x;
  };
  return d;
}

// ---- mixture of experts --------------------------------------------------------
// The router's float64 reference: softmax, top K by descending probability with the lowest
// index winning a tie, the K probabilities renormalised.
struct RefRoute {
  VecD probs, lse, weights;
  std::vector<int> experts;
};
RefRoute ref_route(const VecD& logits, int N, int E, int K) {
  RefRoute r;
  r.probs.resize(sz(N) * E);
  r.lse.resize(sz(N));
  r.weights.resize(sz(N) * K);
  r.experts.resize(sz(N) * K);
  for (int n = 0; n < N; ++n) {
    const double* x = &logits[sz(n) * E];
    double m = x[0], sum = 0;
    for (int e = 1; e < E; ++e) m = std::max(m, x[e]);
    for (int e = 0; e < E; ++e) sum += std::exp(x[e] - m);
    r.lse[sz(n)] = m + std::log(sum);
    for (int e = 0; e < E; ++e) r.probs[sz(n) * E + e] = std::exp(x[e] - m) / sum;
    std::vector<int> idx(sz(E));
    for (int e = 0; e < E; ++e) idx[sz(e)] = e;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b]; });
    double kept = 0;
    for (int j = 0; j < K; ++j) kept += r.probs[sz(n) * E + idx[sz(j)]];
    for (int j = 0; j < K; ++j) {
      r.experts[sz(n) * K + j] = idx[sz(j)];
      r.weights[sz(n) * K + j] = r.probs[sz(n) * E + idx[sz(j)]] / kept;
    }
  }
  return r;
}

// Logits with ties: each row repeats some of its values, so the top K must take the lowest
// index among equals (forward only: the choice has no gradient to check at a tie).
VecD tied_logits(int N, int E) {
  VecD v(sz(N) * E);
  for (int n = 0; n < N; ++n)
    for (int e = 0; e < E; ++e) v[sz(n) * E + e] = 0.25 * ((n + e * (n % 3 + 1)) % 3) - 0.5;
  return v;
}

Def moe_route(DType F, int N, int E, int K, double z_scale, bool ties) {
  auto d = make("moe_route", dtype_name(F),
                dims({{"N", N}, {"E", E}, {"K", K}}) + (ties ? "_ties" : "") +
                    (z_scale != 0 ? "_z" : ""));
  // Fixed logits (the z-loss's projection weights are 2 z lse at them), or tied ones.
  std::mt19937 gen(static_cast<unsigned>(N * 31 + E * 7 + K));
  std::uniform_real_distribution<double> dist(-2, 2);
  VecD logits = ties ? tied_logits(N, E) : VecD(sz(N) * E);
  if (!ties)
    for (double& x : logits) x = detail::stored(dist(gen), F);
  VecD prob_grad(sz(E)), rows(sz(N) * E), dlse(sz(N));
  for (int e = 0; e < E; ++e) prob_grad[sz(e)] = detail::stored(0.3 * dist(gen), kF32);
  for (int n = 0; n < N; ++n)
    for (int e = 0; e < E; ++e) rows[sz(n) * E + e] = prob_grad[sz(e)];
  const RefRoute at = ref_route(logits, N, E, K);
  for (int n = 0; n < N; ++n) dlse[sz(n)] = 2 * z_scale * at.lse[sz(n)];
  Arg experts = exact(arg("experts", kI32, sz(N) * K, Role::kOut));
  d->args = {given("logits", F, logits),
             arg("weights", kF32, sz(N) * K, Role::kOut),
             experts,
             arg("probs", kF32, sz(N) * E, Role::kOut),
             arg("lse", kF32, sz(N), Role::kOut),
             arg("stats", kF32, sz(2 * E + 1), Role::kOut),
             arg("dweights", kF32, sz(N) * K, Role::kGradIn),
             given("prob_grad", kF32, prob_grad, Role::kGradIn),
             given("prob_grad_rows", kF32, rows, Role::kGradIn),  // its projection weights
             given("dlse", kF32, dlse, Role::kGradIn),             // the z-loss's
             arg("dlogits", F, sz(N) * E, Role::kGradOut)};
  d->reduction = sz(std::max(N, E));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.moe_route_forward(b["weights"], b["experts"], b["probs"], b["lse"], b["stats"],
                          b["logits"], N, E, K);
  };
  d->ref_forward = [=](Host& h) {
    const RefRoute r = ref_route(h.at("logits"), N, E, K);
    h.at("probs") = r.probs;
    h.at("lse") = r.lse;
    h.at("weights") = r.weights;
    VecD& st = h.at("stats");
    std::fill(st.begin(), st.end(), 0.0);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < K; ++j) {
        h.at("experts")[sz(n) * K + j] = r.experts[sz(n) * K + j];
        st[sz(r.experts[sz(n) * K + j])] += 1;
      }
      for (int e = 0; e < E; ++e) st[sz(E + e)] += r.probs[sz(n) * E + e];
      st[sz(2 * E)] += r.lse[sz(n)] * r.lse[sz(n)];
    }
  };
  if (ties) return d;  // forward only
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.moe_route_backward(b["dlogits"], b["dweights"], b["weights"], b["probs"], b["lse"],
                           b["experts"], b["prob_grad"], static_cast<float>(z_scale), N, E, K);
  };
  d->ref_backward = [=](Host& h) {
    const RefRoute r = ref_route(h.at("logits"), N, E, K);
    const VecD& dw = h.at("dweights");
    for (int n = 0; n < N; ++n) {
      VecD dp(sz(E));
      for (int e = 0; e < E; ++e) dp[sz(e)] = h.at("prob_grad")[sz(e)];
      double kept = 0, dot = 0;
      for (int j = 0; j < K; ++j) {
        kept += r.probs[sz(n) * E + r.experts[sz(n) * K + j]];
        dot += dw[sz(n) * K + j] * r.weights[sz(n) * K + j];
      }
      for (int j = 0; j < K; ++j) dp[sz(r.experts[sz(n) * K + j])] += (dw[sz(n) * K + j] - dot) / kept;
      double pdp = 0;
      for (int e = 0; e < E; ++e) pdp += r.probs[sz(n) * E + e] * dp[sz(e)];
      for (int e = 0; e < E; ++e) {
        const double p = r.probs[sz(n) * E + e];
        h.at("dlogits")[sz(n) * E + e] += p * (dp[sz(e)] - pdp) + 2 * z_scale * r.lse[sz(n)] * p;
      }
    }
  };
  d->wrt = {{"logits", "dlogits"}};
  d->project = {{"weights", "dweights"}, {"probs", "prob_grad_rows"}, {"lse", "dlse"}};
  d->fd_eps = 1e-3;
  return d;
}

// Distinct experts per token, unevenly loaded (expert E - 1 gets none when E > K + 1),
// and their dispatch (the stable counting sort the op defines).
VecD chosen_experts(int N, int K, int E) {
  VecD v(sz(N) * K);
  const int used = E > K + 1 ? E - 1 : E;
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < K; ++j) v[sz(n) * K + j] = (n * 5 + j * (n % 2 ? 1 : used - 1) + j) % used;
  // Make each row's choices distinct.
  for (int n = 0; n < N; ++n)
    for (int j = 1; j < K; ++j)
      for (int i = 0; i < j; ++i)
        if (v[sz(n) * K + j] == v[sz(n) * K + i]) {
          v[sz(n) * K + j] = std::fmod(v[sz(n) * K + j] + 1, used);
          i = -1;
        }
  return v;
}
void ref_dispatch(const VecD& experts, int N, int K, int E, VecD& order, VecD& position) {
  order.assign(sz(N) * K, 0);
  position.assign(sz(N) * K, 0);
  size_t row = 0;
  for (int e = 0; e < E; ++e)
    for (size_t a = 0; a < sz(N) * K; ++a)
      if (static_cast<int>(experts[a]) == e) {
        order[row] = static_cast<double>(a);
        position[a] = static_cast<double>(row++);
      }
}

Def moe_dispatch_def(int N, int K, int E) {
  auto d = make("moe_dispatch", "i32", dims({{"N", N}, {"K", K}, {"E", E}}));
  d->args = {given("experts", kI32, chosen_experts(N, K, E)),
             exact(arg("order", kI32, sz(N) * K, Role::kOut)),
             exact(arg("position", kI32, sz(N) * K, Role::kOut))};
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.moe_dispatch(b["order"], b["position"], b["experts"], N, K, E);
  };
  d->ref_forward = [=](Host& h) {
    ref_dispatch(h.at("experts"), N, K, E, h.at("order"), h.at("position"));
  };
  return d;
}

Def moe_gather(DType F, int N, int K, int E, int C) {
  auto d = make("moe_gather", dtype_name(F), dims({{"N", N}, {"K", K}, {"C", C}}));
  VecD order, position;
  ref_dispatch(chosen_experts(N, K, E), N, K, E, order, position);
  const size_t A = sz(N) * K;
  // A copy (exact); the backward sums K rows per token.
  d->args = {given("order", kI32, order), given("position", kI32, position),
             arg("inp", F, sz(N) * C, Role::kIn), exact(arg("out", F, A * C, Role::kOut)),
             arg("dout", F, A * C, Role::kGradIn), arg("dinp", F, sz(N) * C, Role::kGradOut)};
  d->reduction = sz(K);
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.moe_gather_forward(b["out"], b["inp"], b["order"], N, K, C);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.moe_gather_backward(b["dinp"], b["dout"], b["position"], N, K, C);
  };
  d->ref_forward = [=](Host& h) {
    for (size_t p = 0; p < A; ++p)
      for (int c = 0; c < C; ++c)
        h.at("out")[p * C + c] = h.at("inp")[sz(h.at("order")[p]) / K * C + c];
  };
  d->ref_backward = [=](Host& h) {
    for (size_t p = 0; p < A; ++p)
      for (int c = 0; c < C; ++c)
        h.at("dinp")[sz(h.at("order")[p]) / K * C + c] += h.at("dout")[p * C + c];
  };
  d->wrt = {{"inp", "dinp"}};
  d->project = {{"out", "dout"}};
  return d;
}

Def moe_combine(DType F, int N, int K, int E, int C) {
  auto d = make("moe_combine", dtype_name(F), dims({{"N", N}, {"K", K}, {"C", C}}));
  VecD order, position;
  ref_dispatch(chosen_experts(N, K, E), N, K, E, order, position);
  const size_t A = sz(N) * K;
  d->args = {given("position", kI32, position),     arg("inp", F, A * C, Role::kIn),
             arg("weights", kF32, A, Role::kIn, 0, 1), arg("out", F, sz(N) * C, Role::kOut),
             arg("dout", F, sz(N) * C, Role::kGradIn), arg("dinp", F, A * C, Role::kGradOut),
             arg("dweights", kF32, A, Role::kGradOut)};
  d->reduction = sz(std::max(K, C));
  d->forward = [=](Ops& ops, const Bufs& b) {
    ops.moe_combine_forward(b["out"], b["inp"], b["weights"], b["position"], N, K, C);
  };
  d->backward = [=](Ops& ops, const Bufs& b) {
    ops.moe_combine_backward(b["dinp"], b["dweights"], b["dout"], b["inp"], b["weights"],
                             b["position"], N, K, C);
  };
  d->ref_forward = [=](Host& h) {
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        double o = 0;
        for (int j = 0; j < K; ++j) {
          const size_t a = sz(n) * K + j;
          o += h.at("weights")[a] * h.at("inp")[sz(h.at("position")[a]) * C + c];
        }
        h.at("out")[sz(n) * C + c] = o;
      }
  };
  d->ref_backward = [=](Host& h) {
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < K; ++j) {
        const size_t a = sz(n) * K + j, row = sz(h.at("position")[a]) * C;
        for (int c = 0; c < C; ++c) {
          const double g = h.at("dout")[sz(n) * C + c];
          h.at("dinp")[row + c] += h.at("weights")[a] * g;
          h.at("dweights")[a] += g * h.at("inp")[row + c];
        }
      }
  };
  d->wrt = {{"inp", "dinp"}, {"weights", "dweights"}};
  d->project = {{"out", "dout"}};
  return d;
}

// ---- cast -----------------------------------------------------------------------
// dst = src converted: round to nearest even (f32 -> bf16), exact otherwise; the edge
// values (ties to even both ways, signed zero, infinities, NaN, a subnormal, overflow to
// inf) come first, then random f32 values that bf16 cannot hold.
Def cast(DType from, DType to) {
  VecD src = {0.0,      -0.0,      1.0, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, -(1.0 + 1.0 / 256),
              INFINITY, -INFINITY, NAN, 1e-40,           3.4e38,          1.0 / 3.0,
              -2.5e-3,  65504.0};
  std::mt19937 gen(17);
  std::uniform_real_distribution<double> dist(-4, 4);
  while (src.size() < 37) src.push_back(dist(gen));
  const size_t n = src.size();
  auto d = make("cast", std::string(dtype_name(from)) + "_to_" + dtype_name(to),
                n_label(n));
  d->args = {given("src", from, src), exact(arg("dst", to, n, Role::kOut))};
  d->forward = [=](Ops& ops, const Bufs& b) { ops.cast(b["dst"], b["src"], n); };
  d->ref_forward = [=](Host& h) {
    for (size_t i = 0; i < n; ++i) h.at("dst")[i] = detail::stored(h.at("src")[i], to);
  };
  return d;
}

// ---- the table ------------------------------------------------------------------
std::vector<Def> table_defs() {
  std::vector<Def> defs;
  for (DType F : {kF32, kBF16}) {
    // Vocabulary 13 padded to 15 rows: one rank holding the whole table; over 3 ranks of 5
    // the last (rows 10..14, 3 real), without wpe; and a rank past V (rows 15..19) holding
    // no real row, whose output is wpe alone.
    defs.push_back(embedding(F, 2, 5, 7, 13, 0, 15, true));
    defs.push_back(embedding(F, 2, 5, 7, 13, 10, 5, false));
    defs.push_back(embedding(F, 2, 5, 7, 13, 15, 5, true));
    // 21 tokens over 11 ids: repeated tokens scatter into one row; the whole table and
    // rows [4, 9) with wpe.
    defs.push_back(embedding(F, 3, 7, 13, 11, 0, 11, true));
    defs.push_back(embedding(F, 3, 7, 13, 11, 4, 5, true));
    defs.push_back(without(embedding(F, 2, 5, 7, 13, 0, 15, true), {"dwpe"}));
    defs.push_back(layernorm(F, 7, 13, true));
    defs.push_back(layernorm(F, 5, 6, false));
    defs.push_back(layernorm(F, 70, 16, true));  // dweight / dbias over three column chunks
    defs.push_back(without(layernorm(F, 7, 13, true), {"dweight", "dbias"}));
    defs.push_back(rmsnorm(F, 7, 13));
    defs.push_back(without(rmsnorm(F, 7, 13), {"dinp"}));
    defs.push_back(matmul(F, F, 7, 13, 5, true));
    defs.push_back(matmul(F, F, 5, 7, 13, false));
    defs.push_back(without(matmul(F, F, 7, 13, 5, true), {"dinp", "dbias"}));
    // Rows of 8-element multiples: the CUDA backend runs these through cuBLASLt (the odd
    // shapes above take its simple kernel), and dbias over 40 rows takes two column chunks.
    defs.push_back(matmul(F, F, 40, 32, 24, true));
    defs.push_back(matmul(F, F, 7, 13, 5, true, GradWrite::kSet));
    defs.push_back(matmul(F, F, 40, 32, 24, true, GradWrite::kSet));
    defs.push_back(rope(F, 2, 5, 3, 6, 0));
    defs.push_back(rope(F, 1, 3, 2, 8, 7));
    defs.push_back(qkv(F, 2, 5, 3, 1, 6, 0, true));   // GQA
    defs.push_back(qkv(F, 1, 3, 2, 2, 8, 7, true));   // MHA at position 7
    defs.push_back(qkv(F, 2, 4, 4, 2, 4, 0, false));  // no rotation: copies only
    defs.push_back(attention(F, {2, 5, 3, 3, 4}));  // MHA
    defs.push_back(attention(F, {1, 7, 4, 2, 5}));  // GQA, odd T, odd head_dim
    defs.push_back(attention(F, {2, 1, 2, 1, 3}));  // T = 1
    defs.push_back(attention(F, {3, 7, 6, 2, 6}));  // GQA, 3 query heads per kv head
    defs.push_back(attention(F, {1, 150, 2, 2, 8}));  // past the CPU kernel's 64-row blocks
    defs.push_back(without(attention(F, {2, 5, 3, 3, 4}), {"dq", "dk"}));
    for (Def d : attention_cached_defs(F)) defs.push_back(d);
    for (Def d : attention_block_defs(F)) defs.push_back(d);
    defs.push_back(attention_merge(F, 2, 5, 3, 4, 0, 5));
    defs.push_back(attention_merge(F, 2, 3, 2, 5, 3, 6));  // a rank's second chunk
    defs.push_back(gelu_def(F, 37));
    defs.push_back(swiglu(F, 29));
    defs.push_back(without(swiglu(F, 29), {"dgate"}));
    defs.push_back(moe_route(F, 7, 5, 2, 0.0, false));
    defs.push_back(moe_route(F, 6, 4, 1, 0.0, false));
    defs.push_back(moe_route(F, 5, 6, 3, 0.05, false));  // with the z-loss
    defs.push_back(moe_route(F, 9, 4, 2, 0.0, true));    // ties: the lowest index wins
    defs.push_back(moe_route(F, 9, 6, 4, 0.0, true));
    defs.push_back(moe_gather(F, 7, 2, 5, 6));
    defs.push_back(moe_gather(F, 5, 3, 4, 9));
    defs.push_back(moe_combine(F, 7, 2, 5, 6));
    defs.push_back(moe_combine(F, 5, 3, 4, 9));
    defs.push_back(without(moe_combine(F, 7, 2, 5, 6), {"dweights"}));
    defs.push_back(without(moe_combine(F, 7, 2, 5, 6), {"dinp"}));
    defs.push_back(add(F, 31, false));
    defs.push_back(add(F, 31, true));
    defs.push_back(accumulate(F, F, 31));
    defs.push_back(scale(F, 31, -0.37f));
    defs.push_back(cross_entropy(F, 5, 13, 16, false));  // padded vocabulary
    defs.push_back(cross_entropy(F, 3, 7, 7, true));     // dlogits aliases logits
    defs.push_back(cross_entropy(F, 5, 13, 16, true));   // aliased, padded
    // Vocab-parallel: V = 13 over ranks of 6 columns (Vp 18): a whole rank, the rank
    // with 1 real column and 5 padded, a slice that starts at V, and over ranks of 5
    // (Vp 20) the rank holding columns 15..19, none of them real.
    for (auto [Vpl, vb] :
         {std::pair{6, 0}, std::pair{6, 12}, std::pair{6, 13}, std::pair{5, 15}}) {
      defs.push_back(xent_local_max(F, 5, Vpl, vb, 13));
      defs.push_back(xent_local_sums(F, 5, Vpl, vb, 13));
      defs.push_back(xent_local_backward(F, 5, Vpl, vb, 13, false));
    }
    defs.push_back(xent_local_backward(F, 5, 6, 6, 13, true));
    defs.push_back(xent_parallel(F, 5, 3, 6, 13));
    defs.push_back(xent_parallel(F, 4, 4, 5, 13));
    // Vp 32 cut into 1 to 8 slices for V = 27, 20, 16 and 1: slices that are all padding,
    // starting at V or past it, and a vocabulary of one.
    for (auto [V, R] : {std::pair{27, 1}, std::pair{27, 2}, std::pair{27, 4}, std::pair{27, 8},
                        std::pair{20, 4}, std::pair{16, 2}, std::pair{16, 4}, std::pair{1, 4}})
      defs.push_back(xent_parallel(F, 37, R, 32 / R, V));
    defs.push_back(sum_squares(F, 0));
    defs.push_back(sum_squares(F, 37));
    // Past the kernels' parallel threshold (2^15 elements): threaded and chunked paths.
    // (No gradcheck there: the small entries check the formulas.)
    defs.push_back(sum_squares(F, 40001));
    defs.push_back(add(F, 40001, false));
    defs.push_back(accumulate(F, F, 40001));
    defs.push_back(scale(F, 40001, -0.37f));
    defs.push_back(gelu_def(F, 33001));
    defs.back()->gradcheck = false;
  }
  // The dispatch is integers only; experts left without a token and a single expert.
  defs.push_back(moe_dispatch_def(7, 2, 5));
  defs.push_back(moe_dispatch_def(6, 3, 3));
  defs.push_back(moe_dispatch_def(4, 1, 1));
  // F chosen per argument: bf16 activations with f32 weights, and the reverse; a bf16
  // gradient accumulated into an f32 one and vice versa.
  defs.push_back(matmul(kBF16, kF32, 7, 13, 5, true));
  defs.push_back(matmul(kF32, kBF16, 7, 13, 5, true));
  // The same through cuBLASLt on CUDA: the bf16 operand widened to f32, an f32 GEMM, the
  // bf16 output (and bias) rounded once.
  defs.push_back(matmul(kBF16, kF32, 16, 32, 24, true));
  defs.push_back(matmul(kF32, kBF16, 16, 32, 24, true));
  defs.push_back(matmul(kBF16, kF32, 16, 32, 24, true, GradWrite::kSet));
  defs.push_back(accumulate(kF32, kBF16, 31));
  defs.push_back(accumulate(kBF16, kF32, 31));
  defs.push_back(xent_finish(7));
  defs.push_back(loss_accumulate(7));
  defs.push_back(adamw(37, false));
  defs.push_back(adamw(37, true));
  defs.push_back(adamw(40001, true));
  defs.push_back(adamw(37, false, 1));  // the first step's bias correction
  for (DType from : {kF32, kBF16})
    for (DType to : {kF32, kBF16}) defs.push_back(cast(from, to));
  return defs;
}

const std::vector<OpCase>& table() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> all;
    for (const Def& d : table_defs())
      for (OpCase& c : cases_of(d)) all.push_back(std::move(c));
    return all;
  }();
  return cases;
}

// ---- the backends ---------------------------------------------------------------
// Cases run per backend label, printed when the test program ends.
std::map<std::string, int>& cases_run() {
  static std::map<std::string, int> counts;
  return counts;
}

class OpTableCount : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("op table: %d cases on cpu, %d on cpu-checked, %d on cuda\n", cases_run()["cpu"],
                cases_run()["cpu-checked"], cases_run()["cuda"]);
    std::fflush(stdout);
  }
};
[[maybe_unused]] ::testing::Environment* const kOpTableCount =
    ::testing::AddGlobalTestEnvironment(new OpTableCount);

// The CPU backends at 2 threads, so the threaded paths run; the gradcheck, which runs the
// forward ~100 times, at 1: on a loaded machine every 2-thread parallel region can wait a
// scheduler slice for its second thread (seconds per case), and the results do not depend
// on the thread count (determinism_test.cpp).
int threads_for(const OpCase& c) { return c.check == Check::kGradCheck ? 1 : 2; }

class OpTable : public ::testing::TestWithParam<OpCase> {
 protected:
  void run_on(const char* backend, Ops& ops) {
    ++cases_run()[backend];
    const Report r = run_case(ops, GetParam());
    EXPECT_TRUE(r.ok()) << backend << " " << GetParam().name << ":\n" << r.str();
    // For calibrating a backend: how close each case came to its tolerance.
    if (std::getenv("TRIDENT_OP_TABLE_VERBOSE") != nullptr)
      std::printf("op table: %s %s worst %.3g of tolerance\n", backend, GetParam().name.c_str(),
                  r.worst);
  }
};

TEST_P(OpTable, cpu) {
  auto ops = make_cpu_ops(threads_for(GetParam()));
  run_on("cpu", *ops);
}

TEST_P(OpTable, cpu_checked) {
  auto ops = make_cpu_ops(threads_for(GetParam()), /*checked=*/true);
  run_on("cpu-checked", *ops);
}

// The CUDA Ops (kernels/backend.h picks the device), or the reason there is none.
Result<std::unique_ptr<Ops>> cuda_ops() { return make_ops(DeviceKind::kCuda, 0, 1); }

TEST_P(OpTable, cuda) {
  auto ops = cuda_ops();
  if (!ops.is_ok()) GTEST_SKIP() << "no CUDA device: " << ops.status().message();
  run_on("cuda", **ops);
}

// The outputs of one forward (and backward) on `ops` from the case's initial values (the
// same for every backend: the seed is the case's name; only the opaque state's size, and
// so its garbage, depends on the backend).
std::map<std::string, VecD> outputs_on(Ops& ops, const OpCase& c) {
  using namespace detail;
  const OpDef& def = *c.def;
  const Host init = initial_values(def, &ops, seed_of(c.name), false);
  Workspace ws(ops, def, init);
  def.forward(ops, ws.bufs());
  const bool backward = c.check == Check::kBackward;
  if (backward) def.backward(ops, ws.bufs());
  std::map<std::string, VecD> out;
  for (const Arg& arg : def.args)
    if (compared(def, arg, backward)) out[arg.name] = ws.download(arg, init.at(arg.name).size());
  return out;
}

// CUDA against the CPU backend on identical inputs. Each is within arg_tolerance of the
// float64 reference (OpTable.cpu, OpTable.cuda), so they are within twice that of each
// other; this names the first op where the two backends part, which is what a GPU
// session needs when an end-to-end parity run disagrees.
TEST_P(OpTable, cuda_vs_cpu) {
  if (GetParam().check == Check::kGradCheck) GTEST_SKIP() << "gradcheck: see OpTable.cuda";
  auto ops = cuda_ops();
  if (!ops.is_ok()) GTEST_SKIP() << "no CUDA device: " << ops.status().message();
  auto cpu = make_cpu_ops(2);
  const std::map<std::string, VecD> want = outputs_on(*cpu, GetParam());
  const std::map<std::string, VecD> got = outputs_on(**ops, GetParam());
  Report r;
  for (const auto& [name, w] : want) {
    const Arg& arg = detail::arg_named(*GetParam().def, name);
    Tol tol = detail::arg_tolerance(arg, *GetParam().def);
    tol.scale *= 2;
    tol.value *= 2;
    detail::compare(r, name, got.at(name), w, tol);
  }
  EXPECT_TRUE(r.ok()) << "cuda vs cpu " << GetParam().name << ":\n" << r.str();
}

INSTANTIATE_TEST_SUITE_P(, OpTable, ::testing::ValuesIn(table()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           return info.param.name;
                         });

// ---- the table's own checks -----------------------------------------------------

// Every compute op of kernels/ops.h has an entry.
TEST(OpTableCoverage, EveryComputeOpIsInTheTable) {
  std::set<std::string> ops;
  for (const OpCase& c : table()) ops.insert(c.def->op);
  for (const char* op : {"embedding",
                         "layernorm",
                         "rmsnorm",
                         "matmul",
                         "rope",
                         "qkv",
                         "attention",
                         "attention_cached",
                         "attention_block",
                         "attention_block_merge",
                         "gelu",
                         "swiglu",
                         "moe_route",
                         "moe_dispatch",
                         "moe_gather",
                         "moe_combine",
                         "add",
                         "accumulate",
                         "scale",
                         "cross_entropy",
                         "xent_local_max",
                         "xent_local_sums",
                         "xent_local_backward",
                         "xent_finish",
                         "xent_parallel",
                         "loss_accumulate",
                         "adamw_update",
                         "sum_squares_accumulate",
                         "cast"})
    EXPECT_TRUE(ops.count(op)) << op << " has no entry";
}

// The float64 references agree with themselves: each ref_backward is the gradient of its
// ref_forward (central differences in float64), so a wrong reference cannot hide a wrong
// kernel that shares its mistake with the differences of the backend.
TEST(OpTableReference, BackwardIsTheGradientOfForward) {
  int checked = 0;
  for (const Def& d : table_defs()) {
    if (d->wrt.empty() || d->dtype != "f32") continue;
    const Report r = check_reference_gradient(*d);
    EXPECT_TRUE(r.ok()) << d->op << "_" << d->shape << ":\n" << r.str();
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

// Every check can fail: a backend whose matmul is off by `delta` in one element of one
// output is flagged by the check that reads that output.
class PerturbedMatmulOps : public ForwardingOps {
 public:
  PerturbedMatmulOps(Ops& inner, size_t index, float delta, bool forward, bool backward)
      : ForwardingOps(inner),
        index_(index),
        delta_(delta),
        forward_(forward),
        backward_(backward) {}
  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    inner_.matmul_forward(out, inp, weight, bias, N, IC, OC);
    if (forward_) bump(out);
  }
  using ForwardingOps::matmul_backward;
  void matmul_backward(DevPtr dinp, DevPtr dweight, DevPtr dbias, DevPtr dout, DevPtr inp,
                       DevPtr weight, int N, int IC, int OC, GradWrite dinp_write) override {
    inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, dinp_write);
    if (backward_) bump(dinp);
  }

 private:
  void bump(DevPtr p) {  // one f32 element
    float x;
    inner_.download(&x, p + index_, sizeof x);
    x += delta_;
    inner_.upload(p + index_, &x, sizeof x);
  }
  size_t index_;
  float delta_;
  bool forward_, backward_;
};

const OpCase& case_named(const std::string& name) {
  for (const OpCase& c : table())
    if (c.name == name) return c;
  ADD_FAILURE() << "no case " << name;
  return table().front();
}

TEST(OpTableSelfTest, UnperturbedMatmulPasses) {
  auto cpu = make_cpu_ops(2);
  PerturbedMatmulOps ops(*cpu, 3, 0.0f, true, true);
  for (const char* name : {"matmul_forward_f32_N7_IC13_OC5", "matmul_backward_f32_N7_IC13_OC5",
                           "matmul_gradcheck_f32_N7_IC13_OC5"})
    EXPECT_TRUE(run_case(ops, case_named(name)).ok()) << name;
}

TEST(OpTableSelfTest, FlagsAForwardOffBy1e3InOneElement) {
  auto cpu = make_cpu_ops(2);
  PerturbedMatmulOps ops(*cpu, 3, 1e-3f, true, false);
  const Report r = run_case(ops, case_named("matmul_forward_f32_N7_IC13_OC5"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("out[3]"), std::string::npos) << r.str();
  EXPECT_NE(r.str().find("1 of 35 elements"), std::string::npos) << r.str();
}

TEST(OpTableSelfTest, FlagsABackwardOffBy1e3InOneElement) {
  auto cpu = make_cpu_ops(2);
  PerturbedMatmulOps ops(*cpu, 3, 1e-3f, false, true);
  const Report r = run_case(ops, case_named("matmul_backward_f32_N7_IC13_OC5"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("dinp[3]"), std::string::npos) << r.str();
  EXPECT_NE(r.str().find("1 of 91 elements"), std::string::npos) << r.str();
}

// The differences see the backend's forward only, so they catch a backward that agrees
// with nothing, without any reference.
TEST(OpTableSelfTest, GradcheckFlagsABackwardOffInOneElement) {
  const OpCase& c = case_named("matmul_gradcheck_f32_N7_IC13_OC5");
  const size_t probed = detail::probes(7 * 13, detail::seed_of(c.name + "inp")).front();
  auto cpu = make_cpu_ops(2);
  PerturbedMatmulOps ops(*cpu, probed, 1e-2f, false, true);
  const Report r = run_case(ops, c);
  ASSERT_FALSE(r.ok());
  const std::string want = "dinp (differences of the forward)[" + std::to_string(probed) + "]";
  EXPECT_NE(r.str().find(want), std::string::npos) << r.str();
}

// The bf16 tolerance is tight enough to tell the rounding mode: a matmul that stores its
// bf16 output rounded toward zero (up to one ulp off, where nearest-even is half) fails.
class TruncatingMatmulOps : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void matmul_forward(DevPtr out, DevPtr inp, DevPtr weight, DevPtr bias, int N, int IC,
                      int OC) override {
    const size_t n = static_cast<size_t>(N) * OC;
    DeviceBuffer f32(inner_, n * sizeof(float));
    inner_.matmul_forward(f32.as(DType::kF32), inp, weight, bias, N, IC, OC);
    std::vector<float> host(n);
    inner_.download(host.data(), f32.get(), n * sizeof(float));
    std::vector<bf16_t> truncated(n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &host[i], 4);
      truncated[i] = static_cast<bf16_t>(bits >> 16);
    }
    inner_.upload(out, truncated.data(), n * sizeof(bf16_t));
  }
};

TEST(OpTableSelfTest, FlagsABf16OutputRoundedTowardZero) {
  auto cpu = make_cpu_ops(2);
  TruncatingMatmulOps ops(*cpu);
  const Report r = run_case(ops, case_named("matmul_forward_bf16_N7_IC13_OC5"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("out: "), std::string::npos) << r.str();
}

// An exact output is checked to the bit: an add one ulp off in one element fails, and a
// cross-entropy gradient that leaves 1e-30 in one padded column.
class UlpOffOps : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void add(DevPtr out, DevPtr a, DevPtr b, size_t n) override {
    inner_.add(out, a, b, n);
    float x;
    inner_.download(&x, out + 5, sizeof x);
    x = std::nextafter(x, INFINITY);
    inner_.upload(out + 5, &x, sizeof x);
  }
  void cross_entropy_backward(DevPtr dlogits, DevPtr logits, DevPtr targets, float dloss, int N,
                              int V, int Vp) override {
    inner_.cross_entropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
    const float tiny = 1e-30f;
    inner_.upload(dlogits + (Vp - 1), &tiny, sizeof tiny);  // row 0's last padded column
  }
};

TEST(OpTableSelfTest, FlagsAnExactOutputOneUlpOffAndAPaddedColumnNotCleared) {
  auto cpu = make_cpu_ops(2);
  UlpOffOps ops(*cpu);
  Report r = run_case(ops, case_named("add_f32_n31"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("out[5]"), std::string::npos) << r.str();
  r = run_case(ops, case_named("cross_entropy_backward_f32_N5_V13_Vp16"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("dlogits[15]"), std::string::npos) << r.str();
}

}  // namespace
}  // namespace trident::testing::op_table
