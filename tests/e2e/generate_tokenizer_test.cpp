// The tokenizer travels with the data and the checkpoint: `trident prepare` records it in
// the shards' sidecars, `trident train` stores that record in its checkpoints' trainer
// state, and `trident generate` encodes the prompt and decodes with it. Checked on tiny
// models trained for a few steps by the real binary on cl100k_base shards (whose
// 100,277 ids no vocabulary-size rule maps to a tokenizer):
//  - the record in the checkpoint equals the vocabulary's (name, SHA-256 of the rank
//    file, size, document token), and generate's printed text is the prompt followed by
//    the new ids decoded with cl100k_base, the prompt's ids being cl100k_base's encoding
//    of it (both computed here, in process, by the tokenizer library);
//  - data without sidecars gives a checkpoint without the record: generate falls back to
//    the vocabulary-size rule (here: exit 2 naming the size), and --tokenizer overrides;
//  - --tokenizer byte overrides the checkpoint's tokenizer;
//  - a rank file path travels with its --tokenizer-pattern; the file replaced by another
//    (a different SHA-256) or removed exits 2 naming the file and the hashes, and
//    --tokenizer still overrides it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_vocabularies.h"
#include "tests/data/vocab_files.h"
#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;
using testing::trident_binary;

constexpr int kSteps = 4;
const char* const kPrompt = "It is a truth, 中文 42";

std::string vocab_env() { return "TRIDENT_VOCAB_DIR=" + testing::vocab_dir() + " "; }

// prepare (TOKENIZER_ARGS) then train kSteps on the shards; the model's vocabulary is the
// data's. Returns the checkpoint's step directory ("" on failure, with ADD_FAILUREs).
std::string prepare_and_train(const ScratchDir& dir, const std::string& tokenizer_args,
                              int64_t vocab, bool keep_sidecars = true) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a wife. 中文 " + std::to_string(i) + "\n";
  }
  dir.write("a.txt", text);
  const CommandResult prep = run_command(vocab_env() + trident_binary() + " prepare --input " +
                                         dir.file("a.txt") + " --out " + dir.file("out") + " " +
                                         tokenizer_args);
  if (prep.exit_code != 0) {
    ADD_FAILURE() << testing::vocab_missing_hint() << "\n" << prep.output;
    return "";
  }
  if (!keep_sidecars) {
    for (const auto& e : fs::directory_iterator(dir.file("out"))) {
      if (e.path().string().ends_with(".meta.json")) fs::remove(e.path());
    }
  }
  dir.write("config.yaml",
            testing::tiny_model_yaml(Arch::kGpt2, {.vocab_size = static_cast<int>(vocab),
                                                   .n_layers = 1, .n_heads = 2, .d_model = 16}) +
                "data: {train: " + dir.file("out/train_*.bin") + ", shuffle: false}\n"
                "parallel: {micro_batch_size: 2}\n"
                "training: {global_batch_size: 2, max_steps: " + std::to_string(kSteps) +
                ", lr: 0.003, lr_schedule: constant}\n"
                "checkpoint: {dir: " + dir.file("ckpt") + "}\n"
                "logging: {metrics: " + dir.file("metrics.jsonl") + ", log_interval: 1000}\n");
  std::string error;
  const std::string step = testing::train_to_step(dir.file("config.yaml"), dir.file("ckpt"), &error);
  if (step.empty()) ADD_FAILURE() << error;
  return step;
}

struct Generated {
  int exit_code = -1;
  std::string out, err;
};

// `trident generate --checkpoint CKPT --prompt kPrompt --print-ids ARGS`, stdout and
// stderr apart.
Generated generate(const std::string& ckpt, const std::string& args = "") {
  ScratchDir tmp;
  const CommandResult r = run_command(
      "(" + vocab_env() + "OMP_WAIT_POLICY=passive " + trident_binary() + " generate --checkpoint " +
      ckpt + " --prompt '" + kPrompt + "' --max-new-tokens 6 --seed 3 --print-ids " + args +
      " 2>" + tmp.file("err") + ")");
  std::ifstream in(tmp.file("err"));
  std::stringstream err;
  err << in.rdbuf();
  return {r.exit_code, r.output, err.str()};
}

// The ids after "trident generate: <what> ids " on stderr.
std::vector<uint32_t> reported_ids(const std::string& err, const std::string& what) {
  const std::string key = "trident generate: " + what + " ids ";
  const size_t at = err.find(key);
  if (at == std::string::npos) return {};
  const size_t end = err.find('\n', at);
  const nlohmann::json j = nlohmann::json::parse(
      err.substr(at + key.size(), end - at - key.size()), nullptr, false);
  return j.is_array() ? j.get<std::vector<uint32_t>>() : std::vector<uint32_t>{};
}

// generate's output is the prompt, then the new ids decoded by `tok`, and the prompt's
// ids are tok's encoding of the prompt.
void expect_decoded_with(const Generated& g, const LoadedTokenizer& tok) {
  ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
  std::vector<uint32_t> prompt_ids;
  tok.bpe.encode(kPrompt, &prompt_ids);
  EXPECT_EQ(reported_ids(g.err, "prompt"), prompt_ids) << g.err;
  const std::vector<uint32_t> new_ids = reported_ids(g.err, "new");
  EXPECT_EQ(new_ids.size(), 6u) << g.err;
  EXPECT_EQ(g.out, std::string(kPrompt) + tok.bpe.decode(new_ids) + "\n") << g.err;
}

LoadedTokenizer cl100k() {
  Result<LoadedTokenizer> t = load_vocabulary("cl100k_base", testing::vocab_dir(), "");
  EXPECT_TRUE(t.is_ok()) << testing::vocab_missing_hint() << ": " << t.status().message();
  return std::move(t).value();
}

TEST(GenerateTokenizer, CheckpointCarriesTheDataTokenizer) {
  ScratchDir dir;
  const std::string step = prepare_and_train(dir, "--tokenizer cl100k_base", 100277);
  ASSERT_FALSE(step.empty());
  const LoadedTokenizer tok = cl100k();
  const nlohmann::json state = testing::checkpoint_trainer_state(step);
  ASSERT_TRUE(state.contains("tokenizer")) << state.dump();
  const nlohmann::json& t = state.at("tokenizer");
  EXPECT_EQ(t.value("name", ""), "cl100k_base") << t.dump();
  EXPECT_EQ(t.value("sha256", ""), tok.sha256) << t.dump();
  EXPECT_EQ(t.value("vocab_size", 0), 100277) << t.dump();
  EXPECT_EQ(t.value("document_token", 0), 100257) << t.dump();
  EXPECT_FALSE(t.contains("pattern")) << t.dump();  // a name needs none

  const Generated g = generate(dir.file("ckpt"));
  expect_decoded_with(g, tok);
  EXPECT_NE(g.err.find("tokenizer cl100k_base (the checkpoint's)"), std::string::npos) << g.err;

  // --tokenizer overrides the checkpoint's: bytes, one id per byte of the prompt.
  const Generated b = generate(dir.file("ckpt"), "--tokenizer byte");
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  std::vector<uint32_t> bytes;
  for (unsigned char c : std::string(kPrompt)) bytes.push_back(c);
  EXPECT_EQ(reported_ids(b.err, "prompt"), bytes) << b.err;
  EXPECT_NE(b.err.find("tokenizer byte (--tokenizer)"), std::string::npos) << b.err;
  // A tokenizer larger than the model exits 2 naming both sizes.
  const Generated big = generate(dir.file("ckpt"), "--tokenizer o200k_base");
  EXPECT_EQ(big.exit_code, 2) << big.err;
  EXPECT_NE(big.err.find("the tokenizer o200k_base has 200019 ids, more than the model's "
                         "model.vocab_size 100277"),
            std::string::npos)
      << big.err;
}

TEST(GenerateTokenizer, CheckpointWithoutTheRecordFallsBackToTheVocabularySize) {
  ScratchDir dir;
  const std::string step =
      prepare_and_train(dir, "--tokenizer cl100k_base", 100277, /*keep_sidecars=*/false);
  ASSERT_FALSE(step.empty());
  EXPECT_FALSE(testing::checkpoint_trainer_state(step).contains("tokenizer"));
  // No size rule maps 100277 to a tokenizer: the fallback's own failure.
  const Generated g = generate(dir.file("ckpt"));
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_NE(g.err.find("model.vocab_size=100277 matches no tokenizer"), std::string::npos)
      << g.err;
  expect_decoded_with(generate(dir.file("ckpt"), "--tokenizer cl100k_base"), cl100k());
}

TEST(GenerateTokenizer, RankFileTravelsAndAChangedFileIsRefused) {
  ScratchDir dir;
  const std::string rank_file = dir.file("my_ranks.tiktoken");
  fs::copy_file(testing::vocab_dir() + "/cl100k_base.tiktoken", rank_file);
  const std::string step = prepare_and_train(
      dir, "--tokenizer " + rank_file + " --tokenizer-pattern cl100k", 100277);
  ASSERT_FALSE(step.empty());
  const nlohmann::json t = testing::checkpoint_trainer_state(step).value("tokenizer",
                                                                         nlohmann::json());
  EXPECT_EQ(t.value("name", ""), rank_file) << t.dump();
  EXPECT_EQ(t.value("pattern", ""), "cl100k") << t.dump();
  // A copy of cl100k_base's ranks is cl100k_base (the same ids, specials included).
  const LoadedTokenizer tok = cl100k();
  EXPECT_EQ(t.value("sha256", ""), tok.sha256) << t.dump();
  expect_decoded_with(generate(dir.file("ckpt")), tok);

  // Another vocabulary under the recorded path: refused, naming the file and both hashes.
  Result<LoadedTokenizer> o200k = load_vocabulary("o200k_base", testing::vocab_dir(), "");
  ASSERT_TRUE(o200k.is_ok()) << o200k.status().message();
  fs::copy_file(testing::vocab_dir() + "/o200k_base.tiktoken", rank_file,
                fs::copy_options::overwrite_existing);
  const Generated changed = generate(dir.file("ckpt"));
  EXPECT_EQ(changed.exit_code, 2) << changed.out << changed.err;
  EXPECT_NE(changed.err.find(rank_file + " has SHA-256 " + o200k.value().sha256), std::string::npos)
      << changed.err;
  EXPECT_NE(changed.err.find("with SHA-256 " + tok.sha256), std::string::npos) << changed.err;
  EXPECT_NE(changed.err.find("--tokenizer SPEC overrides"), std::string::npos) << changed.err;
  expect_decoded_with(generate(dir.file("ckpt"), "--tokenizer cl100k_base"), tok);

  fs::remove(rank_file);
  const Generated gone = generate(dir.file("ckpt"));
  EXPECT_EQ(gone.exit_code, 2) << gone.out << gone.err;
  EXPECT_NE(gone.err.find("the checkpoint's tokenizer file " + rank_file + " does not exist "
                          "(SHA-256 recorded " + tok.sha256 + ")"),
            std::string::npos)
      << gone.err;
}

}  // namespace
}  // namespace trident
