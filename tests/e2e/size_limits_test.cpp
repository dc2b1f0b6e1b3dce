// End-to-end: `trident train` with sizes that pass the per-key checks but cannot run
// ends with exit 2 and a message naming the key and value or the memory figures — never
// a CHECK abort (134), std::length_error (134) or the OOM killer (137). And the start-up
// memory check: one "memory plan" line, a run that fits under an injected limit trains,
// one that does not exits 2; two ranks on one machine are counted together.
//
// Every run carries TRIDENT_MEMORY_LIMIT_BYTES (so the verdict does not depend on this
// machine's size) and a virtual memory cap (so that a regression fails fast here
// instead of taking the machine's memory from its neighbours).
#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"

namespace trident {
namespace {

using testing::run_command;

constexpr const char* kSixteenGiB = "17179869184";

class SizeLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
    dir_.write("tiny.yaml",
               "model: {arch: gpt2, vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4,"
               " d_model: 64}\n"
               "parallel: {micro_batch_size: 4}\n"
               "data: {train: " +
                   dir_.file("train.bin") +
                   "}\n"
                   "training: {global_batch_size: 8, max_steps: 2}\n"
                   "checkpoint: {dir: " +
                   dir_.file("ckpt") +
                   ", save_final: false}\n"  // every run is a new one (--resume none) here
                   "logging: {metrics: ''}\n");
  }

  testing::CommandResult train(const std::string& sets, const std::string& limit = kSixteenGiB,
                               const std::string& launcher = "") {
    return run_command("ulimit -v 8000000; TRIDENT_MEMORY_LIMIT_BYTES=" + limit + " " + launcher +
                       testing::trident_binary() + " train --resume none --config " +
                       dir_.file("tiny.yaml") + " " + sets);
  }

  testing::ScratchDir dir_;
};

void expect_contains(const std::string& output, const std::string& needle) {
  EXPECT_NE(output.find(needle), std::string::npos) << "missing: " << needle << "\n" << output;
}

TEST_F(SizeLimits, HugeFfnWidthIsRefusedWithTheFigures) {
  auto r = train("--set model.d_ff=2147483647");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "error: model needs 20.6 TiB per rank (parameters 2.0 TiB");
  expect_contains(r.output,
                  "but this machine has 16.0 GiB (TRIDENT_MEMORY_LIMIT_BYTES) for 1 rank");
  expect_contains(r.output, "model.d_ff=2147483647");
}

TEST_F(SizeLimits, HugeLayerCountsAreRefusedWithTheFigures) {
  // 2^31 - 1 layers used to die in std::length_error building the parameter table,
  // 100000 in a failed 20 GB allocation (or the OOM killer).
  for (const char* layers : {"2147483647", "100000"}) {
    SCOPED_TRACE(layers);
    auto r = train(std::string("--set model.n_layers=") + layers);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    expect_contains(r.output, "error: model needs ");
    expect_contains(r.output, "; biggest: ");
    expect_contains(r.output, std::string("model.n_layers=") + layers);
    expect_contains(r.output, "parallel.zero_stage (now 0");
  }
}

TEST_F(SizeLimits, HugeVocabularyIsRefusedWithTheFigures) {
  auto r = train("--set model.vocab_size=2147483520");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "error: model needs 5.0 TiB per rank (parameters 512.0 GiB");
  expect_contains(r.output, "model.vocab_size=2147483520");
  // One past the largest padded size is a config error naming the key.
  r = train("--set model.vocab_size=2147483647");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output,
                  "model.vocab_size: 2147483647 padded to a multiple of 128 is 2147483648");
}

TEST_F(SizeLimits, HugeSequencesAndMicroBatchesAreRefused) {
  auto r = train("--set model.seq_len=2147483647");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "parallel.micro_batch_size: 4 sequences of model.seq_len=2147483647");
  // Fits the int limits, not the memory: the activations are the biggest consumer.
  r = train("--set model.seq_len=1000000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "biggest: activations");
  expect_contains(r.output, "reduce parallel.micro_batch_size=4 or model.seq_len=1000000");
  r = train(
      "--set parallel.micro_batch_size=1073741824 --set training.global_batch_size=1073741824");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "parallel.micro_batch_size: 1073741824 sequences of model.seq_len=32");
  r = train("--set parallel.micro_batch_size=16777216 --set training.global_batch_size=16777216");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output, "reduce parallel.micro_batch_size=16777216");
}

TEST_F(SizeLimits, HugeDefaultFfnWidthNamesDModel) {
  auto r = train("--set model.d_model=1073741823 --set model.n_heads=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r.output,
                  "model.d_model: 1073741823 gives a default model.d_ff (4 * d_model) of "
                  "4294967292");
}

TEST_F(SizeLimits, MemoryPlanLineAndInjectedLimit) {
  auto fits = train("", "1073741824");
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  expect_contains(fits.output, "memory plan: ");
  expect_contains(fits.output, "per rank (parameters ");
  expect_contains(fits.output,
                  "1 rank on this machine, 1.0 GiB available (TRIDENT_MEMORY_LIMIT_BYTES)");
  expect_contains(fits.output, "step 2/2");

  auto tight = train("", "1048576");
  EXPECT_EQ(tight.exit_code, 2) << tight.output;
  expect_contains(tight.output, "error: model needs ");
  expect_contains(tight.output,
                  "but this machine has 1.0 MiB (TRIDENT_MEMORY_LIMIT_BYTES) for 1 rank");
  EXPECT_EQ(tight.output.find("step 1/2"), std::string::npos) << tight.output;

  auto bad = train("", "lots");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  expect_contains(bad.output,
                  "TRIDENT_MEMORY_LIMIT_BYTES: expected a positive number of bytes, got 'lots'");
}

// Two ranks on this machine: a limit that holds one rank's plan but not two refuses the
// run on every rank (no rank trains, none hangs) and says the ranks were added up.
TEST_F(SizeLimits, RanksOnOneMachineAreAddedUp) {
  auto one = train("", "1073741824");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // "memory plan: X MiB per rank": the figure of one rank, dp = 2 alike.
  const std::string mpirun = testing::mpirun_prefix(2) + " ";
  auto two = train("--set parallel.dp=2", "1073741824", mpirun);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_contains(two.output, "2 ranks on this machine");
  const size_t at = two.output.find("memory plan: up to ");
  ASSERT_NE(at, std::string::npos) << two.output;
  const double per_rank_mib = std::stod(two.output.substr(at + 19));
  ASSERT_NE(two.output.find(" MiB per rank", at), std::string::npos) << two.output;
  const long long limit = static_cast<long long>(1.5 * per_rank_mib * 1048576.0);
  auto refused = train("--set parallel.dp=2", std::to_string(limit), mpirun);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_contains(refused.output, "2 ranks on one machine need ");
  expect_contains(refused.output, "for 2 ranks");
}

}  // namespace
}  // namespace trident
