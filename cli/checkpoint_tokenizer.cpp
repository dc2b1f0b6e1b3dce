#include "cli/checkpoint_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "data/token_meta.h"

namespace trident {

std::string vocabulary_dir(const std::string& name, const std::string& vocab_dir) {
  if (!vocab_dir.empty()) return vocab_dir;
  const bool gpt2 = name == "gpt2";
  const char* env = std::getenv(gpt2 ? "TRIDENT_GPT2_DIR" : "TRIDENT_VOCAB_DIR");
  if (env != nullptr && *env != '\0') return env;
  return gpt2 ? TRIDENT_DEFAULT_GPT2_DIR : TRIDENT_DEFAULT_VOCAB_DIR;
}

Result<CliTokenizer> load_tokenizer_spec(const std::string& spec, const std::string& vocab_dir,
                                         const std::string& pattern) {
  CliTokenizer t;
  if (spec == "byte") {
    t.name = "byte";
    return t;
  }
  TRIDENT_ASSIGN_OR_RETURN(LoadedTokenizer loaded,
                           load_vocabulary(spec, vocabulary_dir(spec, vocab_dir), pattern));
  t.name = loaded.spec;
  t.bpe.emplace(std::move(loaded));
  return t;
}

Result<std::optional<CliTokenizer>> checkpoint_tokenizer(const Checkpoint& ckpt,
                                                         const std::string& vocab_dir,
                                                         const std::string& remedy) {
  const nlohmann::json& state = ckpt.trainer_state();
  if (!state.is_object() || !state.contains("tokenizer")) return std::optional<CliTokenizer>();
  const std::string where = ckpt.dir() + "/manifest.json";
  const std::optional<TokenizerRecord> record = tokenizer_record_from_json(state.at("tokenizer"));
  if (!record) {
    return Status::invalid_input(where + ": the trainer state's \"tokenizer\" is not a "
                                 "tokenizer record (name, vocab_size, ...): " +
                                 state.at("tokenizer").dump() + " (" + remedy + ")");
  }
  const std::string& name = record->name;
  // The file the record's hash covers, to name it when it is gone or changed.
  std::string file = name;
  if (name == "gpt2") {
    file = vocabulary_dir(name, vocab_dir) + "/encoder.json";
  } else if (is_named_vocabulary(name)) {
    file = vocabulary_dir(name, vocab_dir) + "/" + name + ".tiktoken";
  }
  std::error_code ec;
  if (name != "byte" && !std::filesystem::exists(file, ec)) {
    return Status::invalid_input(where + ": the checkpoint's tokenizer file " + file +
                                 " does not exist (SHA-256 recorded " + record->sha256 +
                                 "); " + remedy);
  }
  Result<CliTokenizer> loaded = load_tokenizer_spec(name, vocab_dir, record->pattern);
  if (!loaded.is_ok()) {
    return Status(loaded.status().code(),
                  loaded.status().message() + " (the tokenizer " + where + " records; " +
                      remedy + ")");
  }
  CliTokenizer t = std::move(loaded).value();
  if (t.bpe && t.bpe->sha256 != record->sha256) {
    return Status::invalid_input(
        where + ": the checkpoint's tokenizer " + file + " has SHA-256 " + t.bpe->sha256 +
        ", but the data the checkpoint trained on was tokenized by a file with SHA-256 " +
        record->sha256 + "; " + remedy);
  }
  if (t.bpe && t.bpe->bpe.vocab_size() != record->vocab_size) {
    return Status::invalid_input(where + ": the checkpoint's tokenizer " + file + " has " +
                                 std::to_string(t.bpe->bpe.vocab_size()) + " ids, the record " +
                                 std::to_string(record->vocab_size));
  }
  t.name += " (the checkpoint's)";
  return std::optional<CliTokenizer>(std::move(t));
}

}  // namespace trident
