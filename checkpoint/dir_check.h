// Start-up check of the checkpoint root, so an unusable checkpoint.dir ends the run
// before any compute instead of at the first save (which, with interval 0, may be the
// save on a Slurm time-limit signal hours later).
//
// check_checkpoint_dir_writable(dir) creates dir and its missing parents, then creates,
// writes one byte to and removes a probe file `.trident-probe-<hostname>-<pid>` in it
// (the name is unique per process, so ranks sharing a node or a filesystem do not
// collide; crash-leftover cleanup removes stale `.trident-probe-*` files). Each rank
// writes its own rank file into the root, so every rank runs the check.
//
// Failure is an invalid_config Status (exit 2) naming the path and the reason:
//   checkpoint.dir /x/y: not a directory
//   checkpoint.dir /x/y/z: cannot create: /x/y is not a directory
//   checkpoint.dir /x/y: cannot create /x/y: Permission denied
//   checkpoint.dir /x/y: not writable: cannot create /x/y/.trident-probe-h-1: Read-only file system
// Thread-safe; concurrent callers creating the same directories are fine.
#pragma once

#include <string>

#include "core/status.h"

namespace trident {

inline constexpr const char* kCheckpointProbePrefix = ".trident-probe-";

Status check_checkpoint_dir_writable(const std::string& dir);

}  // namespace trident
