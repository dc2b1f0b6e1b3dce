// `trident ckpt inspect|verify DIR`, as a library function so checkpoint_tests can run
// it without the trainer: DIR is a step_<N> directory or a checkpoint root (then the
// step `latest` names, or the newest step_<N> when `latest` is missing or dangling).
//
//   inspect  prints the summary of checkpoint/reader.h (and, for a root, its steps).
//   verify   checks the manifest, every file's size and header, every checksum, and the
//            trainer state (checkpoint/train_state.h: fields, types, ranges).
//
// Returns the exit code: 0 intact; 1 corrupt or unreadable (the message names the
// file and tensor); 2 bad usage or DIR is not a checkpoint. Normal output is appended
// to *out, errors to *err; nothing is printed. Thread-safe.
#pragma once

#include <string>
#include <vector>

namespace trident {

int run_ckpt_command(const std::vector<std::string>& args, std::string* out, std::string* err);

inline constexpr char kCkptUsage[] =
    "usage: trident ckpt inspect DIR   what a checkpoint holds\n"
    "       trident ckpt verify DIR    is it intact (every checksum); exit 1 if not\n"
    "DIR is a step_<N> directory or a checkpoint root (then `latest` is used)\n";

}  // namespace trident
