// The training tokens of the small single-process trainer tests: 8000 ids below 200 in a
// fixed pattern, written as a token file (data/token_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace trident::testing {

inline Status write_pattern_tokens(const std::string& path) {
  std::vector<uint32_t> tokens(8000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint32_t>((i * 7 + i / 5) % 200);
  return write_token_file(path, tokens, 1);
}

}  // namespace trident::testing
