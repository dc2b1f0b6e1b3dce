// Retention: keep the newest `keep_last` committed checkpoints of the run being trained
// under a root, delete its older ones. Never deleted: checkpoints of other runs (and
// those whose run cannot be read), the step `latest` names, the protected steps (the one
// just committed, the one this run resumed from), and the newest step that passes the
// cheap verification. Directories that are not committed steps (step_<N>.tmp of a save
// in flight, step_<N>.abandoned, foreign files) are never touched.
//
// A step is deleted by renaming it to step_<N>.deleting first (one atomic rename), then
// removing that tree, so a crash mid-delete never leaves a half-deleted step_<N> that
// looks committed. Leftover *.deleting directories are removed by the next call.
//
// Called by rank 0 only (CheckpointWriter does so after a commit). Not thread-safe
// against a concurrent retention on the same root.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

// Removes what a crash can leave under root, and nothing else: step_<N>.tmp directories
// of saves that never committed, step_<N>.deleting directories of an interrupted
// retention, latest.tmp of an interrupted update of `latest`, and .trident-probe-*
// files of an interrupted start-up check. Anything else — a user's own "notes.tmp" —
// stays. Call only while holding the root's lock and no save is in flight (at start-up);
// rank 0 only. A missing root is fine. *removed (optional) receives the removed paths.
Status remove_crash_leftovers(const std::string& root, std::vector<std::string>* removed = nullptr);

struct RetentionPolicy {
  int keep_last = 0;                  // <= 0 keeps everything
  std::optional<std::string> run_id;  // delete only this run's checkpoints; nullopt: any
  std::set<int64_t> protect;          // never deleted
};

// *deleted (optional) receives the deleted paths.
Status apply_retention(const std::string& root, const RetentionPolicy& policy,
                       std::vector<std::string>* deleted = nullptr);
// Any run's checkpoints; protect_step (optional) is never deleted.
Status apply_retention(const std::string& root, int keep_last,
                       std::optional<int64_t> protect_step = std::nullopt,
                       std::vector<std::string>* deleted = nullptr);

}  // namespace trident
