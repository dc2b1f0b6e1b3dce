// Runs and lineage: which checkpoints under a checkpoint root belong to which run, which
// one a run continues from, and what a resume may do to the others (docs/CHECKPOINTS.md,
// "Runs and lineage").
//
// Every checkpoint's trainer state (checkpoint/train_state.h) names its run (run_id), its
// own uid and its ancestors' uids. `latest` names the head of the run being trained:
//   step_<N>\nrun <run_id>\nuid <checkpoint_uid>\n
// (the legacy form is the first line alone). The rules:
//  - --resume auto follows `latest`, never the highest step number: it takes the newest
//    valid checkpoint that descends from the one `latest` names (a commit whose update of
//    `latest` was cut short by a crash or a full disk), else that one, else the newest
//    valid older checkpoint of the same run. Checkpoints of other runs are never chosen.
//    Step directories exist but none qualifies: refused (exit 2), never a silent restart.
//  - --resume none is refused while the root holds checkpoints.
//  - Continuing from step S (auto or an explicit --resume DIR) first sets aside every
//    step_<N> with N > S under the root — renamed to step_<N>.abandoned, never deleted —
//    so that the continued run cannot overwrite them or be confused with them, and points
//    `latest` at S when S lies in the root.
//  - Retention (checkpoint/retention.h) deletes only checkpoints of the run being trained.
//
// All functions here are for rank 0 (the rank that commits) while it holds the root's lock
// (checkpoint/dir_lock.h). Errors are Status values naming the root and each checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/latest.h"
#include "checkpoint/train_state.h"
#include "core/status.h"

namespace trident {

// One committed step directory, cheaply checked: manifest parsed, trainer state parsed
// and range-checked, and (unless skipped) every rank file present with the right size
// and header.
struct StepInfo {
  int64_t step = 0;
  std::string dir;
  Status status;                    // the cheap check's outcome
  Status structure;                 // the same without the trainer state (files only)
  std::optional<TrainState> state;  // when the manifest and the trainer state parse
};
// Every step_<N> under root, ascending by N. check_files false: the manifests only (no
// rank file is opened; status and structure then say nothing about the files).
std::vector<StepInfo> scan_steps(const std::string& root, bool check_files = true);
// Opens step_dir's manifest and checks its rank files (sizes and headers).
Status check_step_files(const std::string& step_dir);
// The cheap check plus every box checksum, for one step directory.
Result<TrainState> verify_training_checkpoint(const std::string& step_dir);

struct ResumeChoice {
  std::string dir;                    // the step directory to continue; empty: start fresh
  std::vector<std::string> warnings;  // checkpoints skipped or ignored, and why
};
// --resume auto (full verification of the chosen checkpoint).
Result<ResumeChoice> choose_auto_resume(const std::string& root);

// --resume none: ok when root holds no step directory; else invalid_config naming them.
Status check_fresh_start(const std::string& root);

// Before continuing from the verified checkpoint `from_dir` (state `from`) while saving
// into root: sets aside the step directories above from.step (their new paths go to
// *moved) and, when from_dir lies in root, points `latest` at it. When from_dir lies
// elsewhere, root must not hold checkpoints of another run (invalid_config).
Status prepare_continuation(const std::string& root, const std::string& from_dir,
                            const TrainState& from, std::vector<std::string>* moved);

}  // namespace trident
