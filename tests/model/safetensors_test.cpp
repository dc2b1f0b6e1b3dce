// model/safetensors.h: the bytes encode_safetensors writes (header length, 8-byte
// aligned JSON header, data), read back exactly; BF16 and F16 widened; damaged files
// refused with messages that name the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

TEST(Safetensors, EncodeThenReadGivesTheTensorsBack) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
  const std::vector<float> b = {7.0f};
  const std::string bytes = encode_safetensors({{"a.weight", {2, 3}, a.data()}, {"b", {1}, b.data()}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * 7);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({24, 28}));

  testing::ScratchDir dir;
  dir.write("m.safetensors", bytes);
  auto file = read_safetensors(dir.file("m.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  ASSERT_NE(file.value().find("a.weight"), nullptr);
  EXPECT_EQ(file.value().find("a.weight")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(file.value().find("a.weight")->data, a);
  EXPECT_EQ(file.value().find("b")->data, b);
  EXPECT_EQ(file.value().find("c"), nullptr);
}

TEST(Safetensors, HalfPrecisionIsWidened) {
  // bf16 0x3fc0 = 1.5, f16 0xc500 = -5.0, f16 0x0001 = 2^-24 (subnormal).
  const uint16_t data[] = {0x3fc0, 0xc500, 0x0001};
  const std::string json =
      R"({"x": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},)"
      R"( "y": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]}})";
  testing::ScratchDir dir;
  dir.write("h.safetensors", with_header(json, std::string(reinterpret_cast<const char*>(data), 6)));
  auto file = read_safetensors(dir.file("h.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file.value().find("x")->data, (std::vector<float>{1.5f}));
  EXPECT_EQ(file.value().find("y")->data, (std::vector<float>{-5.0f, 0x1p-24f}));
}

TEST(Safetensors, DamagedFilesAreRefusedNamingTheFile) {
  testing::ScratchDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto expect_error = [&](const std::string& bytes, const std::string& what) {
    dir.write("bad.safetensors", bytes);
    auto file = read_safetensors(path);
    ASSERT_FALSE(file.is_ok()) << what;
    EXPECT_EQ(file.status().exit_code(), 2);
    EXPECT_EQ(file.status().message().rfind(path + ": ", 0), 0u) << file.status().message();
    EXPECT_NE(file.status().message().find(what), std::string::npos) << file.status().message();
  };
  expect_error("abc", "shorter than the 8-byte header length");
  expect_error(with_header("{}", "").substr(0, 9), "header claims 2 bytes");
  expect_error(with_header("[1, 2]", ""), "not a JSON object");
  expect_error(with_header("{\"x\": 1", ""), "not a JSON object");
  expect_error(with_header(R"({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
                           std::string(8, '\0')), "unsupported dtype I64");
  expect_error(with_header(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                           std::string(8, '\0')), "needs 12");
  expect_error(with_header(R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                           std::string(8, '\0')), "truncated");
  expect_error(with_header(R"({"x": {"dtype": "F32", "shape": [4]}})", ""), "malformed");
  // Non-finite weights: a NaN in an F32 tensor, +Inf in a BF16 one (0x7f80), each named.
  const float f32[] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  expect_error(with_header(R"({"ok": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                           R"( "h.0.w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                           std::string("\0\0\0\0", 4) +
                               std::string(reinterpret_cast<const char*>(f32), 8)),
               "tensor 'h.0.w': element 1 of 2 is NaN (weights must be finite");
  const uint16_t bf16[] = {0x3fc0, 0x3fc0, 0x7f80};
  expect_error(with_header(R"({"lm_head.weight": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}})",
                           std::string(reinterpret_cast<const char*>(bf16), 6)),
               "tensor 'lm_head.weight': element 2 of 3 is +Inf (weights must be finite");
  EXPECT_NE(read_safetensors(dir.file("none")).status().message().find(dir.file("none")),
            std::string::npos);
}

}  // namespace
}  // namespace trident
