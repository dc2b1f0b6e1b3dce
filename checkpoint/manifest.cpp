#include "checkpoint/manifest.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "checkpoint/box.h"

namespace trident {

using nlohmann::json;

std::string step_dir_name(int64_t step) { return "step_" + std::to_string(step); }
std::string rank_file_name(int rank) { return "rank_" + std::to_string(rank) + ".bin"; }

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return std::nullopt;
  }
  if (name.size() - prefix.size() > 18) return std::nullopt;  // fits int64
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string encode_rank_header(int rank, int64_t step, int64_t payload_bytes) {
  std::string h(kRankFileHeaderBytes, '\0');
  const uint32_t version = kCheckpointVersion;
  const uint32_t r = static_cast<uint32_t>(rank);
  std::memcpy(h.data(), kRankFileMagic, 8);
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &r, 4);
  std::memcpy(h.data() + 16, &step, 8);
  std::memcpy(h.data() + 24, &payload_bytes, 8);
  return h;
}

std::optional<DType> checkpoint_dtype(const std::string& name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kI32}) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

uint64_t checksum_bytes(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string checksum_to_hex(uint64_t checksum) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

namespace {

bool hex_to_checksum(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

json manifest_body(const Manifest& m) {
  json j;
  j["format"] = kCheckpointFormat;
  j["version"] = m.version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  // Readers from before bf16 support require "dtype_bytes": 4; it stays while it is true
  // (every tensor f32), so those binaries still resume what the trainer writes.
  bool all_f32 = true;
  for (const auto& [name, t] : m.tensors) all_f32 = all_f32 && t.dtype == DType::kF32;
  if (all_f32) j["dtype_bytes"] = 4;
  j["checksum"] = "xxh3_64";
  j["trainer_state"] = m.trainer_state;
  json files = json::array();
  for (const ManifestFile& f : m.files) {
    files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}});
  }
  j["files"] = files;
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json boxes = json::array();
    for (const ManifestBox& b : t.boxes) {
      boxes.push_back({{"file", b.file},
                       {"offset", b.offset},
                       {"start", b.start},
                       {"extent", b.extent},
                       {"checksum", checksum_to_hex(b.checksum)}});
    }
    tensors[name] = {{"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"boxes", boxes}};
  }
  j["tensors"] = tensors;
  return j;
}

// Throws json exceptions on missing fields or wrong types; the caller turns them into
// a corrupt Status.
Manifest manifest_from_json(const json& j, std::string* error) {
  Manifest m;
  if (j.at("format").get<std::string>() != kCheckpointFormat) {
    *error = "\"format\" is not \"" + std::string(kCheckpointFormat) + "\"";
    return m;
  }
  m.version = j.at("version").get<int>();
  if (m.version != kCheckpointVersion) {
    *error = "format version " + std::to_string(m.version) + " is not supported (this build reads " +
             std::to_string(kCheckpointVersion) + ")";
    return m;
  }
  if (j.contains("dtype_bytes") && j.at("dtype_bytes").get<int>() != 4) {
    *error = "unsupported dtype_bytes " + j.at("dtype_bytes").dump() + " (only 4, of old f32 manifests)";
    return m;
  }
  if (j.at("checksum").get<std::string>() != "xxh3_64") {
    *error = "unsupported checksum algorithm " + j.at("checksum").dump();
    return m;
  }
  m.step = j.at("step").get<int64_t>();
  m.world_size = j.at("world_size").get<int>();
  m.trainer_state = j.at("trainer_state");
  for (const json& f : j.at("files")) {
    m.files.push_back({f.at("name").get<std::string>(), f.at("rank").get<int>(),
                       f.at("bytes").get<int64_t>()});
  }
  for (const auto& [name, t] : j.at("tensors").items()) {
    ManifestTensor tensor;
    tensor.shape = t.at("shape").get<std::vector<int64_t>>();
    const std::string dtype = t.at("dtype").get<std::string>();
    const std::optional<DType> parsed = checkpoint_dtype(dtype);
    if (!parsed) {
      *error = "tensor '" + name + "': dtype '" + dtype + "' is not supported (f32, bf16, i32)";
      return m;
    }
    tensor.dtype = *parsed;
    for (const json& b : t.at("boxes")) {
      ManifestBox box;
      box.file = b.at("file").get<std::string>();
      box.offset = b.at("offset").get<int64_t>();
      box.start = b.at("start").get<std::vector<int64_t>>();
      box.extent = b.at("extent").get<std::vector<int64_t>>();
      if (!hex_to_checksum(b.at("checksum").get<std::string>(), &box.checksum)) {
        *error = "tensor '" + name + "': checksum is not 16 hex digits";
        return m;
      }
      tensor.boxes.push_back(std::move(box));
    }
    m.tensors.emplace(name, std::move(tensor));
  }
  return m;
}

}  // namespace

const ManifestFile* Manifest::find_file(const std::string& name) const {
  for (const ManifestFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

int64_t Manifest::total_payload_bytes() const {
  int64_t n = 0;
  for (const ManifestFile& f : files) n += f.bytes - kRankFileHeaderBytes;
  return n;
}

std::string manifest_to_text(const Manifest& manifest) {
  json j = manifest_body(manifest);
  const std::string body = j.dump();
  j["manifest_checksum"] = checksum_to_hex(checksum_bytes(body.data(), body.size()));
  return j.dump(1) + "\n";
}

Status validate_manifest(const Manifest& m, const std::string& path) {
  if (m.world_size < 1) return Status::corrupt(path + ": world_size must be >= 1");
  for (const ManifestFile& f : m.files) {
    if (f.bytes < kRankFileHeaderBytes) {
      return Status::corrupt(path + ": file " + f.name + " is smaller than its header");
    }
  }
  for (const auto& [name, t] : m.tensors) {
    if (!checkpoint_dtype(dtype_name(t.dtype))) {
      return Status::corrupt(path + ": tensor '" + name + "': dtype '" + dtype_name(t.dtype) +
                             "' is not supported (f32, bf16, i32)");
    }
    for (int64_t d : t.shape) {
      if (d < 0) return Status::corrupt(path + ": tensor '" + name + "': negative dimension");
    }
    std::vector<BoxSpan> spans;
    for (const ManifestBox& b : t.boxes) {
      const ManifestFile* f = m.find_file(b.file);
      if (f == nullptr) {
        return Status::corrupt(path + ": tensor '" + name + "': box names file '" + b.file +
                               "', which the manifest does not list");
      }
      Status in = check_box_in_shape(name, t.shape, b.start, b.extent);
      if (!in.is_ok()) return Status::corrupt(path + ": " + b.file + ": " + in.message());
      const int64_t bytes = volume(b.extent) * static_cast<int64_t>(dtype_size(t.dtype));
      if (b.offset < kRankFileHeaderBytes || b.offset + bytes > f->bytes) {
        return Status::corrupt(path + ": tensor '" + name + "': box at offset " +
                               std::to_string(b.offset) + " (" + std::to_string(bytes) +
                               " bytes) lies outside " + b.file + " (" + std::to_string(f->bytes) +
                               " bytes)");
      }
      spans.push_back({b.start, b.extent, b.file});
    }
    Status cover = check_exact_cover(name, t.shape, spans);
    if (!cover.is_ok()) return Status::corrupt(path + ": " + cover.message());
  }
  return Status::ok();
}

Result<Manifest> parse_manifest(const std::string& text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::corrupt(path + ": not valid JSON (torn or damaged manifest)");
  }
  if (!j.contains("manifest_checksum") || !j["manifest_checksum"].is_string()) {
    return Status::corrupt(path + ": missing \"manifest_checksum\"");
  }
  const std::string stored = j["manifest_checksum"].get<std::string>();
  j.erase("manifest_checksum");
  const std::string body = j.dump();
  if (checksum_to_hex(checksum_bytes(body.data(), body.size())) != stored) {
    return Status::corrupt(path + ": manifest_checksum mismatch (the manifest was damaged or edited)");
  }
  std::string error;
  Manifest m;
  try {
    m = manifest_from_json(j, &error);
  } catch (const json::exception& e) {
    return Status::corrupt(path + ": bad field: " + e.what());
  }
  if (!error.empty()) return Status::corrupt(path + ": " + error);
  TRIDENT_RETURN_IF_ERROR(validate_manifest(m, path));
  return m;
}

}  // namespace trident
