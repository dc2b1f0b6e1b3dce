// Test helper: rewrites the trainer state of a committed checkpoint's manifest while
// keeping the manifest checksum valid — what another writer, a future version or a
// careful hand edit would produce, and what integrity checks alone cannot catch.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"
#include "core/status.h"

namespace trident::testing {

inline Status rewrite_trainer_state(const std::string& step_dir,
                                    const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = step_dir + "/" + kManifestName;
  std::string text;
  TRIDENT_RETURN_IF_ERROR(read_whole_file(path, &text));
  TRIDENT_ASSIGN_OR_RETURN(Manifest m, parse_manifest(text, path));
  edit(m.trainer_state);
  return write_file_atomic(path, manifest_to_text(m));
}

}  // namespace trident::testing
