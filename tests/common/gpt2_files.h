// Where tests find GPT-2's tokenizer files: $TRIDENT_GPT2_DIR, else the source tree's
// .cache/gpt2 that scripts/fetch_gpt2_vocab.sh (run by scripts/setup.sh) fills.
#pragma once

#include <cstdlib>
#include <string>

namespace trident::testing {

inline std::string gpt2_dir() {
  const char* env = std::getenv("TRIDENT_GPT2_DIR");
  return env != nullptr && *env != '\0' ? env : std::string(TRIDENT_SOURCE_DIR) + "/.cache/gpt2";
}

// The hint a test prints when the files are missing: the tests fail, they never skip.
inline std::string gpt2_missing_hint() {
  return "GPT-2 tokenizer files not loadable from " + gpt2_dir() +
         " (run scripts/fetch_gpt2_vocab.sh, or set TRIDENT_GPT2_DIR)";
}

}  // namespace trident::testing
