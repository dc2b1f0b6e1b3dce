// `trident prepare` on the command line: the GPT-2 and Megatron flags, and the exit codes
// and messages of their failures.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/common/gpt2_files.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::trident_binary;

TEST(PrepareCli, Gpt2MegatronRunAndFailures) {
  testing::ScratchDir dir;
  dir.write("a.txt", "Hello world. It's a small document.\nSecond line.\n");
  const std::string base = trident_binary() + " prepare --input " + dir.file("a.txt") +
                           " --out " + dir.file("out") + " --tokenizer gpt2";

  auto missing = run_command("TRIDENT_GPT2_DIR=" + dir.file("none") + " " + base);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("trident prepare: GPT-2 tokenizer files not found: " +
                                dir.file("none") + "/encoder.json (run "
                                "scripts/fetch_gpt2_vocab.sh"),
            std::string::npos)
      << missing.output;
  EXPECT_FALSE(fs::exists(dir.file("out")));

  auto bad_format = run_command(base + " --format parquet");
  EXPECT_EQ(bad_format.exit_code, 2) << bad_format.output;
  EXPECT_NE(bad_format.output.find("--format: unknown format 'parquet' (allowed: llmc, megatron)"),
            std::string::npos)
      << bad_format.output;

  auto bad_threads = run_command(base + " --threads 0");
  EXPECT_EQ(bad_threads.exit_code, 2) << bad_threads.output;
  EXPECT_NE(bad_threads.output.find("--threads needs an integer in [1, 4096]"), std::string::npos)
      << bad_threads.output;

  auto ok = run_command("TRIDENT_GPT2_DIR=" + testing::gpt2_dir() + " " + base +
                        " --format megatron --threads 2 --val-fraction 0");
  ASSERT_EQ(ok.exit_code, 0) << testing::gpt2_missing_hint() << "\n" << ok.output;
  EXPECT_NE(ok.output.find("(tokenizer gpt2, vocab 50257, format megatron)"), std::string::npos)
      << ok.output;
  EXPECT_NE(ok.output.find("documents: 1\n"), std::string::npos) << ok.output;
  // <|endoftext|> + 14 ids of the text, one document.
  EXPECT_NE(ok.output.find("train tokens: 15 in 1 shard(s)"), std::string::npos) << ok.output;
  EXPECT_TRUE(fs::exists(dir.file("out/train.idx")));
  EXPECT_EQ(fs::file_size(dir.file("out/train.bin")), 30u);
}

}  // namespace
}  // namespace trident
