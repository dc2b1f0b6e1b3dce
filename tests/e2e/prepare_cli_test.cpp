// `trident prepare` on the command line: the GPT-2 and Megatron flags, and the exit codes
// and messages of their failures.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>

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

// Every regular file under root (relative path -> contents).
std::map<std::string, std::string> files_under(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), root).string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// A second prepare into the same --out that is interrupted by SIGINT mid-write leaves the
// first corpus's files exactly as they were, alone, and no temporary file or directory.
TEST(PrepareCli, SigintMidWriteLeavesTheFirstCorpusIntact) {
  testing::ScratchDir dir;
  dir.write("small.txt", std::string(1000, 'a'));
  auto first = run_command(trident_binary() + " prepare --input " + dir.file("small.txt") +
                           " --out " + dir.file("out") +
                           " --tokenizer byte --shard-tokens 100 --val-fraction 0.05");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_under(dir.file("out"));
  ASSERT_EQ(before.count("train_000009.bin"), 1u);
  ASSERT_EQ(before.count("train_000020.bin"), 0u);

  dir.write("big.txt", std::string(size_t{64} << 20, 'b'));  // 16384 shards of 4096 tokens
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string bin = trident_binary(), in = dir.file("big.txt"), out = dir.file("out");
    ::execl(bin.c_str(), bin.c_str(), "prepare", "--input", in.c_str(), "--out", out.c_str(),
            "--tokenizer", "byte", "--shard-tokens", "4096", "--val-fraction", "0", nullptr);
    ::_exit(127);
  }
  // Interrupt once the second run has written its 21st shard, wherever it puts it.
  bool seen = false;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir.path(), ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename() == "train_000020.bin") seen = true;
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) break;  // finished before it was seen
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(seen) << "the second prepare wrote no 21st shard (it ended or hung)";
  ::kill(pid, SIGINT);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT)
      << "status " << status << (WIFSIGNALED(status) ? " (killed by the signal)" : "");

  EXPECT_TRUE(files_under(dir.file("out")) == before)
      << "the first corpus's files changed or others were added: "
      << files_under(dir.file("out")).size() << " files, " << before.size() << " before";
  for (const auto& e : fs::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "out" || name == "small.txt" || name == "big.txt") << "left over: " << name;
  }
}

}  // namespace
}  // namespace trident
