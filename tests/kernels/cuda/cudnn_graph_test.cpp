// The composite causal SDPA graphs of the cuDNN attention path finalize as cuDNN operation
// graphs on the host (no device needed), with the op sequence cudnn-frontend builds.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/ops.h"

namespace trident::cuda {
namespace {

// Asserts that `needles` occur in `summary` in this order, each after the previous one.
void expect_in_order(const std::string& summary, const std::vector<std::string>& needles) {
  size_t at = 0;
  for (const std::string& n : needles) {
    size_t found = summary.find(n, at);
    ASSERT_NE(found, std::string::npos) << "'" << n << "' not found (in order) in: " << summary;
    at = found + n.size();
  }
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

struct GraphCase {
  int B, T, NH, NKV, HD;
};
const GraphCase kCases[] = {
    {2, 7, 4, 4, 64},  {2, 33, 4, 4, 32},  // MHA, odd T
    {2, 7, 4, 2, 64},  {2, 33, 4, 2, 32},  // GQA
    {1, 33, 4, 1, 64}, {2, 128, 4, 1, 32},  // MQA
    {4, 1024, 12, 12, 64},  // GPT-2 124M
};

std::string name(const GraphCase& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " NH=" + std::to_string(c.NH) +
         " NKV=" + std::to_string(c.NKV) + " HD=" + std::to_string(c.HD);
}

TEST(CudnnSdpaGraph, ForwardFinalizesWithTheCompositeSoftmax) {
  for (const GraphCase& c : kCases) {
    std::string summary;
    Status s = build_cudnn_sdpa_graph({c.B, c.T, c.NH, c.NKV, c.HD, DType::kBF16}, false, &summary);
    ASSERT_TRUE(s.is_ok()) << name(c) << ": " << s.message();
    expect_in_order(summary, {"matmul(Q,KT)->S", "pointwise mul(S,attn_scale)", "gen_index axis2",
                              "gen_index axis3", "cmp_ge(row,col)->keep", "binary_select(S_scaled,neg_inf,keep)",
                              "reduction max", "pointwise sub", "pointwise exp", "reduction add",
                              "pointwise log", "pointwise add(Max,log_SumExp)->Stats", "pointwise div",
                              "matmul(P,V)->O"});
    EXPECT_EQ(count(summary, "; ") + 1, 14) << summary;  // FE's 14 forward ops
  }
}

TEST(CudnnSdpaGraph, BackwardFinalizesAndReducesDkDvOnlyForGqa) {
  for (const GraphCase& c : kCases) {
    std::string summary;
    Status s = build_cudnn_sdpa_graph({c.B, c.T, c.NH, c.NKV, c.HD, DType::kBF16}, true, &summary);
    ASSERT_TRUE(s.is_ok()) << name(c) << ": " << s.message();
    const bool gqa = c.NKV != c.NH;
    expect_in_order(summary, {"pointwise mul(dO,O)", "reduction add(dO_O)", "->softmax_sum",
                              "matmul(Q,KT)->S", "pointwise sub(S_scaled,Stats)", "binary_select",
                              "pointwise exp(S_masked)->P", "reshape(P)->PT",
                              gqa ? "matmul(PT,dO)->dV_fullhead" : "matmul(PT,dO)->dV",
                              "matmul(dO,VT)->dP", "pointwise sub(dP,softmax_sum)", "pointwise mul(dP_minus_sum,P)",
                              "->dS", "reshape(dS)->dST",
                              gqa ? "matmul(dST,Q)->dK_fullhead" : "matmul(dST,Q)->dK",
                              "reshape(KT)->K", "matmul(dS,K)->dQ"});
    EXPECT_EQ(count(summary, "reduction add(dV_fullhead)->dV"), gqa ? 1 : 0) << summary;
    EXPECT_EQ(count(summary, "reduction add(dK_fullhead)->dK"), gqa ? 1 : 0) << summary;
    EXPECT_EQ(count(summary, "; ") + 1, gqa ? 23 : 21) << summary;  // FE: 21 ops, +2 reductions for GQA
  }
}

TEST(CudnnSdpaGraph, NullSummaryIsAllowed) {
  EXPECT_TRUE(build_cudnn_sdpa_graph({1, 7, 2, 1, 16, DType::kBF16}, true, nullptr).is_ok());
}

void expect_rejected(const AttentionShape& shape, const std::string& needle) {
  for (bool backward : {false, true}) {
    std::string summary = "untouched";
    Status s = build_cudnn_sdpa_graph(shape, backward, &summary);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_EQ(summary, "untouched");
  }
}

TEST(CudnnSdpaGraph, RejectsHeadsNotDivisibleByKvHeads) {
  expect_rejected({2, 7, 4, 3, 64, DType::kBF16}, "NH=4 is not divisible by NKV=3");
}

TEST(CudnnSdpaGraph, RejectsAZeroHeadDim) {
  expect_rejected({2, 7, 4, 2, 0, DType::kBF16}, "every dimension must be positive (HD=0");
}

TEST(CudnnSdpaGraph, RejectsHeadDimsCudnnCannotRun) {
  expect_rejected({2, 7, 4, 2, 20, DType::kBF16}, "head dim HD=20 must be a multiple of 8 and at most 256");
  expect_rejected({2, 7, 4, 2, 264, DType::kBF16}, "head dim HD=264");
}

TEST(CudnnSdpaGraph, RejectsF32) {
  expect_rejected({2, 7, 4, 2, 64, DType::kF32}, "dtype f32 is not bf16");
}

}  // namespace
}  // namespace trident::cuda

namespace trident::cuda {
namespace {

// make_cudnn_attention says why it cannot serve a shape, before touching a device for a
// bad shape, and names cudnnCreate's failure without one. (A CPU Ops stands in: nothing is
// allocated on these paths.)
TEST(MakeCudnnAttention, SaysWhyNot) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  auto f32 = make_cudnn_attention(*ops, nullptr, {2, 7, 4, 2, 64, DType::kF32});
  ASSERT_FALSE(f32.is_ok());
  EXPECT_NE(f32.status().message().find("dtype f32 is not bf16"), std::string::npos) << f32.status().message();
  auto hd = make_cudnn_attention(*ops, nullptr, {2, 7, 4, 2, 20, DType::kBF16});
  ASSERT_FALSE(hd.is_ok());
  EXPECT_NE(hd.status().message().find("head dim HD=20"), std::string::npos) << hd.status().message();
  auto t1 = make_cudnn_attention(*ops, nullptr, {2, 1, 4, 2, 64, DType::kBF16});
  ASSERT_FALSE(t1.is_ok());
  EXPECT_NE(t1.status().message().find("T=1 is not supported"), std::string::npos) << t1.status().message();
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return;  // the rest is about no device
  auto none = make_cudnn_attention(*ops, nullptr, {2, 7, 4, 2, 64, DType::kBF16});
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("cudnnCreate failed"), std::string::npos) << none.status().message();
}

}  // namespace
}  // namespace trident::cuda
