// GemmEngine over cuBLASLt (contract: gemm.h).
//
// Row-major to column-major: a row-major X[r, c] with row stride ld is, to cuBLAS, the
// column-major X^T (c rows, r columns, leading dimension ld). So the row-major
//   D[M, N] = op(A)[M, K] @ op(B)[K, N]
// is the column-major D^T[N, M] = op(B)^T[N, K] @ op(A)^T[K, M]: cuBLAS's "A" is our B
// and its "B" is our A, m = N, n = M (llm.c matmul_cublaslt makes the same swap).
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "kernels/cuda/cuda_kernels.h"

namespace trident::cuda {

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

int64_t rows_of_a(const GemmDesc& d) { return d.trans_a ? d.K : d.M; }  // stored A
int64_t cols_of_a(const GemmDesc& d) { return d.trans_a ? d.M : d.K; }
int64_t rows_of_b(const GemmDesc& d) { return d.trans_b ? d.N : d.K; }  // stored B
int64_t cols_of_b(const GemmDesc& d) { return d.trans_b ? d.K : d.N; }
int64_t eff_ld(int64_t ld, int64_t cols) { return ld == 0 ? cols : ld; }

std::string status_text(cublasStatus_t s) {
  return std::string(cublasLtGetStatusName(s)) + " (" + cublasLtGetStatusString(s) + ")";
}

// The descriptor and the three layouts one desc runs with; destroyed together.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // cuBLAS's A, B, and C = D
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Status validate(const GemmDesc& d) {
  auto fail = [&](const std::string& why) {
    return Status::invalid_input("GEMM " + d.str() + ": " + why);
  };
  if (d.M <= 0 || d.N <= 0 || d.K <= 0) return fail("M, N and K must be positive");
  if (d.batch <= 0) return fail("batch must be positive");
  if (!is_float_dtype(d.ab_dtype)) return fail("A/B dtype must be f32 or bf16");
  if (!is_float_dtype(d.d_dtype)) return fail("D dtype must be f32 or bf16");
  if (d.ab_dtype == DType::kF32 && d.d_dtype != DType::kF32) {
    return fail("f32 inputs need an f32 D (no f32->bf16 GEMM)");
  }
  if (d.bias && d.accumulate) return fail("bias is only allowed without accumulate");
  const size_t ab = dtype_size(d.ab_dtype), dd = dtype_size(d.d_dtype);
  struct Ld {
    const char* name;
    int64_t ld, cols, rows, stride;
    size_t elem;
  };
  const Ld lds[] = {{"lda", eff_ld(d.lda, cols_of_a(d)), cols_of_a(d), rows_of_a(d), d.stride_a, ab},
                    {"ldb", eff_ld(d.ldb, cols_of_b(d)), cols_of_b(d), rows_of_b(d), d.stride_b, ab},
                    {"ldd", eff_ld(d.ldd, d.N), d.N, d.M, d.stride_d, dd}};
  for (const Ld& l : lds) {
    const std::string n = l.name;
    if (l.ld < l.cols) {
      return fail(n + "=" + std::to_string(l.ld) + " is smaller than the " +
                  std::to_string(l.cols) + " columns of the stored matrix (mismatched leading dimension)");
    }
    if (d.batch > 1 && l.stride < 0) return fail(n + " batch stride is negative");
  }
  if (d.batch > 1 && d.stride_d < static_cast<int64_t>(d.M) * lds[2].ld) {
    return fail("stride_d=" + std::to_string(d.stride_d) + " is smaller than M*ldd=" +
                std::to_string(static_cast<int64_t>(d.M) * lds[2].ld) +
                " (batches of D would overlap)");
  }
  return Status::ok();
}

// The pointer alignment (bytes) every batch entry and row of the desc keeps when the base
// pointers are 16-byte aligned: the largest power of two up to 16 dividing each leading
// dimension and batch stride in bytes.
uint32_t desc_alignment(const GemmDesc& d) {
  uint64_t align = 16;
  auto keep = [&](int64_t elements, DType dtype) {
    const uint64_t bytes = static_cast<uint64_t>(elements) * dtype_size(dtype);
    while (align > 1 && bytes % align != 0) align /= 2;
  };
  keep(eff_ld(d.lda, cols_of_a(d)), d.ab_dtype);
  keep(eff_ld(d.ldb, cols_of_b(d)), d.ab_dtype);
  keep(eff_ld(d.ldd, d.N), d.d_dtype);
  if (d.batch > 1) {
    keep(d.stride_a, d.ab_dtype);
    keep(d.stride_b, d.ab_dtype);
    keep(d.stride_d, d.d_dtype);
  }
  return static_cast<uint32_t>(align);
}

// Creates every descriptor run() uses, with every attribute but the bias pointer (set
// per call). Returns a message naming the failed call, or "" on success.
std::string make_descriptors(const GemmDesc& d, Descriptors& out) {
  cublasStatus_t s;
  auto failed = [&](const char* what) { return std::string(what) + " failed: " + status_text(s); };
  if ((s = cublasLtMatmulDescCreate(&out.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) {
    return failed("cublasLtMatmulDescCreate(CUBLAS_COMPUTE_32F, CUDA_R_32F)");
  }
  // cuBLAS's op(A) is our op(B)^T: stored B [K, N] (column-major N x K) needs no transpose.
  cublasOperation_t op_a = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if ((s = cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a))) !=
      CUBLAS_STATUS_SUCCESS) {
    return failed("CUBLASLT_MATMUL_DESC_TRANSA");
  }
  if ((s = cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b))) !=
      CUBLAS_STATUS_SUCCESS) {
    return failed("CUBLASLT_MATMUL_DESC_TRANSB");
  }
  cublasLtEpilogue_t epilogue = d.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if ((s = cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                          sizeof(epilogue))) != CUBLAS_STATUS_SUCCESS) {
    return failed("CUBLASLT_MATMUL_DESC_EPILOGUE");
  }
  if (d.bias) {
    cudaDataType_t bias_type = cuda_type(d.d_dtype);  // the bias has D's dtype
    if ((s = cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                            sizeof(bias_type))) != CUBLAS_STATUS_SUCCESS) {
      return failed("CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE");
    }
    int64_t bias_stride = 0;  // one bias for every batch
    if (d.batch > 1 &&
        (s = cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                            sizeof(bias_stride))) != CUBLAS_STATUS_SUCCESS) {
      return failed("CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE");
    }
  }
  // Column-major views: cuBLAS A = stored B^T, B = stored A^T, D = D^T.
  struct L {
    cublasLtMatrixLayout_t* layout;
    DType dtype;
    int64_t rows, cols, ld, stride;
    const char* name;
  };
  const L layouts[] = {
      {&out.a, d.ab_dtype, cols_of_b(d), rows_of_b(d), eff_ld(d.ldb, cols_of_b(d)), d.stride_b, "B"},
      {&out.b, d.ab_dtype, cols_of_a(d), rows_of_a(d), eff_ld(d.lda, cols_of_a(d)), d.stride_a, "A"},
      {&out.d, d.d_dtype, d.N, d.M, eff_ld(d.ldd, d.N), d.stride_d, "D"}};
  for (const L& l : layouts) {
    if ((s = cublasLtMatrixLayoutCreate(l.layout, cuda_type(l.dtype), static_cast<uint64_t>(l.rows),
                                        static_cast<uint64_t>(l.cols), l.ld)) != CUBLAS_STATUS_SUCCESS) {
      return failed((std::string("cublasLtMatrixLayoutCreate(") + l.name + ")").c_str());
    }
    if (d.batch > 1) {
      int32_t count = d.batch;
      int64_t stride = l.stride;
      if ((s = cublasLtMatrixLayoutSetAttribute(*l.layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count))) != CUBLAS_STATUS_SUCCESS) {
        return failed((std::string("CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT(") + l.name + ")").c_str());
      }
      if ((s = cublasLtMatrixLayoutSetAttribute(*l.layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride))) != CUBLAS_STATUS_SUCCESS) {
        return failed((std::string("CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET(") + l.name + ")").c_str());
      }
    }
  }
  return "";
}

// A cache entry's key: the desc and the bias pointer's alignment the heuristic saw.
struct CacheKey {
  GemmDesc desc;
  uint32_t bias_alignment = 0;
  bool operator==(const CacheKey&) const = default;
};

struct DescHash {
  size_t operator()(const CacheKey& key) const {
    const GemmDesc& d = key.desc;
    size_t h = std::hash<uint32_t>{}(key.bias_alignment);
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    uint32_t alpha_bits;
    std::memcpy(&alpha_bits, &d.alpha, 4);
    for (uint64_t v : {uint64_t(d.M), uint64_t(d.N), uint64_t(d.K), uint64_t(d.trans_a), uint64_t(d.trans_b),
                       uint64_t(d.ab_dtype), uint64_t(d.d_dtype), uint64_t(d.bias), uint64_t(d.accumulate),
                       uint64_t(alpha_bits), uint64_t(d.lda), uint64_t(d.ldb), uint64_t(d.ldd),
                       uint64_t(d.batch), uint64_t(d.stride_a), uint64_t(d.stride_b), uint64_t(d.stride_d)}) {
      mix(v);
    }
    return h;
  }
};

}  // namespace

uint32_t pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

GemmRoute choose_gemm_route(const std::function<int(bool alignment_prefs)>& found) {
  if (found(true) > 0) return GemmRoute::kAligned;
  if (found(false) > 0) return GemmRoute::kUnaligned;
  return GemmRoute::kSimple;
}

std::string GemmDesc::str() const {
  std::string s = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
  if (trans_a) s += " ta";
  if (trans_b) s += " tb";
  s += std::string(" ") + dtype_name(ab_dtype) + "->" + dtype_name(d_dtype);
  if (bias) s += " bias";
  if (accumulate) s += " acc";
  if (alpha != 1.0f) s += " alpha=" + std::to_string(alpha);
  s += " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) + " ldd=" + std::to_string(ldd);
  s += " batch=" + std::to_string(batch);
  if (batch > 1) {
    s += " strides=" + std::to_string(stride_a) + "," + std::to_string(stride_b) + "," +
         std::to_string(stride_d);
  }
  return s;
}

struct GemmEngine::Impl {
  cublasLtHandle_t handle = nullptr;
  CUstream_st* stream = nullptr;
  bool simple_only = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  struct Entry {
    Descriptors descs;
    cublasLtMatmulAlgo_t algo{};
    GemmRoute route = GemmRoute::kAligned;
    bool warned = false;  // kUnaligned: the simple kernel's warning for unaligned pointers
  };
  std::unordered_map<CacheKey, std::unique_ptr<Entry>, DescHash> cache;

  Entry& entry_for(const GemmDesc& desc, const void* bias);
  // How many algorithms the heuristic offers (0 or 1: the first is kept in *algo).
  int heuristic(const GemmDesc& desc, const Descriptors& d, bool alignment_prefs,
                cublasLtMatmulAlgo_t* algo);
};

Result<std::unique_ptr<GemmEngine>> GemmEngine::create(CUstream_st* stream, size_t workspace_bytes,
                                                      bool simple_only) {
  std::unique_ptr<GemmEngine> engine(new GemmEngine());
  engine->impl_ = std::make_unique<Impl>();
  Impl& im = *engine->impl_;
  im.stream = stream;
  im.simple_only = simple_only;
  cublasStatus_t s = cublasLtCreate(&im.handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    im.handle = nullptr;
    return Status::internal("cuBLASLt: cublasLtCreate failed: " + status_text(s) +
                            " (no usable CUDA device or driver?)");
  }
  if (workspace_bytes > 0) {
    cudaError_t e = cudaMallocAsync(&im.workspace, workspace_bytes, stream);
    if (e != cudaSuccess) {
      im.workspace = nullptr;
      return Status::internal("cuBLASLt: workspace of " + std::to_string(workspace_bytes) +
                              " bytes: cudaMallocAsync failed: " + cudaGetErrorString(e));
    }
  }
  im.workspace_bytes = workspace_bytes;
  return engine;
}

GemmEngine::~GemmEngine() {
  if (!impl_) return;
  impl_->cache.clear();
  if (impl_->workspace) cudaFreeAsync(impl_->workspace, impl_->stream);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

Status GemmEngine::describe(const GemmDesc& desc) {
  TRIDENT_RETURN_IF_ERROR(validate(desc));
  Descriptors descs;
  std::string err = make_descriptors(desc, descs);
  if (!err.empty()) return Status::internal("GEMM " + desc.str() + ": " + err);
  return Status::ok();
}

int GemmEngine::Impl::heuristic(const GemmDesc& desc, const Descriptors& d, bool alignment_prefs,
                                cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
  TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS,
                    "GEMM " + desc.str() + ": cublasLtMatmulPreferenceCreate: " + status_text(s));
  uint64_t ws = workspace_bytes;
  s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // The heuristic otherwise assumes 256-byte aligned pointers; run() promises only what
  // desc_alignment says (arena slices are 16-byte aligned; odd leading dimensions and
  // batch strides give less), so ask for algorithms that accept that.
  uint32_t align = desc_alignment(desc);
  if (alignment_prefs) {
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    }
  }
  if (s != CUBLAS_STATUS_SUCCESS) cublasLtMatmulPreferenceDestroy(pref);
  TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS,
                    "GEMM " + desc.str() + ": cublasLtMatmulPreferenceSetAttribute: " + status_text(s));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.d, d.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED is how cuBLASLt says "no algorithm"; anything else is a real failure.
  TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS || s == CUBLAS_STATUS_NOT_SUPPORTED,
                    "GEMM " + desc.str() + ": cublasLtMatmulAlgoGetHeuristic: " + status_text(s));
  if (s != CUBLAS_STATUS_SUCCESS || found <= 0) return 0;
  *algo = result.algo;
  return 1;
}

GemmEngine::Impl::Entry& GemmEngine::Impl::entry_for(const GemmDesc& desc, const void* bias) {
  const CacheKey key{desc, desc.bias ? pointer_alignment(bias) : 0u};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  Status v = validate(desc);
  TRIDENT_CHECK_MSG(v.is_ok(), v.message());
  auto entry = std::make_unique<Entry>();
  std::string err = make_descriptors(desc, entry->descs);
  TRIDENT_CHECK_MSG(err.empty(), "GEMM " + desc.str() + ": " + err);
  if (desc.bias) {  // the heuristic reads the bias pointer's alignment from it
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(entry->descs.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias));
    TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS,
                      "GEMM " + desc.str() + ": CUBLASLT_MATMUL_DESC_BIAS_POINTER: " + status_text(s));
  }
  entry->route = simple_only ? GemmRoute::kSimple : choose_gemm_route([&](bool prefs) {
    return heuristic(desc, entry->descs, prefs, &entry->algo);
  });
  if (entry->route == GemmRoute::kUnaligned) {
    log::warn("cuBLASLt: no algorithm for GEMM {} with {}-byte aligned operands; using one that "
              "needs 256-byte aligned pointers (the simple kernel runs when they are not)",
              desc.str(), desc_alignment(desc));
  } else if (entry->route == GemmRoute::kSimple && !simple_only) {  // tests ask for it
    log::warn("cuBLASLt: no algorithm for GEMM {} (workspace {} bytes), with or without "
              "alignment preferences; using the simple fp32 kernel (slow)",
              desc.str(), workspace_bytes);
  }
  Entry& ref = *entry;
  cache.emplace(key, std::move(entry));
  return ref;
}

void GemmEngine::run(const GemmDesc& desc, DevPtr a, DevPtr b, DevPtr d, DevPtr bias) {
  TRIDENT_CHECK_MSG(a.dtype() == desc.ab_dtype && b.dtype() == desc.ab_dtype,
                    "GEMM " + desc.str() + ": A is " + dtype_name(a.dtype()) + ", B is " +
                        dtype_name(b.dtype()));
  TRIDENT_CHECK_MSG(d.dtype() == desc.d_dtype, "GEMM " + desc.str() + ": D is " + dtype_name(d.dtype()));
  TRIDENT_CHECK_MSG(!a.is_null() && !b.is_null() && !d.is_null(), "GEMM " + desc.str() + ": null A, B or D");
  TRIDENT_CHECK_MSG(desc.bias == !bias.is_null(),
                    "GEMM " + desc.str() + ": bias pointer " + (bias.is_null() ? "missing" : "given without desc.bias"));
  if (desc.bias) {
    TRIDENT_CHECK_MSG(bias.dtype() == desc.d_dtype,
                      "GEMM " + desc.str() + ": bias is " + dtype_name(bias.dtype()));
  }
  const uint32_t align = desc_alignment(desc);
  for (DevPtr p : {a, b, d, bias}) {
    TRIDENT_CHECK_MSG(reinterpret_cast<uintptr_t>(p.raw()) % align == 0,
                      "GEMM " + desc.str() + ": a pointer is not " + std::to_string(align) +
                          "-byte aligned");
  }
  Impl::Entry& e = impl_->entry_for(desc, bias.raw());
  bool simple = e.route == GemmRoute::kSimple;
  if (e.route == GemmRoute::kUnaligned) {
    for (DevPtr p : {a, b, d, bias}) simple = simple || pointer_alignment(p.raw()) < 256;
    if (simple && !e.warned) {
      log::warn("cuBLASLt: GEMM {}: a pointer is not 256-byte aligned; the simple fp32 kernel runs it",
                desc.str());
      e.warned = true;
    }
  }
  if (simple) {
    SimpleGemmLayout layout;
    layout.lda = eff_ld(desc.lda, cols_of_a(desc));
    layout.ldb = eff_ld(desc.ldb, cols_of_b(desc));
    layout.ldd = eff_ld(desc.ldd, desc.N);
    layout.batch = desc.batch;
    layout.stride_a = desc.stride_a;
    layout.stride_b = desc.stride_b;
    layout.stride_d = desc.stride_d;
    layout.alpha = desc.alpha;
    cuda::simple_gemm(desc.trans_a, desc.trans_b, desc.M, desc.N, desc.K, farg(a), farg(b), farg(d),
                      farg(bias), desc.accumulate, layout, impl_->stream);
    return;
  }
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (desc.bias) {
    const void* bias_ptr = bias.raw();
    s = cublasLtMatmulDescSetAttribute(e.descs.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                       sizeof(bias_ptr));
    TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS,
                      "GEMM " + desc.str() + ": CUBLASLT_MATMUL_DESC_BIAS_POINTER: " + status_text(s));
  }
  const float alpha = desc.alpha;
  const float beta = desc.accumulate ? 1.0f : 0.0f;
  // Swapped operands (file comment): cuBLAS A = our B, cuBLAS B = our A; C = D.
  s = cublasLtMatmul(impl_->handle, e.descs.op, &alpha, b.raw(), e.descs.a, a.raw(), e.descs.b, &beta, d.raw(),
                     e.descs.d, d.raw(), e.descs.d, &e.algo, impl_->workspace, impl_->workspace_bytes,
                     impl_->stream);
  TRIDENT_CHECK_MSG(s == CUBLAS_STATUS_SUCCESS, "GEMM " + desc.str() + ": cublasLtMatmul: " + status_text(s));
}

}  // namespace trident::cuda
