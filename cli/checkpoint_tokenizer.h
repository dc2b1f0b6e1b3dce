// The tokenizer a checkpoint records, for the commands that read checkpoints
// (`trident generate`, `trident export`): the trainer state's "tokenizer"
// (data/token_meta.h), which train copied from the training data's sidecars, loaded the
// way `trident prepare` loaded it, and checked against the record.
//
// Vocabulary files of the names come from the given directory, else $TRIDENT_GPT2_DIR
// (gpt2) or $TRIDENT_VOCAB_DIR (the others), else the source tree's .cache/gpt2 or
// .cache/vocab (as prepare finds them).
#pragma once

#include <optional>
#include <string>

#include "checkpoint/reader.h"
#include "core/status.h"
#include "data/bpe_vocabularies.h"

namespace trident {

// The directory of a named vocabulary's files (see above); vocab_dir wins when given.
std::string vocabulary_dir(const std::string& name, const std::string& vocab_dir);

// A tokenizer by spec; no bpe = the byte tokenizer.
struct CliTokenizer {
  std::optional<LoadedTokenizer> bpe;
  std::string name;  // the spec, for messages and summaries
};

// SPEC as `trident prepare --tokenizer` takes it (byte, gpt2, cl100k_base, o200k_base,
// llama3, a rank file with `pattern`, a tokenizer.json).
Result<CliTokenizer> load_tokenizer_spec(const std::string& spec, const std::string& vocab_dir,
                                         const std::string& pattern);

// The tokenizer the checkpoint records, nullopt when it records none. A record that is
// not one, a recorded file that is gone or that does not load, one whose SHA-256 or size
// is not the recorded one: invalid_input naming the manifest, the file and both values,
// ending in `remedy` (what the user can do instead: "--tokenizer SPEC overrides ...").
Result<std::optional<CliTokenizer>> checkpoint_tokenizer(const Checkpoint& ckpt,
                                                         const std::string& vocab_dir,
                                                         const std::string& remedy);

}  // namespace trident
