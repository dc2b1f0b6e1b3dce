// Where tests find the tiktoken rank files, the tokenizer.json files and their oracle
// packages: $TRIDENT_VOCAB_DIR, else the source tree's .cache/vocab that
// scripts/fetch_vocabs.sh (run by scripts/setup.sh) fills. As with GPT-2's files, a test that needs them fails when they
// are missing, saying how to fetch them: a missing download must not look like a pass.
#pragma once

#include <cstdlib>
#include <string>

namespace trident::testing {

inline std::string vocab_dir() {
  const char* env = std::getenv("TRIDENT_VOCAB_DIR");
  return env != nullptr && *env != '\0' ? env : std::string(TRIDENT_SOURCE_DIR) + "/.cache/vocab";
}

inline std::string vocab_missing_hint() {
  return "tiktoken rank files / tokenizer.json files not loadable from " + vocab_dir() +
         " (run scripts/fetch_vocabs.sh, or set TRIDENT_VOCAB_DIR)";
}

}  // namespace trident::testing
