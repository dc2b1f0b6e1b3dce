// `trident prepare` with a tiktoken vocabulary on the command line, then `trident train`
// on its uint32 shards: the vocabulary's size and document token reach the shards, a
// model whose vocabulary is smaller than the data's tokenizer exits 2 naming the key, the
// shard and both sizes (even when the ids fit), one below the ids (shards without the
// tokenizer record) exits 2 naming the shard and the id, and the failures of --tokenizer /
// --tokenizer-pattern exit 2 naming the option or file. Then a Hugging Face tokenizer.json
// with --allow-special, and a tokenizer.json that Trident refuses. Last, o200k_base,
// llama3 and cl100k_base each prepared (llm.c and Megatron) and trained.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "data/megatron_file.h"
#include "data/token_file.h"
#include "tests/data/vocab_files.h"
#include "tests/e2e/checkpoint_util.h"
#include "tests/e2e/cli_util.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::trident_binary;

// data_train/data_val: the llm.c shard globs by default, or Megatron prefixes.
std::string train_config(const testing::ScratchDir& dir, int64_t vocab,
                         const std::string& data_train = "out/train_*.bin",
                         const std::string& data_val = "out/val_*.bin") {
  return testing::tiny_model_yaml(Arch::kGpt2, {.vocab_size = static_cast<int>(vocab),
                                                .seq_len = 16, .n_layers = 1, .n_heads = 2,
                                                .d_model = 16}) +
         "data: {train: " + dir.file(data_train) + ", val: " + dir.file(data_val) +
         ", shuffle: false}\n"
         "parallel: {micro_batch_size: 2}\n"
         "training: {global_batch_size: 2, max_steps: 4, lr: 0.003, lr_schedule: constant}\n"
         // No final save: the runs below, with other vocabularies, would resume from it.
         "checkpoint: {dir: " + dir.file("ckpt") + ", save_final: false}\n"
         "logging: {metrics: " + dir.file("metrics.jsonl") + ", log_interval: 1000}\n";
}

TEST(PrepareBpeCli, Cl100kShardsTrainAndFailures) {
  testing::ScratchDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a wife. 中文 " + std::to_string(i) + "\n";
  }
  dir.write("a.txt", text);
  dir.write("b.txt", text);
  const std::string env = "TRIDENT_VOCAB_DIR=" + testing::vocab_dir() + " ";
  const std::string base = trident_binary() + " prepare --input " + dir.file("a.txt") + " " +
                           dir.file("b.txt");

  auto ok = run_command(env + base + " --out " + dir.file("out") +
                        " --tokenizer cl100k_base --val-fraction 0.1");
  ASSERT_EQ(ok.exit_code, 0) << testing::vocab_missing_hint() << "\n" << ok.output;
  EXPECT_NE(ok.output.find("(tokenizer cl100k_base, vocab 100277, format llmc)"), std::string::npos)
      << ok.output;
  EXPECT_NE(ok.output.find("documents: 2\n"), std::string::npos) << ok.output;
  auto shard = TokenFile::open(dir.file("out/train_000000.bin"));
  ASSERT_TRUE(shard.is_ok()) << shard.status().message();
  EXPECT_EQ(shard->version(), 7);
  EXPECT_EQ(shard->token(0), 100257u);  // <|endoftext|> before the first document

  // The model takes the data as it is; a vocabulary below the ids is refused at start-up.
  dir.write("train.yaml", train_config(dir, 100277));
  auto train = run_command("OMP_WAIT_POLICY=passive " + trident_binary() + " train --config " +
                           dir.file("train.yaml"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto losses = testing::metrics_losses(dir.file("metrics.jsonl"));
  ASSERT_EQ(losses.size(), 4u) << train.output;
  // Near ln(100277) = 11.5 at the start: a uniform guess over the whole vocabulary.
  EXPECT_NEAR(std::stod(losses.begin()->second), std::log(100277.0), 1.0);
  // The ids fit (the largest is 100257) but the tokenizer has 100277.
  for (int64_t vocab : {50304, 100260}) {
    dir.write("small.yaml", train_config(dir, vocab));
    auto small = run_command(trident_binary() + " train --config " + dir.file("small.yaml"));
    EXPECT_EQ(small.exit_code, 2) << small.output;
    EXPECT_NE(small.output.find("data.train " + dir.file("out/train_000000.bin") +
                                ": its tokenizer cl100k_base has 100277 ids, more than "
                                "model.vocab_size " + std::to_string(vocab)),
              std::string::npos)
        << small.output;
  }
  // Without the sidecars (shards from elsewhere) the ids themselves are checked.
  for (const auto& e : fs::directory_iterator(dir.file("out"))) {
    if (e.path().string().find(".meta.json") != std::string::npos) fs::remove(e.path());
  }
  auto small = run_command(trident_binary() + " train --config " + dir.file("small.yaml"));
  EXPECT_EQ(small.exit_code, 0) << small.output;  // 100260 > every id
  dir.write("small.yaml", train_config(dir, 50304));
  small = run_command(trident_binary() + " train --config " + dir.file("small.yaml"));
  EXPECT_EQ(small.exit_code, 2) << small.output;
  EXPECT_NE(small.output.find("is >= model.vocab_size 50304"), std::string::npos) << small.output;

  auto missing = run_command("TRIDENT_VOCAB_DIR=" + dir.file("none") + " " + base +
                             " --out " + dir.file("o2") + " --tokenizer o200k_base");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("trident prepare: o200k_base tokenizer files not found: " +
                                dir.file("none") + "/o200k_base.tiktoken (run "
                                "scripts/fetch_vocabs.sh"),
            std::string::npos)
      << missing.output;

  const std::string rank_file = testing::vocab_dir() + "/llama3.tiktoken";
  auto no_pattern = run_command(base + " --out " + dir.file("o3") + " --tokenizer " + rank_file);
  EXPECT_EQ(no_pattern.exit_code, 2) << no_pattern.output;
  EXPECT_NE(no_pattern.output.find("a rank file needs --tokenizer-pattern"), std::string::npos)
      << no_pattern.output;
  auto by_path = run_command(base + " --out " + dir.file("o3") + " --tokenizer " + rank_file +
                             " --tokenizer-pattern llama3 --format megatron");
  ASSERT_EQ(by_path.exit_code, 0) << by_path.output;
  EXPECT_NE(by_path.output.find("vocab 128256, format megatron)"), std::string::npos)
      << by_path.output;
  EXPECT_FALSE(fs::exists(dir.file("o2")));
}

TEST(PrepareBpeCli, TokenizerJsonWithAllowSpecialTrains) {
  testing::ScratchDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "<|start_header_id|>user<|end_header_id|>\n\nWhat is " + std::to_string(i) +
            " squared?<|eot_id|>\n";
  }
  dir.write("a.txt", text);
  const std::string json = testing::vocab_dir() + "/llama3.tokenizer.json";
  const std::string base = trident_binary() + " prepare --input " + dir.file("a.txt") +
                           " --out " + dir.file("out") + " --tokenizer " + json +
                           " --val-fraction 0.1";
  for (bool allow : {false, true}) {
    auto ok = run_command(base + (allow ? " --allow-special" : ""));
    ASSERT_EQ(ok.exit_code, 0) << testing::vocab_missing_hint() << "\n" << ok.output;
    EXPECT_NE(ok.output.find("vocab 128256, format llmc)"), std::string::npos) << ok.output;
    auto shard = TokenFile::open(dir.file("out/train_000000.bin"));
    ASSERT_TRUE(shard.is_ok()) << shard.status().message();
    EXPECT_EQ(shard->token(0), 128000u);  // <|begin_of_text|>, from the TemplateProcessing
    // <|start_header_id|> is 128006 when allowed, else its text: '<', '|', 'start', ...
    EXPECT_EQ(shard->token(1) == 128006u, allow) << shard->token(1);
    uint64_t eot = 0;
    for (uint64_t i = 0; i < shard->num_tokens(); ++i) eot += shard->token(i) == 128009u;
    EXPECT_EQ(eot > 40, allow) << eot;
  }
  dir.write("train.yaml", train_config(dir, 128256));
  auto train = run_command("OMP_WAIT_POLICY=passive " + trident_binary() + " train --config " +
                           dir.file("train.yaml"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_EQ(testing::metrics_losses(dir.file("metrics.jsonl")).size(), 4u) << train.output;

  dir.write("bad.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  auto bad = run_command(trident_binary() + " prepare --input " + dir.file("a.txt") + " --out " +
                         dir.file("o2") + " --tokenizer " + dir.file("bad.json"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find(dir.file("bad.json") + ": model.type: 'Unigram' is not implemented"),
            std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir.file("o2")));
}

// Every named vocabulary reaches training, in both data formats: prepare writes the
// vocabulary's document token first and the size it reports, and a model of that size
// trains from the shards (llm.c uint32) or the indexed dataset (Megatron int32 above
// 65,535 ids) starting near ln(vocab), a uniform guess over the whole vocabulary.
TEST(PrepareBpeCli, EveryNamedVocabularyTrainsInBothFormats) {
  struct Case {
    std::string tokenizer, format;
    int64_t vocab;
    uint64_t first;  // the document token prepare puts before the first document
  };
  const Case cases[] = {{"o200k_base", "llmc", 200019, 199999},
                        {"llama3", "megatron", 128256, 128000},
                        {"cl100k_base", "megatron", 100277, 100257}};
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "Whitespace   runs,\tcode() {return " + std::to_string(i * 37) +
            ";} and prose: naïve café, 東京 🙂\n";
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tokenizer + " " + c.format);
    testing::ScratchDir dir;
    dir.write("a.txt", text);
    dir.write("b.txt", text);
    auto prep = run_command("TRIDENT_VOCAB_DIR=" + testing::vocab_dir() + " " + trident_binary() +
                            " prepare --input " + dir.file("a.txt") + " " + dir.file("b.txt") +
                            " --out " + dir.file("out") + " --tokenizer " + c.tokenizer +
                            " --format " + c.format + " --val-fraction 0.1");
    ASSERT_EQ(prep.exit_code, 0) << testing::vocab_missing_hint() << "\n" << prep.output;
    EXPECT_NE(prep.output.find("(tokenizer " + c.tokenizer + ", vocab " + std::to_string(c.vocab) +
                               ", format " + c.format + ")"),
              std::string::npos)
        << prep.output;
    if (c.format == "llmc") {
      auto shard = TokenFile::open(dir.file("out/train_000000.bin"));
      ASSERT_TRUE(shard.is_ok()) << shard.status().message();
      EXPECT_EQ(shard->token(0), c.first);
      dir.write("train.yaml", train_config(dir, c.vocab));
    } else {
      auto index = read_megatron_index(dir.file("out/train.idx"), dir.file("out/train.bin"),
                                       fs::file_size(dir.file("out/train.bin")));
      ASSERT_TRUE(index.is_ok()) << index.status().message();
      EXPECT_EQ(index->dtype_code, kMegatronDtypeInt32);  // ids above 65,535
      auto data = open_megatron_dataset(dir.file("out/train"));
      ASSERT_TRUE(data.is_ok()) << data.status().message();
      EXPECT_EQ(data->token(0), c.first);
      dir.write("train.yaml", train_config(dir, c.vocab, "out/train", "out/val"));
    }
    auto train = run_command("OMP_WAIT_POLICY=passive " + trident_binary() + " train --config " +
                             dir.file("train.yaml"));
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const auto losses = testing::metrics_losses(dir.file("metrics.jsonl"));
    ASSERT_EQ(losses.size(), 4u) << train.output;
    EXPECT_NEAR(std::stod(losses.begin()->second), std::log(static_cast<double>(c.vocab)), 1.0);
  }
}

}  // namespace
}  // namespace trident
