// Reading committed checkpoints: open a step directory, read any box of any tensor
// (resharding: the request is intersected with the boxes on disk, whichever files and
// layout wrote them), verify integrity, pick the newest valid step, and summarize.
//
// Integrity: every box read is checked against its XXH3 checksum on first use (later
// reads of the same box trust that check). A flipped byte is Status::corrupt naming
// the file and the tensor; a truncated file or a mangled header names the file, e.g.
//   "/ckpt/step_20/rank_1.bin: checksum mismatch in tensor 'param/w' box start [2, 0]
//    extent [2, 4] at offset 96 (manifest 0123..., file 4567...)".
// A missing manifest is Status::corrupt naming manifest.json ("not committed").
//
// Dtypes and memory spaces: a destination says its dtype (a typed host pointer, or a
// DevPtr) and must match the tensor's dtype in the manifest, else invalid_input naming
// the tensor and both dtypes ("... tensor 'adam_m/w' is bf16 in the checkpoint, but the
// destination is f32"); nothing is converted. A device destination is filled by reading
// into a host staging buffer (kept between reads) and one Ops::upload.
//
// Threads: a Checkpoint is used by one thread at a time (it caches open files and the
// set of verified boxes; the Ops passed in is that thread's). Free functions are
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"
#include "core/memory.h"
#include "core/status.h"
#include "core/tensor.h"

namespace trident {

class Ops;

class Checkpoint {
 public:
  Checkpoint(std::string dir, Manifest manifest)
      : dir_(std::move(dir)), manifest_(std::move(manifest)) {}

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.step; }
  const nlohmann::json& trainer_state() const { return manifest_.trainer_state; }
  bool has_tensor(const std::string& tensor) const { return manifest_.tensors.count(tensor) > 0; }
  // The global shape / the dtype; invalid_input naming the tensor when absent.
  Result<std::vector<int64_t>> shape(const std::string& tensor) const;
  Result<DType> dtype(const std::string& tensor) const;

  // Fills out: (extent...) row-major with the global box (start, extent) of `tensor`.
  // invalid_input when the tensor is absent, the box leaves its shape or the dtypes
  // differ (see above); corrupt when a box it needs is damaged or its file is missing or
  // truncated.
  Status read_box(const std::string& tensor, std::span<const int64_t> start,
                  std::span<const int64_t> extent, float* out);
  Status read_box(const std::string& tensor, std::span<const int64_t> start,
                  std::span<const int64_t> extent, bf16_t* out);
  Status read_box(const std::string& tensor, std::span<const int64_t> start,
                  std::span<const int64_t> extent, int32_t* out);
  // Into device memory: staged on the host, then one ops.upload.
  Status read_box(const std::string& tensor, std::span<const int64_t> start,
                  std::span<const int64_t> extent, DevPtr out, Ops& ops);
  // The whole f32 tensor: out holds volume(shape) floats.
  Status read_tensor(const std::string& tensor, float* out);

  // Cheap: every file exists with the manifest's exact size and header.
  Status check_files();
  // Full: check_files, then every box's checksum.
  Status verify_all();

 private:
  // Host memory of `dtype` at out.
  Status read_box_as(const std::string& tensor, std::span<const int64_t> start,
                     std::span<const int64_t> extent, DType dtype, void* out);
  Status open_file(const std::string& name, FileHandle** out);
  Status check_header(const ManifestFile& file, FileHandle& handle);
  // Reads elements [first, first + count) of a box into scratch_; on the box's first use
  // reads the whole box and checks its checksum.
  Status read_box_elements(const std::string& tensor, size_t box_index, int64_t first,
                           int64_t count);

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, FileHandle> files_;             // open rank files, by name
  std::set<std::pair<std::string, size_t>> verified_;   // (tensor, box index)
  std::vector<std::byte> scratch_;  // one box as on disk
  std::vector<std::byte> staging_;  // a device destination's host copy
};

// Parses and validates <dir>/manifest.json. Does not touch the rank files.
Result<Checkpoint> open_checkpoint(const std::string& step_dir);

enum class VerifyLevel {
  kCheap,  // manifest valid, all files present with the right sizes and headers
  kFull,   // also every checksum
};

// Full verification of one step directory (open_checkpoint + verify_all).
Status verify_checkpoint(const std::string& step_dir);

// The committed step directories under root (step_<N>, not .tmp), ascending by step.
std::vector<std::pair<int64_t, std::string>> list_steps(const std::string& root);

// The newest step_<N> under root (by N) that passes `level`; the ones skipped on the
// way are appended to *skipped as "<path>: <reason>". .tmp directories (uncommitted or
// crashed saves) are ignored. invalid_input when root has no valid checkpoint (the
// message lists the reasons). Structural only, and not a resume policy: the highest
// step may belong to another run; --resume auto follows `latest` and the run's lineage
// (checkpoint/lineage.h choose_auto_resume).
Result<std::string> find_latest_valid(const std::string& root, std::vector<std::string>* skipped,
                                      VerifyLevel level = VerifyLevel::kFull);

// The step directory the user means by `path`: path itself when it holds a manifest (or
// looks like step_<N>); for a checkpoint root, the step `latest` names when that exists,
// else the newest step_<N> (a note about a dangling `latest` goes to *note).
Result<std::string> resolve_step_dir(const std::string& path, std::string* note);

// A printable summary: step, world size, trainer state, tensors with shapes, bytes and
// box counts, files with sizes.
std::string inspect_checkpoint(const Checkpoint& checkpoint);

}  // namespace trident
