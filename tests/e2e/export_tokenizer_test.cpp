// End-to-end: `trident export` writes the checkpoint's tokenizer beside the model
// (data/bpe_hf_export.h), by the real binary on tiny models trained a few steps:
//  - Llama 3 data (three documents: the mixed corpus, the invalid-UTF-8 fixture, code):
//    the exported directory's tokenizer.json, loaded by Hugging Face's Rust core and its
//    JavaScript implementation (tests/reference/hf_reference_encode.js, npm packages none
//    of them ours), encodes each document, with add_special_tokens, to exactly the ids
//    of the training shards, and without to Trident's own encoding; tokenizer_config.json
//    has the model's seq_len and the document and end tokens;
//  - data prepared from a tokenizer.json: the export is that file's bytes; the file
//    changed after training: exit 2 naming it, nothing written; --no-tokenizer exports
//    the model alone;
//  - byte data, and data without sidecars: no tokenizer files, and a line saying why;
//  - a tokenizer.json path that is a directory, or a temporary file that cannot be made:
//    a non-zero exit naming the file, and the directory as it was (no file replaced, no
//    temporary file left).
// Without node, the packages or the vocabulary files these tests FAIL, saying to run
// scripts/fetch_vocabs.sh.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_vocabularies.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/data/vocab_files.h"
#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;
using testing::trident_binary;

std::string reference(const std::string& path) {
  return std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/" + path;
}

// The documents: one input file each.
std::vector<std::string> documents(const ScratchDir& dir) {
  dir.write("code.txt", "int main() {\n    for (int i = 0; i < 10; ++i) printf(\"%d\\n\", i);\n"
                        "    return 0;  // 中文 😀 12345\n}\n\n\n   \t \n");
  return {reference("bpe/mixed.txt"), reference("gpt2/invalid_utf8.txt"), dir.file("code.txt")};
}

struct TrainedRun {
  std::string step;   // the checkpoint's step directory
  std::string data;   // the train shards' spec
};

// prepare (TOKENIZER_ARGS, every token in train) then train 3 steps of a tiny `arch` model
// of `vocab` ids. Returns an empty step on failure (with ADD_FAILUREs).
TrainedRun prepare_and_train(const ScratchDir& dir, const std::string& tokenizer_args, int64_t vocab,
                      Arch arch = Arch::kLlama) {
  std::string inputs;
  for (const std::string& d : documents(dir)) inputs += " " + d;
  const CommandResult prep =
      run_command("TRIDENT_VOCAB_DIR=" + testing::vocab_dir() + " " + trident_binary() +
                  " prepare --val-fraction 0 --input" + inputs + " --out " + dir.file("data") +
                  " " + tokenizer_args);
  if (prep.exit_code != 0) {
    ADD_FAILURE() << testing::vocab_missing_hint() << "\n" << prep.output;
    return {};
  }
  dir.write("config.yaml",
            testing::tiny_model_yaml(arch, {.vocab_size = static_cast<int>(vocab), .n_layers = 1,
                                            .n_heads = 2, .d_model = 16}) +
                "data: {train: " + dir.file("data/train_*.bin") + "}\n"
                "parallel: {micro_batch_size: 2}\n"
                "training: {global_batch_size: 2, max_steps: 3, lr: 0.003}\n"
                "checkpoint: {dir: " + dir.file("ckpt") + "}\n"
                "logging: {metrics: " + dir.file("metrics.jsonl") + ", log_interval: 1000}\n");
  std::string error;
  const std::string step = testing::train_to_step(dir.file("config.yaml"), dir.file("ckpt"), &error);
  if (step.empty()) ADD_FAILURE() << error;
  return {step, dir.file("data/train_*.bin")};
}

CommandResult export_to(const std::string& step, const std::string& out,
                        const std::string& flags = "") {
  return run_command("TRIDENT_VOCAB_DIR=" + testing::vocab_dir() + " " + trident_binary() +
                     " export --checkpoint " + step + " --format safetensors --out " + out + " " +
                     flags);
}

// The names in a directory ("" when it does not exist).
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The Llama 3 run, once for the binary.
const TrainedRun& llama3_run() {
  static ScratchDir dir;
  static const TrainedRun run = prepare_and_train(dir, "--tokenizer llama3", 128256);
  return run;
}

TEST(ExportTokenizer, Llama3DirectoryEncodesAsTheTrainingData) {
  const TrainedRun& run = llama3_run();
  ASSERT_FALSE(run.step.empty());
  ScratchDir dir;
  const std::string out = dir.file("hf");
  const CommandResult r = export_to(run.step, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer llama3 (the checkpoint's): tokenizer.json written"),
            std::string::npos) << r.output;
  EXPECT_EQ(listing(out), (std::vector<std::string>{"config.json", "model.safetensors",
                                                    "tokenizer.json", "tokenizer_config.json"}));
  const json config = json::parse(testing::read_bytes(out + "/tokenizer_config.json"));
  EXPECT_EQ(config["model_max_length"], 32);
  EXPECT_EQ(config["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(config["eos_token"], "<|end_of_text|>");
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  // config.json has their ids, which Hugging Face's generate() starts and stops with.
  const json model_config = json::parse(testing::read_bytes(out + "/config.json"));
  EXPECT_EQ(model_config["bos_token_id"], 128000) << model_config.dump();
  EXPECT_EQ(model_config["eos_token_id"], 128001) << model_config.dump();

  // The training ids: each document is the document token, then its text's ids.
  const std::vector<uint32_t> stream = testing::read_token_stream(run.data, 128256);
  auto llama3 = load_vocabulary("llama3", testing::vocab_dir(), "");
  ASSERT_TRUE(llama3.is_ok()) << llama3.status().message();
  const std::vector<std::string> docs = documents(dir);
  std::string files;
  for (const std::string& d : docs) files += " " + d;
  for (const std::string engine : {"rust", "js"}) {
    const std::string cmd = "node " + reference("hf_reference_encode.js") + " --dir " +
                            testing::vocab_dir() + " --engine " + engine + " --json " + out +
                            "/tokenizer.json";
    std::string output;
    ASSERT_EQ(testing::run_capture(cmd + " --add-special-tokens" + files, &output), 0) << output;
    std::vector<uint32_t> with_document_token;
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      const std::vector<uint32_t> ids = testing::parse_ids(line);
      with_document_token.insert(with_document_token.end(), ids.begin(), ids.end());
    }
    EXPECT_GT(with_document_token.size(), 500u) << engine;
    EXPECT_TRUE(with_document_token == stream)
        << engine << ": " << with_document_token.size() << " ids, the shards " << stream.size();

    ASSERT_EQ(testing::run_capture(cmd + files, &output), 0) << output;
    std::istringstream plain(output);
    for (const std::string& d : docs) {
      ASSERT_TRUE(std::getline(plain, line)) << output.substr(0, 1000);
      std::string text;
      sanitize_utf8(testing::read_bytes(d), &text);
      std::vector<uint32_t> want;
      llama3->bpe.encode(text, &want);
      EXPECT_TRUE(testing::parse_ids(line) == want) << engine << " " << d;
    }
  }
}

TEST(ExportTokenizer, TokenizerJsonSourceIsExportedAsItsBytes) {
  ScratchDir dir;
  const std::string source = testing::read_bytes(testing::vocab_dir() + "/gpt2.tokenizer.json");
  ASSERT_GT(source.size(), 1000u) << testing::vocab_missing_hint();
  dir.write("gpt2.json", source);
  const TrainedRun run = prepare_and_train(dir, "--tokenizer " + dir.file("gpt2.json"), 50257, Arch::kGpt2);
  ASSERT_FALSE(run.step.empty());
  const CommandResult r = export_to(run.step, dir.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json copied from it"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::read_bytes(dir.file("hf/tokenizer.json")) == source);
  EXPECT_EQ(json::parse(testing::read_bytes(dir.file("hf/tokenizer_config.json")))["bos_token"],
            "<|endoftext|>");
  const json gpt2_config = json::parse(testing::read_bytes(dir.file("hf/config.json")));
  EXPECT_EQ(gpt2_config["bos_token_id"], 50256) << gpt2_config.dump();
  EXPECT_EQ(gpt2_config["eos_token_id"], 50256) << gpt2_config.dump();

  // Changed after training: refused before anything is written.
  dir.write("gpt2.json", source + "\n");
  const CommandResult changed = export_to(run.step, dir.file("hf2"));
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_NE(changed.output.find(dir.file("gpt2.json") + " has SHA-256 "), std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("--no-tokenizer exports the model without it"), std::string::npos)
      << changed.output;
  EXPECT_TRUE(listing(dir.file("hf2")).empty());

  const CommandResult skipped = export_to(run.step, dir.file("hf2"), "--no-tokenizer");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("no tokenizer.json written (--no-tokenizer)"), std::string::npos)
      << skipped.output;
  EXPECT_EQ(listing(dir.file("hf2")), (std::vector<std::string>{"config.json", "model.safetensors"}));
  // Without the tokenizer, config.json names no token ids (HF's defaults apply).
  const json bare = json::parse(testing::read_bytes(dir.file("hf2/config.json")));
  EXPECT_FALSE(bare.contains("bos_token_id")) << bare.dump();
  EXPECT_FALSE(bare.contains("eos_token_id")) << bare.dump();
}

TEST(ExportTokenizer, ByteDataAndUnrecordedDataGetNoTokenizerFiles) {
  ScratchDir dir;
  const TrainedRun run = prepare_and_train(dir, "--tokenizer byte", 256);
  ASSERT_FALSE(run.step.empty());
  const CommandResult r = export_to(run.step, dir.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no tokenizer.json written: the checkpoint's tokenizer is byte"),
            std::string::npos) << r.output;
  EXPECT_EQ(listing(dir.file("hf")), (std::vector<std::string>{"config.json", "model.safetensors"}));

  // The same shards without their sidecars: the checkpoint records no tokenizer.
  for (const auto& e : fs::directory_iterator(dir.file("data"))) {
    if (e.path().string().ends_with(".meta.json")) fs::remove(e.path());
  }
  std::string config = testing::read_bytes(dir.file("config.yaml"));
  const size_t at = config.find(dir.file("ckpt"));
  ASSERT_NE(at, std::string::npos);
  config.insert(at + dir.file("ckpt").size(), "2");
  dir.write("config2.yaml", config);
  std::string error;
  const std::string step = testing::train_to_step(dir.file("config2.yaml"), dir.file("ckpt2"), &error);
  ASSERT_FALSE(step.empty()) << error;
  const CommandResult none = export_to(step, dir.file("hf2"));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("no tokenizer.json written: the checkpoint records no tokenizer"),
            std::string::npos) << none.output;
  EXPECT_EQ(listing(dir.file("hf2")), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

ino_t inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST(ExportTokenizer, UnwritableFileLeavesTheDirectoryAsItWas) {
  const TrainedRun& run = llama3_run();
  ASSERT_FALSE(run.step.empty());
  ScratchDir dir;
  // tokenizer.json is a directory: found before any file is written.
  fs::create_directories(dir.file("hf/tokenizer.json/x"));
  const CommandResult blocked = export_to(run.step, dir.file("hf"));
  EXPECT_EQ(blocked.exit_code, 1) << blocked.output;
  EXPECT_NE(blocked.output.find(dir.file("hf/tokenizer.json") + ": is a directory"),
            std::string::npos) << blocked.output;
  EXPECT_EQ(listing(dir.file("hf")), (std::vector<std::string>{"tokenizer.json"}));

  // An earlier export, then one whose last temporary file cannot be created: the others'
  // temporary files are removed and no file is replaced (the same inodes).
  fs::remove_all(dir.file("hf"));
  ASSERT_EQ(export_to(run.step, dir.file("hf")).exit_code, 0);
  const std::vector<std::string> files = listing(dir.file("hf"));
  ASSERT_EQ(files.size(), 4u);
  std::map<std::string, ino_t> before;
  for (const std::string& f : files) before[f] = inode(dir.file("hf/" + f));
  fs::create_directories(dir.file("hf/config.json.tmp/x"));
  const CommandResult failed = export_to(run.step, dir.file("hf"));
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_NE(failed.output.find(dir.file("hf/config.json.tmp")), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("the temporary files were removed; no file was replaced"),
            std::string::npos) << failed.output;
  fs::remove_all(dir.file("hf/config.json.tmp"));
  EXPECT_EQ(listing(dir.file("hf")), files);
  for (const std::string& f : files) EXPECT_EQ(inode(dir.file("hf/" + f)), before[f]) << f;
}

}  // namespace
}  // namespace trident
