// data.train as a blend (config/config.h, data/blend.h): parsing, errors naming the
// entry and the YAML round trip the checkpoint relies on (the data fingerprint of a
// blend: tests/trainer/blend_fingerprint_test.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace trident {
namespace {

const std::string kBlend =
    "data:\n  train:\n    - {path: a/train_*.bin, weight: 0.7}\n    - path: \"b/mega\"\n"
    "      weight: 3e-1\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Result<Config> r = parse_config(yaml, overrides, "cfg.yaml");
  EXPECT_FALSE(r.is_ok()) << yaml;
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  return r.status().message();
}

TEST(BlendConfig, ParsesAListOfPathAndWeight) {
  Result<Config> c = parse_config(kBlend, {});
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_TRUE(c->data.train.empty());
  ASSERT_EQ(c->data.train_blend.size(), 2u);
  EXPECT_EQ(c->data.train_blend[0], (BlendSource{"a/train_*.bin", 0.7}));
  EXPECT_EQ(c->data.train_blend[1], (BlendSource{"b/mega", 0.3}));
  EXPECT_EQ(data_train_text(c->data),
            "[{path: \"a/train_*.bin\", weight: 0.7}, {path: \"b/mega\", weight: 0.3}]");
}

TEST(BlendConfig, RoundTripsThroughConfigToYaml) {
  Config c = parse_config(kBlend, {}).value();
  c.data.train_blend[1].weight = 1e-30;  // an exponent without a dot in the mantissa
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("  train: [{path: \"a/train_*.bin\", weight: 0.7}, {path: \"b/mega\", "
                      "weight: 1.0e-30}]\n"),
            std::string::npos)
      << yaml;
  Result<Config> back = parse_config(yaml, {});
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_TRUE(back->data.train_blend == c.data.train_blend);
  EXPECT_EQ(config_values(back.value()), config_values(c));
  // A plain spec still round-trips, and --set switches between the two forms.
  Config plain = parse_config(kBlend, {"data.train=x/y.bin"}).value();
  EXPECT_EQ(plain.data.train, "x/y.bin");
  EXPECT_TRUE(plain.data.train_blend.empty());
  Config set = parse_config("data: {train: x.bin}\n",
                            {"data.train=[{path: p, weight: 2}, {path: q, weight: 1}]"})
                   .value();
  ASSERT_EQ(set.data.train_blend.size(), 2u);
  EXPECT_TRUE(set.data.train.empty());
}

TEST(BlendConfig, ErrorsNameTheEntry) {
  auto blend = [](const std::string& list) { return "data:\n  train: " + list + "\n"; };
  EXPECT_NE(error_of(blend("[{path: a, weight: 0}]"))
                .find("data.train[0].weight: expected a positive finite number, got '0'"),
            std::string::npos);
  EXPECT_NE(error_of(blend("[{path: a, weight: 1}, {path: b, weight: -2}]"))
                .find("data.train[1].weight: expected a positive finite number, got '-2'"),
            std::string::npos);
  EXPECT_NE(error_of(blend("[{path: a, weight: x}]")).find("data.train[0].weight: expected a number"),
            std::string::npos);
  EXPECT_NE(error_of(blend("[{weight: 1}]")).find("data.train[0]: missing path"), std::string::npos);
  EXPECT_NE(error_of(blend("[{path: a}]")).find("data.train[0]: missing weight"), std::string::npos);
  EXPECT_NE(error_of(blend("[{path: a, weight: 1, wieght: 2}]"))
                .find("unknown key data.train[0].wieght; allowed keys in a blend entry: path, weight"),
            std::string::npos);
  EXPECT_NE(error_of(blend("[]")).find("data.train: an empty blend"), std::string::npos);
  EXPECT_NE(error_of(blend("[a.bin]")).find("data.train[0]: expected a mapping {path, weight}"),
            std::string::npos);
  EXPECT_NE(error_of(blend("{path: a}")).find("data.train: expected a path"), std::string::npos);
}

}  // namespace
}  // namespace trident
