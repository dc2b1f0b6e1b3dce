// The checkpoint format (docs/CHECKPOINTS.md): names on disk, the rank-file header and
// the manifest that describes a committed checkpoint.
//
//   <root>/step_<N>/rank_<r>.bin   32-byte header, then the rank's boxes back to back
//   <root>/step_<N>/manifest.json  written last; its presence marks a committed step
//   <root>/step_<N>.tmp/           a save in progress (or abandoned by a crash)
//   <root>/latest                  "step_<N>\n", replaced atomically after each commit
//
// Rank-file header (little-endian): magic "TRIDCKPT" (8 bytes), format version u32,
// rank u32, step i64, payload bytes i64. Every header byte is checked against the
// manifest, so a flipped header byte is detected like a flipped data byte.
//
// Manifest: JSON object with "format", "version", "step", "world_size", "checksum"
// (algorithm name, "xxh3_64"), "trainer_state" (opaque caller object), "files" ([{name,
// rank, bytes}]), "tensors" ({name: {shape, dtype, boxes: [{file, offset, start,
// extent, checksum}]}}) and "manifest_checksum": XXH3-64 (16 hex digits) of the compact
// dump of every other field, so that any edit or damage is detected. A tensor's dtype
// ("f32", "bf16" or "i32", core/tensor.h dtype_name) fixes the width of its elements in
// the rank files. "dtype_bytes": 4 is written when every tensor is f32, for readers from
// before bf16 support (which require it); it is accepted when it says 4.
// Box checksums are XXH3-64 of the box's bytes, as 16 hex digits.
//
// Pure data and parsing; no threads. Errors are Status::corrupt naming the manifest.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace trident {

inline constexpr int kCheckpointVersion = 1;
inline constexpr char kCheckpointFormat[] = "trident-checkpoint";
inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kLatestName[] = "latest";
inline constexpr char kRankFileMagic[8] = {'T', 'R', 'I', 'D', 'C', 'K', 'P', 'T'};
inline constexpr int64_t kRankFileHeaderBytes = 32;

// "step_12", "step_12.tmp", "rank_3.bin".
std::string step_dir_name(int64_t step);
std::string rank_file_name(int rank);
// The step of a committed-step directory name "step_<digits>"; nullopt for anything
// else (step_5.tmp, step_5.deleting, step_x, latest).
std::optional<int64_t> parse_step_dir_name(const std::string& name);

// The 32-byte header of a rank file.
std::string encode_rank_header(int rank, int64_t step, int64_t payload_bytes);

// Checksum of bytes: XXH3-64, printed as 16 lowercase hex digits.
uint64_t checksum_bytes(const void* data, size_t bytes);
std::string checksum_to_hex(uint64_t checksum);

// The dtypes a checkpoint stores, by their manifest spelling: "f32", "bf16", "i32";
// nullopt for any other name (f64, i64 and u8 are not tensor types).
std::optional<DType> checkpoint_dtype(const std::string& name);

struct ManifestBox {
  std::string file;             // "rank_1.bin"
  int64_t offset = 0;           // byte offset of the box in the file
  std::vector<int64_t> start;   // global coordinates
  std::vector<int64_t> extent;
  uint64_t checksum = 0;        // XXH3-64 of the box's volume(extent) * dtype_size bytes
};

struct ManifestTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  std::vector<ManifestBox> boxes;
};

struct ManifestFile {
  std::string name;  // "rank_1.bin"
  int rank = 0;
  int64_t bytes = 0;  // exact file size: header + payload
};

struct Manifest {
  int version = kCheckpointVersion;
  int64_t step = 0;
  int world_size = 1;
  nlohmann::json trainer_state = nlohmann::json::object();
  std::map<std::string, ManifestTensor> tensors;  // by global name
  std::vector<ManifestFile> files;                // by rank

  const ManifestFile* find_file(const std::string& name) const;
  int64_t total_payload_bytes() const;
};

// The manifest's JSON text, with manifest_checksum (pretty-printed, 1-space indent).
std::string manifest_to_text(const Manifest& manifest);

// Parses and validates: version, fields and types, every box inside its tensor and
// its file, the boxes of each tensor an exact cover, manifest_checksum. `path` names
// the manifest in messages.
Result<Manifest> parse_manifest(const std::string& text, const std::string& path);

// Structural checks shared by the writer (before committing) and the reader: files
// named, boxes inside files and tensors, exact cover. Messages start with `path`.
Status validate_manifest(const Manifest& manifest, const std::string& path);

}  // namespace trident
