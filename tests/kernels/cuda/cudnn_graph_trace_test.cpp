// The cuDNN SDPA graphs are cudnn-frontend's, descriptor for descriptor: every operation
// descriptor build_cudnn_sdpa_graph finalizes (its mode, math precision, axis, and every
// input and output tensor's dtype, dims, strides, virtuality, by-value flag and alignment)
// equals what cudnn-frontend 3929da2 finalizes for the same sdpa / sdpa_backward graph
// (causal, attn_scale by value, deterministic backward, io bf16, fp32 intermediates, as
// llm.c builds it). The golden traces in tests/kernels/cuda/data/ come from
// tests/kernels/cuda/fe_trace/fe_sdpa_graph.cpp under CUDNN_LOGLEVEL_DBG=3, normalized by
// tests/kernels/cuda/fe_trace/normalize.py; this test applies the same normalization to cuDNN's
// API log of our builder, caught with cudnnSetCallback. Host only. The goldens were
// captured under cuDNN 9.19.0, and the log's field list and format belong to the cuDNN
// release: under another runtime version the test is skipped, naming both versions.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"

namespace trident::cuda {
namespace {

// cuDNN hands each API log message as NUL-separated lines ending in an empty one.
void collect(cudnnSeverity_t, void* udata, const cudnnDebug_t*, const char* msg) {
  std::string& out = *static_cast<std::string*>(udata);
  for (const char* p = msg; *p != '\0'; p += std::char_traits<char>::length(p) + 1) {
    out += p;
    out += '\n';
  }
  out += '\n';
}

// normalize.py, in C++.
std::string normalize(const std::string& text) {
  std::vector<std::string> blocks;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    blocks.push_back(text.substr(at, end - at));
    at = end + 2;
  }
  static const std::regex prefix("^[A-Za-z]! ");
  static const std::regex uid_re("uid: type=int64_t; val=(-?[0-9]+);");
  std::map<std::string, std::string> uids;
  std::string out;
  bool first = true;
  for (std::string b : blocks) {
    while (!b.empty() && b.front() == '\n') b.erase(b.begin());
    std::vector<std::string> lines;
    std::istringstream in(b);
    for (std::string l; std::getline(in, l);) {
      l = std::regex_replace(l, prefix, "", std::regex_constants::format_first_only);
      while (!l.empty() && (l.back() == ' ' || l.back() == '\r')) l.pop_back();
      lines.push_back(l);
    }
    if (lines.size() < 2 || lines[0].find("function cudnnBackendFinalize() called:") == std::string::npos) continue;
    const std::string head = lines[1].substr(lines[1].find_first_not_of(' '));
    if (head.rfind("descriptor: type=CUDNN_BACKEND_OPERATION_", 0) != 0) continue;
    if (head.rfind("descriptor: type=CUDNN_BACKEND_OPERATIONGRAPH", 0) == 0) continue;
    if (!first) out += "=====\n";
    first = false;
    for (size_t i = 1; i < lines.size(); ++i) {
      std::string l = lines[i];
      if (l.find("Time:") != std::string::npos || l.find("Process=") != std::string::npos) continue;
      std::smatch m;
      if (std::regex_search(l, m, uid_re)) {
        const std::string u = m[1];
        auto it = uids.find(u);
        if (it == uids.end()) it = uids.emplace(u, "U" + std::to_string(uids.size())).first;
        const std::string from = "val=" + u + ";";
        l.replace(l.find(from), from.size(), "val=" + it->second + ";");
      }
      out += l + "\n";
    }
  }
  return out;
}

std::string trace_of_our_graph(const AttentionShape& shape, bool backward) {
  unsigned mask = 0;
  void* udata = nullptr;
  cudnnCallback_t previous = nullptr;
  cudnnGetCallback(&mask, &udata, &previous);
  std::string log;
  EXPECT_EQ(cudnnSetCallback(CUDNN_SEV_ERROR_EN | CUDNN_SEV_WARNING_EN | CUDNN_SEV_INFO_EN, &log, collect),
            CUDNN_STATUS_SUCCESS);
  Status s = build_cudnn_sdpa_graph(shape, backward, nullptr);
  cudnnSetCallback(mask, udata, previous);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return normalize(log);
}

std::string read_golden(const std::string& name) {
  std::ifstream in(std::string(TRIDENT_SOURCE_DIR) + "/tests/kernels/cuda/data/" + name);
  EXPECT_TRUE(in.good()) << "missing golden trace tests/kernels/cuda/data/" << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first differing line, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  std::istringstream a(want), b(got);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ea = !std::getline(a, la), eb = !std::getline(b, lb);
    if (ea && eb) return "identical";
    if (ea || eb || la != lb) {
      return "line " + std::to_string(line) + ": cudnn-frontend '" + (ea ? "<end>" : la) + "', ours '" +
             (eb ? "<end>" : lb) + "'";
    }
  }
}

struct TraceCase {
  bool backward;
  AttentionShape shape;
  const char* golden;
};

// cudnnGetVersion() of the cuDNN the goldens were captured under.
constexpr size_t kGoldenCudnnVersion = 91900;

TEST(CudnnSdpaGraphTrace, OperationDescriptorsEqualCudnnFrontends) {
  if (cudnnGetVersion() != kGoldenCudnnVersion) {
    GTEST_SKIP() << "the golden traces are cuDNN " << kGoldenCudnnVersion
                 << "'s API log; the runtime cuDNN is " << cudnnGetVersion()
                 << " (its log format may differ)";
  }
  const TraceCase cases[] = {
      {false, {2, 7, 4, 2, 64, DType::kBF16}, "fe_sdpa_fwd_B2_T7_NH4_NKV2_HD64.trace"},
      {true, {2, 7, 4, 4, 64, DType::kBF16}, "fe_sdpa_bwd_B2_T7_NH4_NKV4_HD64.trace"},
      {true, {2, 7, 4, 2, 64, DType::kBF16}, "fe_sdpa_bwd_B2_T7_NH4_NKV2_HD64.trace"},
      {true, {1, 33, 4, 1, 32, DType::kBF16}, "fe_sdpa_bwd_B1_T33_NH4_NKV1_HD32.trace"},
  };
  for (const TraceCase& c : cases) {
    const std::string want = read_golden(c.golden);
    const std::string got = trace_of_our_graph(c.shape, c.backward);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(got == want) << c.golden << ": " << first_difference(want, got);
  }
}

}  // namespace
}  // namespace trident::cuda
