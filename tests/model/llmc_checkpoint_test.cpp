// model/llmc_checkpoint.h against tests/reference/fixtures/gpt2_llmc.bin, which
// make_fixtures.py writes from the gpt2 fixture's parameters: the name mapping (qkv
// split, layer stacking), bf16 files, the architecture override, the writer, and the
// exact errors for missing, short, foreign, truncated and impossible files.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/llmc_checkpoint.h"
#include "model/model_config.h"
#include "tests/common/scratch_dir.h"
#include "tests/model/fixture.h"

namespace trident {
namespace {

using reference::Fixture;

std::string fixture_path(const std::string& file) {
  return std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/fixtures/" + file;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void set_header_int(std::vector<char>* bytes, int index, int32_t value) {
  std::memcpy(bytes->data() + index * 4, &value, 4);
}

class LlmcCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    original_ = read_bytes(fixture_path("gpt2_llmc.bin"));
    ASSERT_EQ(original_.size(), 121344u);
  }

  std::string write_variant(const std::string& name, const std::vector<char>& bytes) {
    const std::string path = dir_.file(name);
    write_bytes(path, bytes);
    return path;
  }

  // Reads `path`, expecting failure with exactly `message`, code invalid_input, exit 2.
  void expect_error(const std::string& path, const std::string& message) {
    auto result = read_llmc_checkpoint(path);
    ASSERT_FALSE(result.is_ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
    EXPECT_EQ(result.status().exit_code(), 2);
    EXPECT_EQ(result.status().message(), message);
    EXPECT_EQ(result.status().message().rfind(path, 0), 0u) << "message starts with the path";
  }

  testing::ScratchDir dir_;
  std::vector<char> original_;
};

TEST_F(LlmcCheckpointTest, ReadsHeaderAndMapsEveryTensorToOurNames) {
  const Fixture fx = Fixture::load(fixture_path("gpt2.bin"));
  auto ckpt = read_llmc_checkpoint(fixture_path("gpt2_llmc.bin"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->version, 3);
  EXPECT_EQ(ckpt->max_seq_len, 16);
  EXPECT_EQ(ckpt->vocab_size, 64);
  EXPECT_EQ(ckpt->padded_vocab, 128);
  EXPECT_EQ(ckpt->n_layers, 2);
  EXPECT_EQ(ckpt->n_heads, 4);
  EXPECT_EQ(ckpt->d_model, 32);

  // The same set of names as the reference model, each with the fixture's values
  // (make_fixtures.py rounds float64 to float32 to nearest, as static_cast does).
  const std::vector<std::string> ref_names = fx.names_with_prefix("param.");
  std::set<std::string> names;
  for (const auto& [name, values] : ckpt->tensors) {
    names.insert(name);
    const auto& ref = fx.f64("param." + name);
    ASSERT_EQ(values.size(), ref.size()) << name;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(values[i], static_cast<float>(ref[i])) << name << "[" << i << "]";
    }
  }
  EXPECT_EQ(names, std::set<std::string>(ref_names.begin(), ref_names.end()));
  EXPECT_EQ(ckpt->tensors.front().first, "wte");
  EXPECT_EQ(ckpt->tensors.back().first, "lnf.bias");

  // Spot checks of the split qkv block: the k rows of layer 1 and their bias.
  const std::vector<float>* k1 = ckpt->find("layers.1.attn.k.weight");
  ASSERT_NE(k1, nullptr);
  EXPECT_EQ((*k1)[5 * 32 + 7], static_cast<float>(fx.f64("param.layers.1.attn.k.weight")[5 * 32 + 7]));
  const std::vector<float>* kb1 = ckpt->find("layers.1.attn.k.bias");
  ASSERT_NE(kb1, nullptr);
  EXPECT_EQ((*kb1)[3], static_cast<float>(fx.f64("param.layers.1.attn.k.bias")[3]));
  EXPECT_EQ(ckpt->find("lm_head.weight"), nullptr);
}

TEST_F(LlmcCheckpointTest, ReadsBf16VersionWithinRounding) {
  // Version 5: same header, every fp32 value of the payload as bf16.
  std::vector<char> bf16(original_.begin(), original_.begin() + 1024);
  set_header_int(&bf16, 1, 5);
  const size_t n = (original_.size() - 1024) / 4;
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, original_.data() + 1024 + 4 * i, 4);
    const bf16_t h = float_to_bf16(f);
    bf16.insert(bf16.end(), reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + 2);
  }
  const std::string path = write_variant("bf16.bin", bf16);
  auto half = read_llmc_checkpoint(path);
  ASSERT_TRUE(half.is_ok()) << half.status().message();
  auto full = read_llmc_checkpoint(fixture_path("gpt2_llmc.bin"));
  ASSERT_TRUE(full.is_ok());
  EXPECT_EQ(half->version, 5);
  ASSERT_EQ(half->tensors.size(), full->tensors.size());
  double worst_rel = 0;
  for (size_t t = 0; t < full->tensors.size(); ++t) {
    ASSERT_EQ(half->tensors[t].first, full->tensors[t].first);
    const auto& a = half->tensors[t].second;
    const auto& b = full->tensors[t].second;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < b.size(); ++i) {
      ASSERT_EQ(a[i], bf16_to_float(float_to_bf16(b[i]))) << full->tensors[t].first << i;
      // Round to nearest, 8 significant bits: error <= half an ulp = 2^-8 of |b| at most.
      ASSERT_LE(std::abs(a[i] - b[i]), std::abs(b[i]) * (1.0f / 256)) << full->tensors[t].first;
      if (b[i] != 0) worst_rel = std::max(worst_rel, double(std::abs(a[i] - b[i]) / std::abs(b[i])));
    }
  }
  EXPECT_GT(worst_rel, 0.0) << "the bf16 file must actually have lost precision";

  // A bf16 file one byte short of its (smaller) expected size.
  bf16.pop_back();
  const std::string short_path = write_variant("bf16_short.bin", bf16);
  expect_error(short_path, short_path +
                               ": size mismatch: the header (version 5, maxT 16, Vp 128, L 2, "
                               "C 32) implies 61184 bytes, the file has 61183 bytes");
}

TEST_F(LlmcCheckpointTest, MissingFile) {
  const std::string path = dir_.file("nope.bin");
  expect_error(path, path + ": cannot read llm.c checkpoint: No such file or directory");
}

TEST_F(LlmcCheckpointTest, ShorterThanHeader) {
  const std::string path =
      write_variant("short.bin", std::vector<char>(original_.begin(), original_.begin() + 100));
  expect_error(path, path + ": 100 bytes is shorter than the 1024-byte llm.c header");
}

TEST_F(LlmcCheckpointTest, WrongMagic) {
  std::vector<char> bytes = original_;
  set_header_int(&bytes, 0, 20240327);
  const std::string path = write_variant("magic.bin", bytes);
  expect_error(path, path + ": bad magic 20240327, expected 20240326 (not an llm.c GPT-2 checkpoint)");
}

TEST_F(LlmcCheckpointTest, UnsupportedVersion) {
  std::vector<char> bytes = original_;
  set_header_int(&bytes, 1, 4);
  const std::string path = write_variant("version.bin", bytes);
  expect_error(path, path + ": unsupported llm.c checkpoint version 4 (supported: 3 = fp32, 5 = bf16)");
}

TEST_F(LlmcCheckpointTest, ImpossibleHeaderValues) {
  std::vector<char> bytes = original_;
  set_header_int(&bytes, 6, 30);  // C = 30 with NH = 4
  std::string path = write_variant("c30.bin", bytes);
  expect_error(path, path + ": impossible header: d_model 30 is not divisible by n_heads 4");

  bytes = original_;
  set_header_int(&bytes, 4, 0);  // L = 0
  path = write_variant("l0.bin", bytes);
  expect_error(path, path + ": impossible header: n_layers 0 is outside [1, 4096]");

  bytes = original_;
  set_header_int(&bytes, 7, 63);  // Vp < V
  path = write_variant("vp.bin", bytes);
  expect_error(path, path + ": impossible header: padded_vocab_size 63 is smaller than vocab_size 64");

  bytes = original_;
  set_header_int(&bytes, 6, -32);
  path = write_variant("neg.bin", bytes);
  expect_error(path, path + ": impossible header: d_model -32 is outside [1, 262144]");
}

TEST_F(LlmcCheckpointTest, TruncatedByOneByte) {
  const std::string path =
      write_variant("trunc.bin", std::vector<char>(original_.begin(), original_.end() - 1));
  expect_error(path, path +
                         ": size mismatch: the header (version 3, maxT 16, Vp 128, L 2, C 32) "
                         "implies 121344 bytes, the file has 121343 bytes");
}

TEST_F(LlmcCheckpointTest, OneByteTooLong) {
  std::vector<char> bytes = original_;
  bytes.push_back(0);
  const std::string path = write_variant("long.bin", bytes);
  expect_error(path, path +
                         ": size mismatch: the header (version 3, maxT 16, Vp 128, L 2, C 32) "
                         "implies 121344 bytes, the file has 121345 bytes");
}

// A NaN or Inf weight is refused when the file is read, naming the tensor and the element
// (not found by the loss guard at step 1 and blamed on the learning rate).
TEST_F(LlmcCheckpointTest, NonFiniteWeightsAreRefusedNamingTheTensor) {
  auto set_float = [](std::vector<char>* bytes, size_t index, float value) {
    std::memcpy(bytes->data() + 1024 + 4 * index, &value, 4);
  };
  const char* kWhy = " (weights must be finite: a corrupt file or one saved from a diverged run)";
  // wte holds Vp * C = 4096 values, so float 4096 + 7 is element 7 of wpe (maxT * C = 512).
  std::vector<char> bytes = original_;
  set_float(&bytes, 4096 + 7, std::numeric_limits<float>::quiet_NaN());
  std::string path = write_variant("nan.bin", bytes);
  expect_error(path, path + ": tensor wpe: element 7 of 512 is NaN" + kWhy);
  // The last value of the file is element 31 of lnf.bias.
  bytes = original_;
  set_float(&bytes, (original_.size() - 1024) / 4 - 1, std::numeric_limits<float>::infinity());
  path = write_variant("inf.bin", bytes);
  expect_error(path, path + ": tensor lnf.bias: element 31 of 32 is +Inf" + kWhy);
  // A bf16 file: -Inf (0xff80) as element 0 of layers.0.ln1.weight, right after wpe.
  std::vector<char> bf16(original_.begin(), original_.begin() + 1024);
  set_header_int(&bf16, 1, 5);
  bf16.resize(1024 + (original_.size() - 1024) / 2, 0);
  const uint16_t neg_inf = 0xff80;
  std::memcpy(bf16.data() + 1024 + 2 * (4096 + 512), &neg_inf, 2);
  path = write_variant("bf16_inf.bin", bf16);
  expect_error(path, path + ": tensor layers.0.ln1.weight: element 0 of 32 is -Inf" + kWhy);
}

TEST_F(LlmcCheckpointTest, ApplyArchitectureOverridesTheConfig) {
  auto ckpt = read_llmc_checkpoint(fixture_path("gpt2_llmc.bin"));
  ASSERT_TRUE(ckpt.is_ok());
  TransformerConfig config;
  config.arch = Arch::kLlama;
  config.n_kv_heads = 2;
  config.d_ff = 100;
  config.tie_embeddings = 0;
  config.seq_len = 8;  // shorter than the file's 16 positions: kept
  ASSERT_TRUE(apply_llmc_architecture(*ckpt, &config).is_ok());
  config.finalize();
  EXPECT_TRUE(config.validate().is_ok()) << config.validate().message();
  EXPECT_EQ(config.arch, Arch::kGpt2);
  EXPECT_EQ(config.vocab_size, 64);
  EXPECT_EQ(config.padded_vocab, 128);
  EXPECT_EQ(config.n_layers, 2);
  EXPECT_EQ(config.n_heads, 4);
  EXPECT_EQ(config.n_kv_heads, 4);
  EXPECT_EQ(config.d_model, 32);
  EXPECT_EQ(config.d_ff, 128);
  EXPECT_EQ(config.head_dim, 8);
  EXPECT_TRUE(config.tied());
  EXPECT_EQ(config.seq_len, 8);
  EXPECT_EQ(config.max_seq_len, 16);
}

TEST_F(LlmcCheckpointTest, SeqLenBeyondTheFilesPositionsIsAConfigError) {
  auto ckpt = read_llmc_checkpoint(fixture_path("gpt2_llmc.bin"));
  ASSERT_TRUE(ckpt.is_ok());
  TransformerConfig config;
  config.seq_len = 17;
  const TransformerConfig before = config;
  const Status st = apply_llmc_architecture(*ckpt, &config);
  EXPECT_EQ(st.code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message(), "model.seq_len: 17 exceeds the 16 positions of model.init_from " +
                              fixture_path("gpt2_llmc.bin"));
  EXPECT_EQ(config.n_layers, before.n_layers) << "config untouched on error";
  EXPECT_EQ(config.d_model, before.d_model);
}

TEST_F(LlmcCheckpointTest, WriterRoundTripsByteForByte) {
  auto ckpt = read_llmc_checkpoint(fixture_path("gpt2_llmc.bin"));
  ASSERT_TRUE(ckpt.is_ok());
  TransformerConfig config;
  config.seq_len = 16;
  ASSERT_TRUE(apply_llmc_architecture(*ckpt, &config).is_ok());
  config.finalize();
  const std::string path = dir_.file("written.bin");
  const LlmcCheckpoint& c = *ckpt;
  ASSERT_TRUE(write_llmc_checkpoint(path, config, [&](const std::string& name) -> const float* {
                const auto* t = c.find(name);
                return t ? t->data() : nullptr;
              }).is_ok());
  EXPECT_EQ(read_bytes(path), original_);

  // A parameter the lookup cannot provide is an error naming it.
  const Status st = write_llmc_checkpoint(path, config, [&](const std::string& name) -> const float* {
    if (name == "layers.1.mlp.fc.bias") return nullptr;
    return c.find(name)->data();
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(st.message(), path + ": no parameter layers.1.mlp.fc.bias");

  // llm.c cannot hold a llama model.
  TransformerConfig llama;
  llama.arch = Arch::kLlama;
  llama.finalize();
  EXPECT_EQ(write_llmc_checkpoint(path, llama, [](const std::string&) { return nullptr; }).code(),
            StatusCode::kInvalidConfig);
}

}  // namespace
}  // namespace trident
