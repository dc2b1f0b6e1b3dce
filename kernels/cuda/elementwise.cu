// Pointwise kernels: cast, GELU (tanh form), SwiGLU, add / accumulate / scale, RoPE, the
// fused q/k/v rows' split and merge. The
// formulas are those of kernels/cpu/activation.cpp and rope.cpp, one element per
// iteration of a grid-stride loop (launch.h elementwise_launch). Every output element
// is read (when it is also an input) and written by the same thread, so an output may
// alias an input of the same dtype (add, scale, accumulate).
#include "kernels/cuda/device_util.cuh"

namespace trident::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

__global__ void cast_kernel(FArg dst, FArg src, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) store(dst, i, load(src, i));
}

__global__ void gelu_forward_kernel(FArg out, FArg inp, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = load(inp, i);
    store(out, i, 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCube * x * x * x))));
  }
}

__global__ void gelu_backward_kernel(FArg dinp, FArg dout, FArg inp, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = load(inp, i);
    const float t = tanhf(kGeluScale * (x + kGeluCube * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    const float g = load(dout, i) * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    store(dinp, i, load(dinp, i) + g);
  }
}

__global__ void swiglu_forward_kernel(FArg out, FArg gate, FArg up, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = load(gate, i);
    store(out, i, g / (1.0f + expf(-g)) * load(up, i));
  }
}

__global__ void swiglu_backward_kernel(FArg dgate, FArg dup, FArg dout, FArg gate, FArg up,
                                       size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = load(gate, i), u = load(up, i), d = load(dout, i);
    const float sig = 1.0f / (1.0f + expf(-g));
    if (dgate.p != nullptr)
      store(dgate, i, load(dgate, i) + d * u * sig * (1.0f + g * (1.0f - sig)));
    if (dup.p != nullptr) store(dup, i, load(dup, i) + d * g * sig);
  }
}

__global__ void add_kernel(FArg out, FArg a, FArg b, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads())
    store(out, i, load(a, i) + load(b, i));
}

__global__ void accumulate_kernel(FArg dst, FArg src, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads())
    store(dst, i, load(dst, i) + load(src, i));
}

__global__ void scale_kernel(FArg x, float factor, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) store(x, i, load(x, i) * factor);
}

// The rotation table, one thread per (position t, frequency i < HD/2): table[t * half + i]
// = (cos, sin) of (t + pos_offset) * theta^(-2i/HD), the angle computed in double and
// rounded once, as the CPU's table (rope.cpp), so both backends rotate by the same fp32
// cos / sin. Built once per call, T * HD/2 entries, so the B * H rows of a position share
// it instead of each recomputing pow / cos / sin.
__global__ void rope_table_kernel(float2* table, int T, int HD, float theta, int pos_offset) {
  const int half = HD / 2;
  const size_t entries = static_cast<size_t>(T) * half;
  for (size_t e = global_thread(); e < entries; e += grid_threads()) {
    const int i = static_cast<int>(e % half), t = static_cast<int>(e / half);
    const double inv_freq = pow(static_cast<double>(theta), -2.0 * i / HD);
    const double angle = static_cast<double>(t + pos_offset) * inv_freq;
    table[e] = make_float2(static_cast<float>(cos(angle)), static_cast<float>(sin(angle)));
  }
}

// One thread per rotated pair (row r = b*T + t, head h, i < HD/2), rotated by the table.
__global__ void rope_kernel(FArg x, const float2* table, size_t pairs, int T, int H, int HD,
                            float sign) {
  const int half = HD / 2;
  for (size_t p = global_thread(); p < pairs; p += grid_threads()) {
    const int i = static_cast<int>(p % half);
    const size_t row_head = p / half;  // (b*T + t) * H + h
    const int t = static_cast<int>((row_head / H) % T);
    const float2 cs = table[static_cast<size_t>(t) * half + i];
    const float c = cs.x, sn = sign * cs.y;
    const size_t base = row_head * HD;
    const float x1 = load(x, base + i), x2 = load(x, base + i + half);
    store(x, base + i, x1 * c - x2 * sn);
    store(x, base + i + half, x2 * c + x1 * sn);
  }
}

// Ops::qkv_split (to_parts) / qkv_merge: one thread per pair (row r = b*T + t, head h of
// the fused row's NH + 2 NKV, i < HD/2) between the fused row q | k | v and the separate
// q, k, v; a q or k pair rotated by the table when `rotate` (the expression of
// rope_kernel), a v pair copied.
__global__ void qkv_permute_kernel(FArg q, FArg k, FArg v, FArg qkv, const float2* table,
                                   size_t pairs, int T, int NH, int NKV, int HD, bool rotate,
                                   float sign, bool to_parts) {
  const int half = HD / 2, heads = NH + 2 * NKV;
  for (size_t p = global_thread(); p < pairs; p += grid_threads()) {
    const int i = static_cast<int>(p % half);
    const size_t row_head = p / half;  // r * heads + h
    const size_t r = row_head / heads;
    const int h = static_cast<int>(row_head % heads);
    const size_t fused = row_head * HD;
    FArg part = h < NH ? q : h < NH + NKV ? k : v;
    const size_t local = h < NH ? (r * NH + h) * HD
                         : h < NH + NKV ? (r * NKV + (h - NH)) * HD
                                        : (r * NKV + (h - NH - NKV)) * HD;
    const FArg src = to_parts ? qkv : part, dst = to_parts ? part : qkv;
    const size_t s0 = to_parts ? fused : local, d0 = to_parts ? local : fused;
    const float x1 = load(src, s0 + i), x2 = load(src, s0 + i + half);
    if (rotate && h < NH + NKV) {
      const int t = static_cast<int>(r % T);
      const float2 cs = table[static_cast<size_t>(t) * half + i];
      const float c = cs.x, sn = sign * cs.y;
      store(dst, d0 + i, x1 * c - x2 * sn);
      store(dst, d0 + i + half, x2 * c + x1 * sn);
    } else {
      store(dst, d0 + i, x1);
      store(dst, d0 + i + half, x2);
    }
  }
}

__global__ void simple_gemm_kernel(bool trans_a, bool trans_b, int M, int N, int K, FArg a,
                                   FArg b, FArg d, FArg bias, bool accumulate,
                                   SimpleGemmLayout L) {
  const size_t per_batch = static_cast<size_t>(M) * N;
  const size_t total = per_batch * static_cast<size_t>(L.batch);
  for (size_t i = global_thread(); i < total; i += grid_threads()) {
    const size_t batch = i / per_batch, r = i % per_batch;
    const size_t m = r / N, n = r % N;
    const size_t a0 = batch * static_cast<size_t>(L.stride_a);
    const size_t b0 = batch * static_cast<size_t>(L.stride_b);
    const size_t lda = static_cast<size_t>(L.lda), ldb = static_cast<size_t>(L.ldb);
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      const float av = load(a, a0 + (trans_a ? static_cast<size_t>(k) * lda + m : m * lda + k));
      const float bv = load(b, b0 + (trans_b ? n * ldb + k : static_cast<size_t>(k) * ldb + n));
      acc += av * bv;
    }
    acc *= L.alpha;
    if (bias.p != nullptr) acc += load(bias, n);
    const size_t di = batch * static_cast<size_t>(L.stride_d) + m * static_cast<size_t>(L.ldd) + n;
    store(d, di, accumulate ? load(d, di) + acc : acc);
  }
}

}  // namespace

// Each launcher: skip an empty launch, enqueue, check the launch.
#define TRIDENT_ELEMENTWISE(kernel, n, ...)                                   \
  do {                                                                        \
    const Launch l = elementwise_launch(n);                                   \
    if (l.empty()) return;                                                    \
    kernel<<<l.grid_x, l.block, 0, s>>>(__VA_ARGS__);                         \
    TRIDENT_CUDA_CHECK_LAUNCH();                                              \
  } while (0)

void cast(FArg dst, FArg src, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(cast_kernel, n, dst, src, n);
}
void gelu_forward(FArg out, FArg inp, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(gelu_forward_kernel, n, out, inp, n);
}
void gelu_backward(FArg dinp, FArg dout, FArg inp, size_t n, Stream s) {
  if (dinp.p == nullptr) return;
  TRIDENT_ELEMENTWISE(gelu_backward_kernel, n, dinp, dout, inp, n);
}
void swiglu_forward(FArg out, FArg gate, FArg up, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(swiglu_forward_kernel, n, out, gate, up, n);
}
void swiglu_backward(FArg dgate, FArg dup, FArg dout, FArg gate, FArg up, size_t n, Stream s) {
  if (dgate.p == nullptr && dup.p == nullptr) return;
  TRIDENT_ELEMENTWISE(swiglu_backward_kernel, n, dgate, dup, dout, gate, up, n);
}
void add(FArg out, FArg a, FArg b, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(add_kernel, n, out, a, b, n);
}
void accumulate(FArg dst, FArg src, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(accumulate_kernel, n, dst, src, n);
}
void scale(FArg x, float factor, size_t n, Stream s) {
  TRIDENT_ELEMENTWISE(scale_kernel, n, x, factor, n);
}
size_t rope_table_bytes(int T, int HD) {
  return static_cast<size_t>(T > 0 ? T : 0) * static_cast<size_t>(HD > 0 ? HD / 2 : 0) *
         sizeof(float2);
}
void rope(FArg x, void* table, int B, int T, int H, int HD, float theta, int pos_offset,
          float sign, Stream s) {
  const size_t pairs = static_cast<size_t>(B) * T * H * (HD / 2);
  if (pairs == 0) return;
  float2* cs = static_cast<float2*>(table);
  const size_t entries = static_cast<size_t>(T) * (HD / 2);
  TRIDENT_ELEMENTWISE(rope_table_kernel, entries, cs, T, HD, theta, pos_offset);
  TRIDENT_ELEMENTWISE(rope_kernel, pairs, x, cs, pairs, T, H, HD, sign);
}

void qkv_permute(FArg q, FArg k, FArg v, FArg qkv, void* table, int B, int T, int NH, int NKV,
                 int HD, bool rotate, float theta, int pos_offset, float sign, bool to_parts,
                 Stream s) {
  const size_t pairs = static_cast<size_t>(B) * T * (NH + 2 * NKV) * (HD / 2);
  if (pairs == 0) return;
  float2* cs = static_cast<float2*>(table);
  if (rotate) {
    const size_t entries = static_cast<size_t>(T) * (HD / 2);
    TRIDENT_ELEMENTWISE(rope_table_kernel, entries, cs, T, HD, theta, pos_offset);
  }
  TRIDENT_ELEMENTWISE(qkv_permute_kernel, pairs, q, k, v, qkv, cs, pairs, T, NH, NKV, HD, rotate,
                      sign, to_parts);
}

void simple_gemm(bool trans_a, bool trans_b, int M, int N, int K, FArg a, FArg b, FArg d,
                 FArg bias, bool accumulate, Stream s) {
  SimpleGemmLayout packed;
  packed.lda = trans_a ? M : K;
  packed.ldb = trans_b ? K : N;
  packed.ldd = N;
  simple_gemm(trans_a, trans_b, M, N, K, a, b, d, bias, accumulate, packed, s);
}
void simple_gemm(bool trans_a, bool trans_b, int M, int N, int K, FArg a, FArg b, FArg d,
                 FArg bias, bool accumulate, const SimpleGemmLayout& layout, Stream s) {
  const size_t total = static_cast<size_t>(M) * N * static_cast<size_t>(layout.batch);
  TRIDENT_ELEMENTWISE(simple_gemm_kernel, total, trans_a, trans_b, M, N, K, a, b, d, bias,
                      accumulate, layout);
}

#undef TRIDENT_ELEMENTWISE

}  // namespace trident::cuda
