// The data fingerprint of a blend (trainer/resume_compat.h): every component's files and
// the schedule, and the resume warning when they change.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "tests/common/scratch_dir.h"
#include "trainer/resume_compat.h"

namespace trident {
namespace {

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
