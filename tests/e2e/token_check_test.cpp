// End-to-end test of the start-up vocabulary check (data/token_check.h): a token id
// outside model.vocab_size anywhere in data.train or data.val stops `trident train`
// with exit 2 before the first step, naming the key, the file, the id and its position
// — even where no batch of the run would ever read it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::run_command;
using testing::ScratchDir;

std::string config(const ScratchDir& dir, const std::string& data) {
  return testing::cli_model_yaml() +
         "data: {" + data + ", shuffle: false}\n"
         "parallel: {micro_batch_size: 2}\n"
         "training: {global_batch_size: 2, max_steps: 2}\n"
         "checkpoint: {dir: " + dir.file("ckpt") + "}\n"
         "logging: {metrics: \"\"}\n";
}

TEST(StartupTokenCheck, OutOfVocabularyIdFailsBeforeTheFirstStep) {
  ScratchDir dir;
  std::vector<uint32_t> tokens = testing::english_bytes(20000);
  tokens[19'000] = 300;  // far past the 2 steps x 2 samples x 17 tokens read in order
  ASSERT_TRUE(write_token_file(dir.file("train.bin"), tokens, 7).is_ok());
  ASSERT_TRUE(write_token_file(dir.file("val.bin"), testing::english_bytes(1000), 1).is_ok());
  dir.write("train.yaml", config(dir, "train: " + dir.file("train.bin") + ", val: " + dir.file("val.bin")));
  auto r = run_command(testing::trident_binary() + " train --config " + dir.file("train.yaml"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: data.train " + dir.file("train.bin") +
                          ": token id 300 at position 19000 is >= model.vocab_size 256"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST(StartupTokenCheck, ValidationDataIsCheckedToo) {
  ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("train.bin"), testing::english_bytes(2000), 1).is_ok());
  std::vector<uint32_t> val = testing::english_bytes(1000);
  val[999] = 256;
  ASSERT_TRUE(write_token_file(dir.file("val.bin"), val, 1).is_ok());
  dir.write("train.yaml", config(dir, "train: " + dir.file("train.bin") + ", val: " + dir.file("val.bin")));
  auto r = run_command(testing::trident_binary() + " train --config " + dir.file("train.yaml"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: data.val " + dir.file("val.bin") +
                          ": token id 256 at position 999 is >= model.vocab_size 256"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace trident
