// The `latest` pointer of a checkpoint root: the step directory it names, with the run and
// checkpoint uid of that step (checkpoint/lineage.h says how runs use it):
//   step_<N>\nrun <run_id>\nuid <checkpoint_uid>\n
// (the legacy form is the first line alone).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trident {

struct LatestPointer {
  int64_t step = 0;
  std::string run_id;  // empty in the legacy one-line form
  std::string uid;     // empty in the legacy one-line form
};

std::string latest_text(int64_t step, const std::string& run_id, const std::string& uid);
// nullopt when root has no `latest`; when it exists but cannot be read or parsed,
// nullopt with *problem set.
std::optional<LatestPointer> read_latest(const std::string& root, std::string* problem);

}  // namespace trident
