// Retention: keep the newest `keep_last` committed checkpoints under a root, delete
// older ones. Never deleted: the step `latest` names, the `protect_step` (the one just
// committed), and — when no protect_step is given — the newest step that passes the
// cheap verification. Directories that are not committed steps (step_<N>.tmp of a save
// in flight, foreign files) are never touched.
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
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

// Removes what a crash can leave under root: step_<N>.tmp directories of saves that never
// committed, *.deleting directories of an interrupted retention, and temporary files of
// an interrupted atomic write (latest.tmp). Call only when no save is in flight (at
// start-up, before the first save); rank 0 only. A missing root is fine.
Status remove_crash_leftovers(const std::string& root);

// keep_last <= 0 keeps everything. *deleted (optional) receives the deleted paths.
Status apply_retention(const std::string& root, int keep_last,
                       std::optional<int64_t> protect_step = std::nullopt,
                       std::vector<std::string>* deleted = nullptr);

}  // namespace trident
