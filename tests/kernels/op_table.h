// The op table harness (in the style of ggml's test-backend-ops): one table of ops x
// dtypes x shapes, run unchanged on every backend the build has.
//
// A table entry (OpDef) is one op, or one forward/backward pair, at one dtype and shape:
// named buffers (Arg), the calls through Ops (forward, backward) and a float64 reference of
// each (ref_forward, ref_backward) working on host copies of the same named buffers. Each
// entry yields up to three checks (OpCase):
// - forward:   the backend's forward outputs against ref_forward, computed in float64 from
//              the very values uploaded (bf16 inputs are bf16-rounded before the reference
//              sees them);
// - backward:  the backend's backward (after its own forward, which produces the saved
//              state) against ref_backward; accumulating gradients are pre-filled with
//              random values, so "+=" is checked too, and overwritten ones with NaN;
// - gradcheck: f32 only: the backend's backward against central differences of the
//              backend's own forward, the output reduced to one scalar through a random
//              projection (the backward's dout), as flashlight and ggml do.
// run_case returns a Report instead of failing the test, so a test can also show that a
// perturbed backend is flagged (op_table_test.cpp, the forwarding_ops.h wrapper).
//
// Tolerances (why they are what they are): see the constants below.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace trident::testing::op_table {

using VecD = std::vector<double>;

// Every compared element must satisfy
//   |got - want| <= tol.scale * (|want| + rms(want)) + tol.value * |want|:
// `scale` bounds arithmetic error, relative with an absolute floor at the scale of the whole
// output (entries that cancel to near zero are judged against the data's scale); `value`
// bounds a final rounding, which is relative to the element itself. A non-finite want
// must be matched exactly.
//
// kTolF32 (scale): an f32 result against float64. Every op computes in fp32; a length-K
// reduction carries at most ~K * 2^-24 * sum|terms| of rounding, which relative to the rms
// floor is ~1e-5 at K = 32 (the blocked and pairwise sums of the kernels are far below that
// bound: the CPU backend's worst case is 2% of it). Elementwise ops add a few ulp of tanh /
// exp (exp_fast: 3e-7). So 1e-5 up to K = 32, and linear in K beyond (tolerance_for).
inline constexpr double kTolF32 = 1e-5;
// kTolBf16 (value), added for a bf16 output: the backend rounds its fp32 result once to
// bf16 (8 significant bits), at most half an ulp <= 2^-8 of the value; the reference
// starts from the same bf16-rounded inputs, so nothing else differs. Without the rms floor
// this is tight enough to tell the rounding mode: rounding toward zero (errors up to one
// ulp) fails (OpTableSelfTest.FlagsABf16OutputRoundedTowardZero).
inline constexpr double kTolBf16 = 1.0 / 256.0;
struct Tol {
  double scale = 0, value = 0;
  // A want of exactly 0 must be got exactly 0: the padded columns an op must clear.
  bool zeros_exact = false;
};
// kTolFd: the backend's backward against central differences of its f32 forward, with
// step fd_eps (1e-2 on inputs of size ~1). The truncation error is eps^2/6 * f''' ~ 2e-5
// and the rounding noise of the f32 outputs ~2^-24 * |out| * sqrt(outputs) / eps ~ 1e-5
// for our sizes; both relative to the gradient's scale. The CPU backend's worst is 1.2e-4
// (attention, whose softmax has the largest third derivative); 1e-3 keeps a margin of 8.
inline constexpr double kTolFd = 1e-3;
// At most this many elements of each differentiated input are probed by differences (two
// forwards each): enough to catch a wrong formula, which is wrong almost everywhere, while
// the float64 reference checks every element.
inline constexpr size_t kMaxProbes = 64;

enum class Role : uint8_t {
  kIn,        // forward input: random (or given) values
  kOut,       // forward output, overwritten: NaN prefill, compared after the forward
  kInOut,     // updated in place by the forward (x *= s, acc +=): random, compared
  kState,     // forward scratch the backward reads, never compared (opaque state): garbage
  kGradIn,    // backward input (dout): random; the projection weights of the gradcheck
  kGradOut,   // backward output that accumulates: random prefill, compared after backward
  kGradSet,   // backward output that is overwritten: NaN prefill, compared after backward
  kGradInOut  // backward in place (rope's dx): random, compared after backward
};

struct Arg {
  std::string name;
  DType dtype = DType::kF32;
  size_t count = 0;  // elements of dtype
  Role role = Role::kIn;
  double lo = -1.0, hi = 1.0;  // random values uniform in [lo, hi)
  VecD values;                 // given initial values instead (tokens, targets, cast edges)
  std::string alias;           // shares the buffer of that (earlier) arg: dlogits = logits
  double tol = -1.0;           // output tolerance (Tol::scale); < 0: tolerance_for(...);
                               // 0: exact (see exact_want)
  bool zeros_exact = false;    // Tol::zeros_exact for this output
  // Backend-dependent element count (the attention state's bytes); overrides count.
  std::function<size_t(const Ops&)> count_of;
};

// The device buffers of one case by name.
class Bufs {
 public:
  DevPtr operator[](const std::string& name) const;
  void set(const std::string& name, DevPtr ptr) { ptrs_[name] = ptr; }

 private:
  std::map<std::string, DevPtr> ptrs_;
};

// Host float64 copies of the buffers, by name (the reference's view).
using Host = std::map<std::string, VecD>;

struct OpDef {
  std::string op;     // "matmul"
  std::string dtype;  // "f32", "bf16" (the F arguments), or a descriptive tag
  std::string shape;  // "N7_IC13_OC5"
  std::vector<Arg> args;
  size_t reduction = 1;  // the longest fp32 reduction of forward and backward
  std::function<void(Ops&, const Bufs&)> forward, backward;  // backward may be empty
  std::function<void(Host&)> ref_forward, ref_backward;
  // Gradcheck: (forward input, the backward output holding its gradient) pairs, and
  // (forward output, the backward input holding its projection weights) pairs; an empty
  // weights name means every weight is uniform_weight (cross-entropy's scalar dloss).
  std::vector<std::pair<std::string, std::string>> wrt, project;
  double uniform_weight = 1.0;
  double fd_eps = 1e-2;
  bool gradcheck = true;  // f32 entries with wrt pairs get one unless this is false
  // Optional arguments passed as a null DevPtr (a gradient not needed): not allocated, not
  // compared; the op must skip them and still produce the others.
  std::vector<std::string> absent;
  bool is_absent(const std::string& name) const {
    return std::find(absent.begin(), absent.end(), name) != absent.end();
  }
};

enum class Check : uint8_t { kForward, kBackward, kGradCheck };

struct OpCase {
  std::shared_ptr<const OpDef> def;
  Check check = Check::kForward;
  std::string name;  // "matmul_forward_bf16_N7_IC13_OC5": a gtest name
};
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// The cases of one entry: forward (or just the op's name when it has no backward),
// backward, gradcheck.
inline std::vector<OpCase> cases_of(std::shared_ptr<const OpDef> def);

struct Report {
  std::vector<std::string> failures;
  double worst = 0;  // the largest err / allowed over every compared element
  bool ok() const { return failures.empty(); }
  std::string str() const;
};

// Runs one check on `ops`.
inline Report run_case(Ops& ops, const OpCase& c);

// The reference's own consistency (no backend): ref_backward against central differences
// of ref_forward in float64, for an entry with wrt pairs.
inline Report check_reference_gradient(const OpDef& def);

inline Tol tolerance_for(DType dtype, size_t reduction);

// ---- float64 references the tests outside the table share ----------------------
// (the CPU backend's attention state is the probabilities: attention_test.cpp; the
// tensor-parallel layers: tests/parallel/tp_layers_mpi_test.cpp)

struct AttnShape {
  int B, T, NH, NKV, HD;
  // Over a key/value cache (attention_cached_forward): the T queries sit at positions
  // pos .. pos+T-1 and k, v hold `capacity` positions per sequence (0: T).
  int pos = 0, capacity = 0;
  int kv_rows() const { return capacity > 0 ? capacity : T; }
  size_t qi(int b, int t, int h, int e) const {
    return ((static_cast<size_t>(b) * T + t) * NH + h) * HD + e;
  }
  size_t ki(int b, int t, int h, int e) const {
    return ((static_cast<size_t>(b) * kv_rows() + t) * NKV + h) * HD + e;
  }
};

// P[b, h, i, j] (causal softmax of q k^T / sqrt(HD): query i at position pos + i sees
// keys 0 .. pos + i; rows of pos + T), and out = P v.
inline void ref_attention(const AttnShape& s, const VecD& q, const VecD& k, const VecD& v,
                          VecD& out, VecD& P) {
  const size_t cols = static_cast<size_t>(s.pos) + s.T;
  P.assign(static_cast<size_t>(s.B) * s.NH * s.T * cols, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HD));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int kv = h / (s.NH / s.NKV);
      for (int i = 0; i < s.T; ++i) {
        double* p = &P[((static_cast<size_t>(b) * s.NH + h) * s.T + i) * cols];
        const int last = s.pos + i;
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= last; ++j) {
          double dot = 0;
          for (int e = 0; e < s.HD; ++e) dot += q[s.qi(b, i, h, e)] * k[s.ki(b, j, kv, e)];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= last; ++j) p[j] /= sum;
        for (int e = 0; e < s.HD; ++e) {
          double o = 0;
          for (int j = 0; j <= last; ++j) o += p[j] * v[s.ki(b, j, kv, e)];
          out[s.qi(b, i, h, e)] = o;
        }
      }
    }
}

// The softmax cross-entropy of one row of V real logits: returns the loss
// -log softmax(x)[target]; when d is given, d[0, V) = dloss * (softmax(x) - onehot(target)).
inline double ref_xent_row(const double* x, int V, int target, double dloss, double* d) {
  double mx = -1e300, sum = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, x[v]);
  for (int v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
  if (d != nullptr)
    for (int v = 0; v < V; ++v)
      d[v] = dloss * (std::exp(x[v] - mx) / sum - (v == target ? 1.0 : 0.0));
  return std::log(sum) + mx - x[target];
}

// ---- implementation ---------------------------------------------------------------

inline Tol tolerance_for(DType dtype, size_t reduction) {
  const double f32 = kTolF32 * std::max(1.0, static_cast<double>(reduction) / 32.0);
  return {f32, dtype == DType::kBF16 ? kTolBf16 : 0.0};
}

inline DevPtr Bufs::operator[](const std::string& name) const {
  auto it = ptrs_.find(name);
  if (it == ptrs_.end()) {
    ADD_FAILURE() << "op table: no buffer named " << name;
    return DevPtr();
  }
  return it->second;
}

inline std::string Report::str() const {
  std::string s;
  for (const auto& f : failures) s += f + "\n";
  return s;
}

namespace detail {

inline uint32_t seed_of(const std::string& s) {  // FNV-1a: a case's data depends on its name
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) h = (h ^ ch) * 16777619u;
  return h;
}

// The value `x` becomes once stored as `dtype`.
inline double stored(double x, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(x);
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(static_cast<float>(x)));
    case DType::kI32:
    case DType::kI64:
      return std::floor(x);
    case DType::kU8:
      return static_cast<double>(static_cast<uint8_t>(static_cast<int>(x) & 255));
    case DType::kF64:
      return x;
  }
  return x;
}

inline std::vector<unsigned char> encode(const VecD& v, DType dtype) {
  std::vector<unsigned char> bytes(std::max<size_t>(1, v.size() * dtype_size(dtype)));
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        const float f = static_cast<float>(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kBF16: {
        const bf16_t h = float_to_bf16(static_cast<float>(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kI32: {
        const int32_t k = static_cast<int32_t>(v[i]);
        std::memcpy(p, &k, 4);
        break;
      }
      case DType::kI64: {
        const int64_t k = static_cast<int64_t>(v[i]);
        std::memcpy(p, &k, 8);
        break;
      }
      case DType::kF64:
        std::memcpy(p, &v[i], 8);
        break;
      case DType::kU8:
        *p = static_cast<unsigned char>(v[i]);
        break;
    }
  }
  return bytes;
}

inline VecD decode(const std::vector<unsigned char>& bytes, size_t n, DType dtype) {
  VecD v(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, p, 4);
        v[i] = f;
        break;
      }
      case DType::kBF16: {
        bf16_t h;
        std::memcpy(&h, p, 2);
        v[i] = bf16_to_float(h);
        break;
      }
      case DType::kI32: {
        int32_t k;
        std::memcpy(&k, p, 4);
        v[i] = k;
        break;
      }
      case DType::kI64: {
        int64_t k;
        std::memcpy(&k, p, 8);
        v[i] = static_cast<double>(k);
        break;
      }
      case DType::kF64:
        std::memcpy(&v[i], p, 8);
        break;
      case DType::kU8:
        v[i] = *p;
        break;
    }
  }
  return v;
}

inline bool is_grad_output(Role r) {
  return r == Role::kGradOut || r == Role::kGradSet || r == Role::kGradInOut;
}

// The initial contents of every buffer, exactly as stored. `zero_grads`: accumulating
// gradients start at 0 (the gradcheck reads them as the gradient itself).
inline Host initial_values(const OpDef& def, const Ops* ops, uint32_t seed, bool zero_grads) {
  Host host;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t a = 0; a < def.args.size(); ++a) {
    const Arg& arg = def.args[a];
    if (!arg.alias.empty()) {
      host[arg.name] = host.at(arg.alias);
      continue;
    }
    size_t n = arg.count;
    if (arg.count_of) n = ops != nullptr ? arg.count_of(*ops) : 0;
    VecD v(n);
    std::mt19937 gen(seed + 7919u * static_cast<uint32_t>(a + 1));
    std::uniform_real_distribution<double> dist(arg.lo, arg.hi);
    if (!arg.values.empty()) {
      EXPECT_EQ(arg.values.size(), n) << def.op << ": values of " << arg.name;
      v = arg.values;
      v.resize(n);
    } else if (arg.dtype == DType::kU8) {  // opaque bytes: garbage the op must overwrite
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + 11) & 255);
    } else if (arg.role == Role::kOut || arg.role == Role::kGradSet || arg.role == Role::kState) {
      std::fill(v.begin(), v.end(), nan);  // must be written before it is read
    } else if (arg.role == Role::kGradOut && zero_grads) {
      std::fill(v.begin(), v.end(), 0.0);
    } else {
      for (auto& x : v) x = dist(gen);
    }
    for (auto& x : v) x = stored(x, arg.dtype);
    host[arg.name] = std::move(v);
  }
  return host;
}

// The buffers of one case on one backend.
class Workspace {
 public:
  Workspace(Ops& ops, const OpDef& def, const Host& init) : ops_(ops), def_(def) {
    for (const Arg& arg : def.args) {
      if (def.is_absent(arg.name)) {
        bufs_.set(arg.name, DevPtr());
        continue;
      }
      if (!arg.alias.empty()) {
        bufs_.set(arg.name, bufs_[arg.alias].as(arg.dtype));
        continue;
      }
      const size_t n = init.at(arg.name).size();
      mem_.emplace_back(ops, std::max<size_t>(1, n * dtype_size(arg.dtype)));
      bufs_.set(arg.name, mem_.back().as(arg.dtype));
    }
    upload_all(init);
  }
  void upload_all(const Host& host) {
    for (const Arg& arg : def_.args) {
      if (!arg.alias.empty() || def_.is_absent(arg.name)) continue;
      const VecD& v = host.at(arg.name);
      if (v.empty()) continue;
      const auto bytes = encode(v, arg.dtype);
      ops_.upload(bufs_[arg.name], bytes.data(), v.size() * dtype_size(arg.dtype));
    }
  }
  VecD download(const Arg& arg, size_t n) {
    std::vector<unsigned char> bytes(std::max<size_t>(1, n * dtype_size(arg.dtype)));
    if (n > 0) ops_.download(bytes.data(), bufs_[arg.name], n * dtype_size(arg.dtype));
    return decode(bytes, n, arg.dtype);
  }
  const Bufs& bufs() const { return bufs_; }

 private:
  Ops& ops_;
  const OpDef& def_;
  std::vector<DeviceBuffer> mem_;
  Bufs bufs_;
};

// Adds to `r` every element of `got` outside tol (see Tol); floor < 0: rms(want).
// `index`: the element numbers of got / want (probed subsets), else 0, 1, ...
inline void compare(Report& r, const std::string& what, const VecD& got, const VecD& want, Tol tol,
                    double floor = -1.0, const std::vector<size_t>* index = nullptr) {
  if (got.size() != want.size()) {
    r.failures.push_back(what + ": " + std::to_string(got.size()) + " elements, want " +
                         std::to_string(want.size()));
    return;
  }
  if (floor < 0) {
    double ss = 0;
    size_t finite = 0;
    for (double e : want)
      if (std::isfinite(e)) ss += e * e, ++finite;
    floor = finite == 0 ? 0.0 : std::sqrt(ss / static_cast<double>(finite));
  }
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = want[i], g = got[i];
    bool ok;
    double allowed = 0, err = 0;
    if (!std::isfinite(e)) {
      ok = std::isnan(e) ? std::isnan(g) : g == e;
    } else if (e == 0.0 && tol.zeros_exact) {
      ok = g == 0.0;
    } else {
      err = std::abs(g - e);
      allowed = tol.scale * (std::abs(e) + floor) + tol.value * std::abs(e);
      ok = err <= allowed;  // false for a NaN result
      if (ok && allowed > 0) r.worst = std::max(r.worst, err / allowed);
    }
    if (!ok && ++bad <= 4) {
      std::ostringstream m;
      m.precision(9);
      m << what << "[" << (index != nullptr ? (*index)[i] : i) << "]: got " << g << " want " << e
        << " (err " << err << " > allowed " << allowed << ")";
      r.failures.push_back(m.str());
    }
  }
  if (bad > 0) {
    std::ostringstream m;
    m << what << ": " << bad << " of " << want.size() << " elements out of tolerance " << tol.scale
      << (tol.value > 0 ? " + " + std::to_string(tol.value) + " of the value" : "");
    r.failures.push_back(m.str());
  }
}

// An exact output (tol 0) is the float64 result rounded once to the output's dtype, to the
// bit: a copy, a max, a picked element, or one fp32 operation on stored values (an add, a
// product), whose float64 result rounded to fp32 is the correctly rounded fp32 result
// (53 >= 2 * 24 + 2 bits: rounding twice changes nothing), and so is its bf16 rounding.
// The reference itself stays unrounded, so that it can be differentiated.
inline VecD exact_want(const Arg& arg, VecD want) {
  if (arg.tol == 0.0)
    for (double& x : want) x = stored(x, arg.dtype);
  return want;
}

inline Tol arg_tolerance(const Arg& arg, const OpDef& def) {
  Tol tol = arg.tol >= 0 ? Tol{arg.tol, 0.0} : tolerance_for(arg.dtype, def.reduction);
  tol.zeros_exact = arg.zeros_exact;
  return tol;
}

// Whether the check of `backward` (else the forward) compares this argument.
inline bool compared(const OpDef& def, const Arg& arg, bool backward) {
  if (def.is_absent(arg.name)) return false;
  return backward ? is_grad_output(arg.role) : arg.role == Role::kOut || arg.role == Role::kInOut;
}

// The probed elements of an input of n elements: all, or kMaxProbes spread at random.
inline std::vector<size_t> probes(size_t n, uint32_t seed) {
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  if (n <= kMaxProbes) return idx;
  std::mt19937 gen(seed);
  std::shuffle(idx.begin(), idx.end(), gen);
  idx.resize(kMaxProbes);
  std::sort(idx.begin(), idx.end());
  return idx;
}

inline const Arg& arg_named(const OpDef& def, const std::string& name) {
  for (const Arg& a : def.args)
    if (a.name == name) return a;
  ADD_FAILURE() << def.op << ": no arg " << name;
  return def.args.front();
}

// sum over the projected outputs of weights * output, in double.
inline double projected(const OpDef& def, const Host& init,
                        const std::function<VecD(const Arg&)>& output) {
  double L = 0;
  for (const auto& [out, w] : def.project) {
    const VecD y = output(arg_named(def, out));
    for (size_t i = 0; i < y.size(); ++i)
      L += y[i] * (w.empty() ? def.uniform_weight : init.at(w)[i]);
  }
  return L;
}

inline Report run_forward(Ops& ops, const OpCase& c) {
  const OpDef& def = *c.def;
  Report r;
  const Host init = initial_values(def, &ops, seed_of(c.name), false);
  Workspace ws(ops, def, init);
  def.forward(ops, ws.bufs());
  Host ref = init;
  def.ref_forward(ref);
  for (const Arg& arg : def.args)
    if (compared(def, arg, false))
      compare(r, arg.name, ws.download(arg, ref.at(arg.name).size()),
              exact_want(arg, ref.at(arg.name)), arg_tolerance(arg, def));
  return r;
}

inline Report run_backward(Ops& ops, const OpCase& c) {
  const OpDef& def = *c.def;
  Report r;
  const Host init = initial_values(def, &ops, seed_of(c.name), false);
  Workspace ws(ops, def, init);
  def.forward(ops, ws.bufs());
  def.backward(ops, ws.bufs());
  Host ref = init;
  def.ref_forward(ref);
  def.ref_backward(ref);
  for (const Arg& arg : def.args)
    if (compared(def, arg, true))
      compare(r, arg.name, ws.download(arg, ref.at(arg.name).size()),
              exact_want(arg, ref.at(arg.name)), arg_tolerance(arg, def));
  return r;
}

inline double rms(const VecD& v) {
  double ss = 0;
  for (double x : v) ss += x * x;
  return v.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(v.size()));
}

inline Report run_gradcheck(Ops& ops, const OpCase& c) {
  const OpDef& def = *c.def;
  Report r;
  const Host init = initial_values(def, &ops, seed_of(c.name), true);
  Workspace ws(ops, def, init);
  def.forward(ops, ws.bufs());
  def.backward(ops, ws.bufs());
  Host grad;
  for (const auto& [x, g] : def.wrt) {
    const Arg& ga = arg_named(def, g);
    grad[g] = ws.download(ga, init.at(g).size());
  }
  auto loss = [&](const Host& h) {
    ws.upload_all(h);
    def.forward(ops, ws.bufs());
    return projected(def, init, [&](const Arg& a) { return ws.download(a, h.at(a.name).size()); });
  };
  for (const auto& [x, g] : def.wrt) {
    const Arg& xa = arg_named(def, x);
    const std::vector<size_t> idx = probes(init.at(x).size(), seed_of(c.name + x));
    VecD fd, an;
    for (size_t i : idx) {
      Host h = init;
      const double x0 = init.at(x)[i];
      const double xp = stored(x0 + def.fd_eps, xa.dtype), xm = stored(x0 - def.fd_eps, xa.dtype);
      h[x][i] = xp;
      const double lp = loss(h);
      h[x][i] = xm;
      const double lm = loss(h);
      fd.push_back((lp - lm) / (xp - xm));
      an.push_back(grad[g][i]);
    }
    Report part;
    compare(part, g + " (differences of the forward)", an, fd, Tol{kTolFd, 0.0}, rms(grad[g]),
            &idx);
    for (auto& f : part.failures) r.failures.push_back(f);
    r.worst = std::max(r.worst, part.worst);
  }
  return r;
}

}  // namespace detail

inline Report run_case(Ops& ops, const OpCase& c) {
  switch (c.check) {
    case Check::kForward:
      return detail::run_forward(ops, c);
    case Check::kBackward:
      return detail::run_backward(ops, c);
    case Check::kGradCheck:
      return detail::run_gradcheck(ops, c);
  }
  return {};
}

inline Report check_reference_gradient(const OpDef& def) {
  using namespace detail;
  Report r;
  const Host init = initial_values(def, nullptr, seed_of(def.op + def.shape), true);
  Host h = init;
  def.ref_forward(h);
  def.ref_backward(h);
  auto loss = [&](Host x) {
    def.ref_forward(x);
    return projected(def, init, [&](const Arg& a) { return x.at(a.name); });
  };
  for (const auto& [x, g] : def.wrt) {
    const VecD& grad = h.at(g);
    const std::vector<size_t> idx = probes(init.at(x).size(), seed_of(x));
    VecD fd, an;
    for (size_t i : idx) {
      Host p = init;
      const double step = 1e-6;
      p[x][i] = init.at(x)[i] + step;
      const double lp = loss(p);
      p[x][i] = init.at(x)[i] - step;
      const double lm = loss(p);
      fd.push_back((lp - lm) / (2 * step));
      an.push_back(grad[i]);
    }
    compare(r, "reference " + g, an, fd, Tol{1e-6, 0.0}, rms(grad), &idx);
  }
  return r;
}

inline std::vector<OpCase> cases_of(std::shared_ptr<const OpDef> def) {
  std::vector<OpCase> out;
  const std::string tail = "_" + def->dtype + "_" + def->shape;
  if (!def->backward) {
    out.push_back({def, Check::kForward, def->op + tail});
    return out;
  }
  out.push_back({def, Check::kForward, def->op + "_forward" + tail});
  out.push_back({def, Check::kBackward, def->op + "_backward" + tail});
  if (def->dtype == "f32" && def->gradcheck && !def->wrt.empty())
    out.push_back({def, Check::kGradCheck, def->op + "_gradcheck" + tail});
  return out;
}

}  // namespace trident::testing::op_table
