#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/status.h"
#include "core/tensor.h"

namespace trident {
namespace {

// Philox4x32-10 known-answer vectors from the Random123 distribution (kat_vectors).
TEST(Philox, KnownAnswers) {
  auto zero = philox4x32(0, 0, 0);
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  auto ones = philox4x32(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[1], 0x41c83b0eu);
  EXPECT_EQ(ones[2], 0xa20bc7c6u);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
}

TEST(Rng, NormalMomentsAndIndependenceOfOrder) {
  uint64_t key = rng_key(42, hash_name("layers.0.attn.q.weight"));
  const int n = 200000;
  double sum = 0, sum2 = 0;
  for (int i = n - 1; i >= 0; --i) {  // order of drawing must not matter
    double x = normal_at(key, static_cast<uint64_t>(i));
    sum += x;
    sum2 += x * x;
  }
  double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
  EXPECT_EQ(normal_at(key, 17), normal_at(key, 17));
  EXPECT_NE(normal_at(key, 17), normal_at(rng_key(43, hash_name("layers.0.attn.q.weight")), 17));
}

TEST(Rng, UniformIntInRange) {
  uint64_t key = rng_key(1, 2);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    uint64_t x = uniform_int_at(key, static_cast<uint64_t>(i), 7);
    ASSERT_LT(x, 7u);
    counts[x]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(Status, ExitCodes) {
  EXPECT_EQ(Status::ok().exit_code(), 0);
  EXPECT_EQ(Status::invalid_config("x").exit_code(), 2);
  EXPECT_EQ(Status::invalid_input("x").exit_code(), 2);
  EXPECT_EQ(Status::corrupt("x").exit_code(), 1);
  Status s = Status::invalid_input("bad magic").with_context("data/a.bin");
  EXPECT_EQ(s.message(), "data/a.bin: bad magic");
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
}

TEST(Arena, AlignedOffsets) {
  Arena arena;
  size_t a = arena.reserve(10);
  size_t b = arena.reserve(100);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b % Arena::kAlignment, 0u);
  EXPECT_GE(b, 10u);
  EXPECT_EQ(arena.total_bytes(), b + 100);
}

}  // namespace
}  // namespace trident
