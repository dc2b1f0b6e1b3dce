// The metrics file's writer (trainer/metrics.h) when the file system fails it: a write
// error is a warning, not a crash or a silent loss; no record is glued to a torn one.
#include "trainer/metrics.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/captured_log.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

using testing::CapturedLog;

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

bool parses(const std::string& line) { return nlohmann::json::accept(line); }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

StepMetrics step(int s) {
  StepMetrics m;
  m.step = s;
  m.max_steps = 10;
  m.loss = 2.5;
  return m;
}

// /dev/full refuses every write with ENOSPC, like a full disk.
TEST(MetricsWriter, AFullDiskIsOneWarningNamingTheFileAndTheError) {
  CapturedLog log;
  {
    MetricsWriter w;
    ASSERT_TRUE(w.open("/dev/full").is_ok());
    w.write_segment("run", 0, "", 1);
    for (int s = 1; s <= 3; ++s) w.write_step(step(s));
    w.write_eval(3, 2.4);
  }
  const std::string text = log.text();
  EXPECT_EQ(count(text, "logging.metrics: cannot write /dev/full: No space left on device"), 1u)
      << text;
  EXPECT_EQ(count(text, "[warning]"), 2u) << text;
  EXPECT_NE(text.find("logging.metrics: 5 of 5 records were not written to /dev/full"),
            std::string::npos)
      << text;
}

// A launch that finds the last record cut off (the disk filled, or the run was killed
// mid-write) starts its segment on a fresh line: every line parses but the torn one.
TEST(MetricsWriter, AResumeOntoATornLastLineStartsOnAFreshLine) {
  testing::ScratchDir dir;
  const std::string path = dir.file("m.jsonl");
  dir.write("m.jsonl", "{\"segment\": {\"run_id\": \"a\"}}\n{\"step\": 1, \"loss\": 2.5}\n"
                       "{\"step\": 2, \"lo");
  {
    MetricsWriter w;
    ASSERT_TRUE(w.open(path).is_ok());
    w.write_segment("b", 1, dir.path(), 1);
    w.write_step(step(2));
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[2], "{\"step\": 2, \"lo");
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(parses(lines[i]), i != 2) << lines[i];
  EXPECT_EQ(nlohmann::json::parse(lines[3])["segment"]["run_id"], "b");
  EXPECT_EQ(nlohmann::json::parse(lines[4])["step"], 2);
}

// A write the file system takes only part of (here the file-size limit, EFBIG) leaves
// one torn line, and the next record starts on a new one.
TEST(MetricsWriter, ARecordCutOffPartWayIsFollowedByAFreshLine) {
  testing::ScratchDir dir;
  const std::string path = dir.file("m.jsonl");
  CapturedLog log;
  {
    MetricsWriter w;
    ASSERT_TRUE(w.open(path).is_ok());
    w.write_segment("run", 0, "", 1);
    w.write_step(step(1));
    const auto size = std::filesystem::file_size(path);
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    const auto old_handler = signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = size + 10;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    w.write_step(step(2));  // 10 bytes go out, then EFBIG
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    w.write_step(step(3));
    w.write_eval(3, 2.4);
  }
  EXPECT_EQ(count(log.text(), "logging.metrics: cannot write " + path + ": File too large"), 1u)
      << log.text();
  EXPECT_NE(log.text().find("logging.metrics: 1 of 5 records were not written to " + path),
            std::string::npos)
      << log.text();
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[2].size(), 10u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(parses(lines[i]), i != 2) << lines[i];
  EXPECT_EQ(nlohmann::json::parse(lines[3])["step"], 3);
  EXPECT_EQ(nlohmann::json::parse(lines[4])["val_loss"], 2.4);
}

// A step of a world of more than one rank carries the "slowest" record (docs/ARCHITECTURE.md
// "Observability"); a one-rank step has exactly the nine fields and no such record.
TEST(MetricsWriter, TheSlowestRankRecordOnlyWithMoreThanOneRank) {
  testing::ScratchDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsWriter w;
    ASSERT_TRUE(w.open(path).is_ok());
    w.write_step(step(1));
    StepMetrics m = step(2);
    m.has_slowest = true;
    m.slowest_rank = 3;
    m.slowest_host = "node2";
    m.slowest_busy_ms = 30.5;
    m.median_busy_ms = 10;
    m.slowest_ratio = 3.05;
    w.write_step(m);
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto one = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(one.size(), 9u) << lines[0];
  EXPECT_FALSE(one.contains("slowest"));
  const auto many = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(many.size(), 10u) << lines[1];
  EXPECT_EQ(many["slowest"], nlohmann::json::parse(R"({"rank": 3, "host": "node2",
      "busy_ms": 30.5, "median_busy_ms": 10.0, "ratio": 3.05})"));
}

}  // namespace
}  // namespace trident
