// data.train as a blend (trainer/config.h, data/blend.h): parsing, errors naming the
// entry, the YAML round trip the checkpoint relies on, and the data fingerprint of a
// blend (trainer/resume_compat.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/loader.h"
#include "data/token_file.h"
#include "tests/common/scratch_dir.h"
#include "config/config.h"
#include "trainer/resume_compat.h"

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

// The fingerprint of a blend lists every component's files and the schedule, so the
// same files mixed differently are not "the same data".
TEST(BlendFingerprint, CoversEveryComponentAndTheSchedule) {
  testing::ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("a.bin"), std::vector<uint32_t>(500, 1), 1).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("b.bin"), std::vector<uint32_t>(700, 2), 1).is_ok());
  auto fingerprint = [&](double wa, double wb, DataConfig* data) {
    data->train_blend = {{dir.file("a.bin"), wa}, {dir.file("b.bin"), wb}};
    auto l = DataLoader::open_blend(data->train_blend, 256, 1, true);
    EXPECT_TRUE(l.is_ok()) << l.status().message();
    return fingerprint_datasets(l->datasets(), l->blend(), *data).value();
  };
  DataConfig was_data, now_data;
  const DataFingerprint was = fingerprint(0.7, 0.3, &was_data);
  ASSERT_TRUE(was.files.has_value());
  ASSERT_EQ(was.files->size(), 2u);
  EXPECT_EQ((*was.files)[1].path, dir.file("b.bin"));
  EXPECT_EQ(was.total_tokens, std::optional<uint64_t>(1200));
  EXPECT_EQ(was.blend, std::optional<std::string>("7/1 3/1"));
  EXPECT_EQ(was.spec, data_train_text(was_data));
  const nlohmann::json j = was;
  EXPECT_EQ(j.get<DataFingerprint>().blend, was.blend);

  const DataFingerprint now = fingerprint(0.5, 0.5, &now_data);
  Config saved = parse_config("data: {train: x}\n", {}).value(), current = saved;
  saved.data = was_data;
  current.data = now_data;
  const ResumeCompat c = compare_for_resume(saved, current, 3, was, now);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("data.train: the checkpoint was trained with \"[{path: \"" +
                               dir.file("a.bin") + "\", weight: 0.7}"),
            std::string::npos)
      << c.warnings[0];
  EXPECT_NE(c.warnings[0].find("a different dataset"), std::string::npos) << c.warnings[0];
  EXPECT_TRUE(compare_for_resume(saved, saved, 3, was, was).warnings.empty());
}

}  // namespace
}  // namespace trident
