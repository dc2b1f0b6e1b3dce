// Helpers of the tokenizer tests: files as bytes, id lines, running a reference script,
// token streams read back, random valid UTF-8.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace trident::testing {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<uint32_t> parse_ids(const std::string& line) {
  std::vector<uint32_t> ids;
  std::istringstream in(line);
  uint32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// Runs `cmd` (stderr folded into stdout); *output gets what it printed. Returns the
// status pclose reports (0 on success).
inline int run_capture(const std::string& cmd, std::string* output) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen((cmd + " 2>&1").c_str(), "r"), &::pclose);
  if (pipe == nullptr) return -1;
  output->clear();
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe.get())) > 0) output->append(buf, n);
  return ::pclose(pipe.release());
}

// The whole token stream a dataset spec names (every id checked against vocab).
inline std::vector<uint32_t> read_token_stream(const std::string& spec, int64_t vocab) {
  auto ds = TokenDataset::open(spec, vocab);
  EXPECT_TRUE(ds.is_ok()) << ds.status().message();
  if (!ds.is_ok()) return {};
  std::vector<int32_t> ids(ds->num_tokens());
  EXPECT_TRUE(ds->read(0, ids.size(), ids.data()).is_ok());
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

// `count` random code points from every plane (no surrogates), half of them ASCII so
// that words and spaces form too, UTF-8 encoded.
inline std::string random_utf8(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::string random;
  for (int i = 0; i < count; ++i) {
    uint32_t cp = rng() % 0x110000;
    if (cp >= 0xD800 && cp < 0xE000) continue;
    if (rng() % 2) cp %= 0x80;
    if (cp < 0x80) {
      random += static_cast<char>(cp);
    } else if (cp < 0x800) {
      random += static_cast<char>(0xC0 | (cp >> 6));
      random += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      random += static_cast<char>(0xE0 | (cp >> 12));
      random += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      random += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      random += static_cast<char>(0xF0 | (cp >> 18));
      random += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      random += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      random += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return random;
}

}  // namespace trident::testing
