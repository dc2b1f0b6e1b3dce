// scripts/plot_metrics.py on small metrics files: a file appended across a resume holds
// steps 5 and 6 twice, and the plot must take them (and the re-run evaluation) from the
// later segment; a rollback drops the abandoned steps; the PNG must be a real 1200 x 800 PNG; two files overlay under their
// names; bad usage and a missing file exit 2 naming it. Needs /usr/bin/python3 with
// matplotlib (scripts/setup.sh installs python3-matplotlib): without it the test fails.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

std::string script() { return std::string(TRIDENT_SOURCE_DIR) + "/scripts/plot_metrics.py"; }

std::string step_line(int step, double loss, double lr) {
  return nlohmann::json({{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", 0.5},
                         {"step_ms", 10.0}, {"tokens_per_s", 1000.0 + step},
                         {"mfu", 0.01 * step}})
             .dump() +
         "\n";
}

std::string segment_line(int start, const char* resumed_from) {
  nlohmann::json seg = {{"run_id", "r1"}, {"start_step", start}, {"resumed_from", nullptr},
                        {"time", "2025-01-01T00:00:00Z"}, {"world_size", 1}};
  if (resumed_from) seg["resumed_from"] = resumed_from;
  return nlohmann::json({{"segment", seg}}).dump() + "\n";
}

uint32_t big_endian(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

TEST(PlotMetrics, ResumedSegmentOverridesAndPngIsValid) {
  ScratchDir dir;
  // Launch 1: steps 1..6, eval at 5, stopped after the step-4 checkpoint.
  std::string text = segment_line(0, nullptr);
  for (int s = 1; s <= 6; ++s) {
    text += step_line(s, 10.0 - s, 1e-3);
    if (s == 5) text += R"({"step":5,"val_loss":7.5})" "\n";
  }
  // Launch 2: resumed from step 4, steps 5..8 again with other values, eval at 5 again.
  text += segment_line(4, "ckpt/step_4");
  for (int s = 5; s <= 8; ++s) {
    text += step_line(s, 100.0 + s, 2e-3);
    if (s == 5) text += R"({"step":5,"val_loss":99.5})" "\n";
  }
  text += R"({"summary":{"ranks":[]}})" "\n";
  text += R"({"step":9,"loss":)";  // the torn last line of a killed launch
  dir.write("run_a.jsonl", text);
  dir.write("run_b.jsonl", segment_line(0, nullptr) + step_line(1, 3.0, 1e-3) +
                               step_line(2, 2.0, 1e-3));

  const std::string png = dir.file("plot.png");
  const CommandResult r = run_command("(/usr/bin/python3 " + script() + " " +
                                      dir.file("run_a.jsonl") + " " + dir.file("run_b.jsonl") +
                                      " --out " + png + " --dump-json 2>" + dir.file("err") + ")");
  std::ifstream err_in(dir.file("err"));
  const std::string err((std::istreambuf_iterator<char>(err_in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(r.exit_code, 0) << r.output << err
                            << "\n(needs python3-matplotlib; scripts/setup.sh installs it)";
  EXPECT_NE(err.find("run_a.jsonl:16: not JSON, skipped"), std::string::npos) << err;

  const auto j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.contains("run_a.jsonl") && j.contains("run_b.jsonl")) << r.output;
  const auto& a = j["run_a.jsonl"];
  EXPECT_EQ(a["steps"], nlohmann::json({1, 2, 3, 4, 5, 6, 7, 8}));
  // Steps 1..4 from launch 1, 5..8 from launch 2 (the later segment wins).
  EXPECT_EQ(a["loss"], nlohmann::json({9.0, 8.0, 7.0, 6.0, 105.0, 106.0, 107.0, 108.0}));
  EXPECT_EQ(a["lr"][3], 1e-3);
  EXPECT_EQ(a["lr"][4], 2e-3);
  EXPECT_EQ(a["tokens_per_s"][5], 1006.0);
  EXPECT_EQ(a["val_steps"], nlohmann::json({5}));
  EXPECT_EQ(a["val_loss"], nlohmann::json({99.5}));
  EXPECT_EQ(a["resumes"], nlohmann::json({4}));
  EXPECT_EQ(j["run_b.jsonl"]["loss"], nlohmann::json({3.0, 2.0}));

  std::ifstream in(png, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 20000u) << png;  // four panels of lines and text
  ASSERT_LT(bytes.size(), 2000000u) << png;
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  EXPECT_EQ(big_endian(bytes, 16), 1200u);  // 12 x 8 inches at 100 dpi
  EXPECT_EQ(big_endian(bytes, 20), 800u);
}

TEST(PlotMetrics, ARollbackDropsTheAbandonedSteps) {
  ScratchDir dir;
  // Launch 1 reaches step 8; launch 2 rolls back to step 3 and stops after step 5: steps
  // 6..8 of launch 1 belong to an abandoned trajectory and must not be plotted.
  std::string text = segment_line(0, nullptr);
  for (int s = 1; s <= 8; ++s) text += step_line(s, 10.0 - s, 1e-3);
  text += R"({"step":8,"val_loss":1.5})" "\n";
  text += segment_line(3, "ckpt/step_3");
  for (int s = 4; s <= 5; ++s) text += step_line(s, 50.0 + s, 1e-3);
  dir.write("m.jsonl", text);
  const CommandResult r = run_command("(/usr/bin/python3 " + script() + " " + dir.file("m.jsonl") +
                                      " --out " + dir.file("m.png") + " --dump-json 2>/dev/null)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = nlohmann::json::parse(r.output)["m.jsonl"];
  EXPECT_EQ(a["steps"], nlohmann::json({1, 2, 3, 4, 5}));
  EXPECT_EQ(a["loss"], nlohmann::json({9.0, 8.0, 7.0, 54.0, 55.0}));
  EXPECT_EQ(a["val_steps"], nlohmann::json::array());
  EXPECT_EQ(a["resumes"], nlohmann::json({3}));
}

TEST(PlotMetrics, DefaultOutputAndBadUsage) {
  ScratchDir dir;
  dir.write("m.jsonl", step_line(1, 3.0, 1e-3) + step_line(2, 2.5, 1e-3));
  const CommandResult ok = run_command("/usr/bin/python3 " + script() + " " + dir.file("m.jsonl"));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("metrics.png"))) << ok.output;

  const CommandResult none = run_command("/usr/bin/python3 " + script());
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("usage: plot_metrics.py"), std::string::npos) << none.output;
  const CommandResult missing =
      run_command("/usr/bin/python3 " + script() + " " + dir.file("nope.jsonl"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find(dir.file("nope.jsonl") + ": cannot open"), std::string::npos)
      << missing.output;
  dir.write("empty.jsonl", segment_line(0, nullptr));
  const CommandResult empty =
      run_command("/usr/bin/python3 " + script() + " " + dir.file("empty.jsonl"));
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_NE(empty.output.find("no step records in " + dir.file("empty.jsonl")), std::string::npos)
      << empty.output;
}

}  // namespace
}  // namespace trident
