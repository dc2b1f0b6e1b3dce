// End-to-end tests of Megatron indexed datasets and blends as data.train (docs/DATA.md
// "Megatron datasets", "Blends"):
//  - a .bin/.idx pair written by an independent writer (tests/reference/megatron_writer.py,
//    the layout of Megatron-LM's indexed_dataset.py, struct only) trains to the bitwise
//    same losses as the same tokens in an llm.c shard, named by prefix, .bin or .idx;
//  - corrupt indexes (bad magic, version 2, dtype 7, truncated, a pointer past the end
//    of the .bin) exit 2 naming the file and the field;
//  - a two-dataset blend resumed from step 3 continues with the bitwise losses of the
//    uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

std::string python() {
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

std::string writer() {
  return std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/megatron_writer.py";
}

// Writes `tokens` as little-endian uint32 for the Python writer.
void write_raw(const std::string& path, const std::vector<uint32_t>& tokens) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint32_t)));
}

CommandResult megatron_writer(const std::string& raw, const std::string& prefix,
                              const std::string& flags = "") {
  return run_command(python() + " " + writer() + " " + raw + " " + prefix + " " + flags);
}

std::string config(const ScratchDir& dir, const std::string& train, const std::string& ckpt,
                   int steps, const std::string& extra = "") {
  return testing::cli_model_yaml() +
         "data: {train: " + train + ", shuffle: false}\n"
         "parallel: {micro_batch_size: 2}\n"
         "training: {global_batch_size: 4, max_steps: " + std::to_string(steps) +
         ", lr: 0.003, lr_schedule: constant}\n"
         "checkpoint: {dir: " + dir.file(ckpt) + extra + "}\n"
         "logging: {metrics: " + dir.file(ckpt + ".jsonl") + ", log_interval: 1000}\n";
}

CommandResult train(const ScratchDir& dir, const std::string& yaml_name, const std::string& yaml,
                    const std::string& flags = "") {
  dir.write(yaml_name, yaml);
  return run_command("OMP_WAIT_POLICY=passive " + testing::trident_binary() + " train --config " +
                     dir.file(yaml_name) + " " + flags);
}

class MegatronData : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = testing::english_bytes(3000);
    write_raw(dir_.file("tokens.u32"), tokens_);
  }
  ScratchDir dir_;
  std::vector<uint32_t> tokens_;
};

TEST_F(MegatronData, TrainsToTheLossesOfTheSameTokensAsAnLlmcShard) {
  ASSERT_TRUE(write_token_file(dir_.file("shard.bin"), tokens_, 1).is_ok());
  CommandResult r = train(dir_, "llmc.yaml", config(dir_, dir_.file("shard.bin"), "llmc", 10));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::metrics_losses(dir_.file("llmc.jsonl"));
  ASSERT_EQ(want.size(), 10u);
  EXPECT_NE(want.at(1), want.at(10));

  for (const std::string dtype : {"uint16", "int32"}) {
    const std::string prefix = dir_.file("mega_" + dtype);
    r = megatron_writer(dir_.file("tokens.u32"), prefix, "--dtype " + dtype + " --seq-len 77");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The spec may name the prefix, the .bin or the .idx.
    for (const std::string& spec : {prefix, prefix + ".bin", prefix + ".idx"}) {
      SCOPED_TRACE(spec);
      const std::string name = "run_" + dtype + "_" + std::to_string(spec.size());
      r = train(dir_, name + ".yaml", config(dir_, spec, name, 10));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(testing::metrics_losses(dir_.file(name + ".jsonl")), want);
    }
  }
}

TEST_F(MegatronData, CorruptIndexExitsTwoNamingTheFileAndField) {
  struct Case {
    const char* corrupt;
    std::string expected;  // after "<prefix>.idx: " (or the .bin for the pointer)
  };
  const std::vector<Case> cases = {
      {"magic", "bad magic: expected \"MMIDIDX\\0\\0\": not a Megatron indexed dataset index"},
      {"version", "unsupported version 2 (expected 1)"},
      {"dtype", "dtype code 7 (float32) is not a token type Trident reads (uint16 = 8 or int32 = 4)"},
      // 3008 tokens in 40 sequences of 77 (the last 5), 20 documents.
      {"truncate", "truncated: sequence count 40 and document count 21 need 682 bytes, found 674"},
      {"pointer", "sequence_pointers[39] = 7016 with length 5 runs past the end of "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.corrupt);
    const std::string prefix = dir_.file(std::string("bad_") + c.corrupt);
    CommandResult r = megatron_writer(dir_.file("tokens.u32"), prefix,
                                      std::string("--seq-len 77 --corrupt ") + c.corrupt);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = train(dir_, "bad.yaml", config(dir_, prefix, "bad", 2));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    std::string expected = prefix + ".idx: " + c.expected;
    if (std::string(c.corrupt) == "pointer") expected += prefix + ".bin (6016 bytes)";
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  }
}

TEST_F(MegatronData, BlendResumesBitwise) {
  ASSERT_TRUE(write_token_file(dir_.file("a.bin"), tokens_, 1).is_ok());
  std::vector<uint32_t> other(tokens_.rbegin(), tokens_.rend());  // a different stream
  write_raw(dir_.file("other.u32"), other);
  CommandResult r = megatron_writer(dir_.file("other.u32"), dir_.file("b"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string blend = "[{path: " + dir_.file("a.bin") + ", weight: 0.7}, {path: " +
                            dir_.file("b") + ", weight: 0.3}]";
  // Shuffled (--set data.shuffle=true), so that the per-component samplers count too.
  auto yaml = [&](const std::string& ckpt, int steps) {
    return config(dir_, blend, ckpt, steps, ", interval: 3");
  };
  r = train(dir_, "straight.yaml", yaml("straight", 6), "--set data.shuffle=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data: train [{path: \"" + dir_.file("a.bin") + "\", weight: 0.7}"),
            std::string::npos)
      << r.output;
  r = train(dir_, "first.yaml", yaml("split", 3), "--set data.shuffle=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::rename(dir_.file("split.jsonl"), dir_.file("split_first.jsonl"));
  r = train(dir_, "second.yaml", yaml("split", 6), "--set data.shuffle=true --resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir_.file("split") + "/step_3"), std::string::npos)
      << r.output;
  // The same data: no data warning (max_steps changes, which warns about the schedule).
  EXPECT_EQ(r.output.find("data.train: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("data: the checkpoint"), std::string::npos) << r.output;

  const auto straight = testing::metrics_losses(dir_.file("straight.jsonl"));
  const auto first = testing::metrics_losses(dir_.file("split_first.jsonl"));
  const auto second = testing::metrics_losses(dir_.file("split.jsonl"));
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  for (int s = 1; s <= 6; ++s) {
    const auto& got = s <= 3 ? first : second;
    ASSERT_TRUE(got.count(s)) << "step " << s;
    EXPECT_EQ(got.at(s), straight.at(s)) << "step " << s;
  }
}

}  // namespace
}  // namespace trident
