// Sizes near the 32-bit limit: validation must not wrap. Every message names the key
// the user set and the value as written (not "padded vocabulary 0", "got -4" or
// "seq_len + 1 = 0"), and products that would overflow are refused with both keys.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/sampler.h"

namespace trident {
namespace {

const std::string kTiny =
    "model: {arch: gpt2, vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4, d_model: 64}\n"
    "parallel: {micro_batch_size: 4}\n"
    "data: {train: data/train.bin}\n"
    "training: {global_batch_size: 8}\n";

void expect_error(const std::vector<std::string>& overrides,
                  std::initializer_list<std::string> needles) {
  Result<Config> r = parse_config(kTiny, overrides, "cfg.yaml");
  ASSERT_FALSE(r.is_ok()) << "accepted: " << ::testing::PrintToString(overrides);
  EXPECT_EQ(r.status().exit_code(), 2);
  for (const auto& needle : needles) {
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << "message: " << r.status().message() << "\nmissing: " << needle;
  }
}

TEST(SizeValidation, DefaultFfnWidthThatOverflowsNamesDModel) {
  // gpt2: 4 * 1073741823 = 4294967292 wrapped to -4 ("model.d_ff: must be >= 1, got -4").
  expect_error({"model.d_model=1073741823", "model.n_heads=1"},
               {"model.d_model: 1073741823", "default model.d_ff (4 * d_model) of 4294967292",
                "set model.d_ff"});
  expect_error({"model.d_model=1073741824", "model.n_heads=1"},
               {"model.d_model: 1073741824", "4294967296"});
  // llama: 8C/3 rounded up to 64; 8 * C itself wraps for C > 2^28.
  expect_error({"model.arch=llama", "model.d_model=1000000000", "model.n_heads=1000"},
               {"model.d_model: 1000000000", "8 * d_model / 3 rounded up to 64", "2666666688"});
}

TEST(SizeValidation, RuntimeThreadsAreBounded) {
  // 65536 used to segfault, 40000-60000 abort in libgomp.
  for (const char* v : {"65536", "40000", "2147483647"}) {
    expect_error({std::string("runtime.threads=") + v},
                 {std::string("runtime.threads: ") + v + " is more than"});
  }
  // At least 256 are always allowed, whatever the machine's cores.
  EXPECT_TRUE(parse_config(kTiny, {"runtime.threads=256"}, "cfg.yaml").is_ok());
}

TEST(SizeValidation, DefaultFfnWidthJustInsideTheLimitIsKept) {
  // 4 * 536870911 = 2147483644 fits an int: the default applies (memory is not
  // validation's business).
  Result<Config> r =
      parse_config(kTiny, {"model.d_model=536870911", "model.n_heads=1"}, "cfg.yaml");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->model.d_ff, 2147483644);
}

TEST(SizeValidation, PaddedVocabularyThatOverflowsNamesVocabSize) {
  // round_up(2147483647, 128) wrapped to 0 ("exceeds the padded vocabulary 0").
  expect_error({"model.vocab_size=2147483647"},
               {"model.vocab_size: 2147483647", "padded to a multiple of 128 is 2147483648",
                "at most 2147483520"});
  expect_error({"model.vocab_size=2147483521"}, {"model.vocab_size: 2147483521"});
  // 2^31 - 128 is a multiple of 128: its padded size fits.
  Result<Config> r = parse_config(kTiny, {"model.vocab_size=2147483520"}, "cfg.yaml");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->model.padded_vocab, 2147483520);
}

TEST(SizeValidation, TokensPerMicroBatchMustFitAnInt) {
  expect_error({"model.seq_len=2147483647"},
               {"parallel.micro_batch_size: 4", "model.seq_len=2147483647", "8589934588 tokens"});
  expect_error({"parallel.micro_batch_size=1073741824", "training.global_batch_size=1073741824"},
               {"parallel.micro_batch_size: 1073741824", "model.seq_len=32", "34359738368"});
}

TEST(SizeValidation, AttentionProbabilitiesMustFit64Bits) {
  // 1 * 2147483647 tokens fit an int, but B * NH * T^2 = 4 * (2^31 - 1)^2 does not fit 64 bits.
  expect_error(
      {"model.seq_len=2147483647", "parallel.micro_batch_size=1", "training.global_batch_size=1"},
      {"model.seq_len: 2147483647", "parallel.micro_batch_size=1", "model.n_heads=4", "2^63"});
}

TEST(SizeValidation, ParameterCountsThatOverflow64BitsNameTheKeys) {
  // One layer: 2 * C^2 (q, o) + 2 * C^2 (k, v) with C = 2^31 - 1 is past 2^63.
  expect_error(
      {"model.d_model=2147483647", "model.n_heads=1", "model.d_ff=64", "model.vocab_size=256"},
      {"model.d_ff: 64", "model.d_model=2147483647", "one layer"});
  // ~2^49 parameters per layer times 2^31 - 1 layers.
  expect_error({"model.n_layers=2147483647", "model.d_model=65536", "model.d_ff=2147483647"},
               {"model.n_layers: 2147483647", "model.d_model=65536", "model.d_ff=2147483647",
                "overflow a 64-bit parameter count"});
}

TEST(SizeValidation, WorldSizeMustFitAnInt) {
  expect_error(
      {"parallel.dp=65536", "parallel.tp=65536", "model.n_heads=65536", "model.d_model=65536",
       "model.d_ff=65536", "parallel.micro_batch_size=1", "training.global_batch_size=65536"},
      {"parallel: dp * tp * pp = 65536 * 65536 * 1", "parallel.dp=65536", "parallel.tp=65536"});
}

TEST(SizeValidation, SampleLengthMessageDoesNotWrap) {
  auto r = num_samples_for(11600, 2147483647, "train.bin");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("seq_len + 1 = 2147483648 tokens (model.seq_len=2147483647)"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace trident
