#include "checkpoint/reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/box.h"
#include "checkpoint/latest.h"
#include "kernels/ops.h"

namespace trident {

namespace fs = std::filesystem;

Result<std::vector<int64_t>> Checkpoint::shape(const std::string& tensor) const {
  auto it = manifest_.tensors.find(tensor);
  if (it == manifest_.tensors.end()) {
    return Status::invalid_input(dir_ + ": checkpoint has no tensor '" + tensor + "'");
  }
  return it->second.shape;
}

Result<DType> Checkpoint::dtype(const std::string& tensor) const {
  auto it = manifest_.tensors.find(tensor);
  if (it == manifest_.tensors.end()) {
    return Status::invalid_input(dir_ + ": checkpoint has no tensor '" + tensor + "'");
  }
  return it->second.dtype;
}

Status Checkpoint::check_header(const ManifestFile& file, FileHandle& handle) {
  const std::string path = dir_ + "/" + file.name;
  int64_t size = 0;
  TRIDENT_RETURN_IF_ERROR(handle.size(&size, path));
  if (size != file.bytes) {
    return Status::corrupt(path + ": " + (size < file.bytes ? "truncated: " : "wrong size: ") +
                           std::to_string(size) + " bytes, manifest says " +
                           std::to_string(file.bytes));
  }
  std::string header(kRankFileHeaderBytes, '\0');
  size_t got = 0;
  TRIDENT_RETURN_IF_ERROR(handle.pread_all(header.data(), header.size(), 0, &got, path));
  if (header != encode_rank_header(file.rank, manifest_.step, file.bytes - kRankFileHeaderBytes)) {
    return Status::corrupt(path + ": bad header (expected magic TRIDCKPT, version " +
                           std::to_string(kCheckpointVersion) + ", rank " +
                           std::to_string(file.rank) + ", step " + std::to_string(manifest_.step) +
                           ")");
  }
  return Status::ok();
}

Status Checkpoint::open_file(const std::string& name, FileHandle** out) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const ManifestFile* file = manifest_.find_file(name);
    const std::string path = dir_ + "/" + name;
    if (file == nullptr) return Status::corrupt(path + ": not listed in the manifest");
    std::error_code ec;
    if (!fs::exists(path, ec)) return Status::corrupt(path + ": missing");
    FileHandle handle;
    TRIDENT_RETURN_IF_ERROR(FileHandle::open_read(path, &handle));
    TRIDENT_RETURN_IF_ERROR(check_header(*file, handle));
    it = files_.emplace(name, std::move(handle)).first;
  }
  *out = &it->second;
  return Status::ok();
}

Status Checkpoint::read_box_elements(const std::string& tensor, size_t box_index, int64_t first,
                                     int64_t count) {
  const ManifestTensor& t = manifest_.tensors.at(tensor);
  const ManifestBox& box = t.boxes[box_index];
  const int64_t width = static_cast<int64_t>(dtype_size(t.dtype));
  const std::string path = dir_ + "/" + box.file;
  FileHandle* handle = nullptr;
  Status st = open_file(box.file, &handle);
  if (!st.is_ok()) return st.with_context("tensor '" + tensor + "'");
  const bool verify = verified_.count({tensor, box_index}) == 0;
  const int64_t box_elems = volume(box.extent);
  const int64_t lo = verify ? 0 : first;
  const int64_t n = verify ? box_elems : count;
  scratch_.resize(static_cast<size_t>(box_elems * width));
  const size_t bytes = static_cast<size_t>(n * width);
  size_t got = 0;
  TRIDENT_RETURN_IF_ERROR(handle->pread_all(scratch_.data() + lo * width, bytes,
                                            box.offset + lo * width, &got, path));
  if (got != bytes) {
    return Status::corrupt(path + ": truncated in tensor '" + tensor + "' box start " +
                           dims_to_string(box.start) + " extent " + dims_to_string(box.extent));
  }
  if (verify) {
    const uint64_t actual = checksum_bytes(scratch_.data(), bytes);
    if (actual != box.checksum) {
      return Status::corrupt(path + ": checksum mismatch in tensor '" + tensor + "' box start " +
                             dims_to_string(box.start) + " extent " + dims_to_string(box.extent) +
                             " at offset " + std::to_string(box.offset) + " (manifest " +
                             checksum_to_hex(box.checksum) + ", file " + checksum_to_hex(actual) +
                             ")");
    }
    verified_.insert({tensor, box_index});
  }
  return Status::ok();
}

Status Checkpoint::read_box(const std::string& tensor, std::span<const int64_t> start,
                            std::span<const int64_t> extent, float* out) {
  return read_box_as(tensor, start, extent, DType::kF32, out);
}

Status Checkpoint::read_box(const std::string& tensor, std::span<const int64_t> start,
                            std::span<const int64_t> extent, bf16_t* out) {
  return read_box_as(tensor, start, extent, DType::kBF16, out);
}

Status Checkpoint::read_box(const std::string& tensor, std::span<const int64_t> start,
                            std::span<const int64_t> extent, int32_t* out) {
  return read_box_as(tensor, start, extent, DType::kI32, out);
}

Status Checkpoint::read_box(const std::string& tensor, std::span<const int64_t> start,
                            std::span<const int64_t> extent, DevPtr out, Ops& ops) {
  const int64_t n = volume(extent);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(out.dtype());
  staging_.resize(bytes);  // keeps its capacity between reads
  TRIDENT_RETURN_IF_ERROR(read_box_as(tensor, start, extent, out.dtype(), staging_.data()));
  if (bytes > 0) ops.upload(out, staging_.data(), bytes);
  return Status::ok();
}

Status Checkpoint::read_box_as(const std::string& tensor, std::span<const int64_t> start,
                               std::span<const int64_t> extent, DType dtype, void* out) {
  auto it = manifest_.tensors.find(tensor);
  if (it == manifest_.tensors.end()) {
    return Status::invalid_input(dir_ + ": checkpoint has no tensor '" + tensor + "'");
  }
  const ManifestTensor& t = it->second;
  if (t.dtype != dtype) {
    return Status::invalid_input(dir_ + ": tensor '" + tensor + "' is " + dtype_name(t.dtype) +
                                 " in the checkpoint, but the destination is " +
                                 dtype_name(dtype) + " (no conversion on load)");
  }
  Status in = check_box_in_shape(tensor, t.shape, start, extent);
  if (!in.is_ok()) return in.with_context(dir_);
  const size_t n = t.shape.size();
  int64_t filled = 0;
  std::vector<int64_t> is, ie;
  for (size_t b = 0; b < t.boxes.size(); ++b) {
    const ManifestBox& box = t.boxes[b];
    if (volume(box.extent) == 0) continue;
    if (!intersect_boxes(box.start, box.extent, start, extent, &is, &ie)) continue;
    // Elements [first, last] of the box (row-major) hold the intersection.
    int64_t first = 0, last = 0, stride = 1;
    for (size_t d = n; d-- > 0;) {
      first += (is[d] - box.start[d]) * stride;
      last += (is[d] + ie[d] - 1 - box.start[d]) * stride;
      stride *= box.extent[d];
    }
    TRIDENT_RETURN_IF_ERROR(read_box_elements(tensor, b, first, last - first + 1));
    copy_region(scratch_.data(), box.start, box.extent, out, start, extent, is, ie,
                dtype_size(t.dtype));
    filled += volume(ie);
  }
  if (filled != volume(extent)) {  // impossible for a validated manifest; kept as a guard
    return Status::corrupt(dir_ + ": tensor '" + tensor + "': box start " + dims_to_string(start) +
                           " extent " + dims_to_string(extent) + " is not fully covered");
  }
  return Status::ok();
}

Status Checkpoint::read_tensor(const std::string& tensor, float* out) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> s, shape(tensor));
  const std::vector<int64_t> zeros(s.size(), 0);
  return read_box(tensor, zeros, s, out);
}

Status Checkpoint::check_files() {
  for (const ManifestFile& f : manifest_.files) {
    FileHandle* handle = nullptr;
    TRIDENT_RETURN_IF_ERROR(open_file(f.name, &handle));
  }
  return Status::ok();
}

Status Checkpoint::verify_all() {
  TRIDENT_RETURN_IF_ERROR(check_files());
  verified_.clear();  // a full verification re-reads everything
  for (const auto& [name, t] : manifest_.tensors) {
    for (size_t b = 0; b < t.boxes.size(); ++b) {
      TRIDENT_RETURN_IF_ERROR(read_box_elements(name, b, 0, 0));
    }
  }
  return Status::ok();
}

Result<Checkpoint> open_checkpoint(const std::string& step_dir) {
  const std::string path = step_dir + "/" + kManifestName;
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return Status::corrupt(step_dir + ": no such checkpoint directory");
  }
  if (!fs::exists(path, ec)) {
    return Status::corrupt(path + ": missing (the checkpoint was never committed)");
  }
  std::string text;
  TRIDENT_RETURN_IF_ERROR(read_whole_file(path, &text));
  TRIDENT_ASSIGN_OR_RETURN(Manifest manifest, parse_manifest(text, path));
  return Checkpoint(step_dir, std::move(manifest));
}

Status verify_checkpoint(const std::string& step_dir) {
  TRIDENT_ASSIGN_OR_RETURN(Checkpoint ckpt, open_checkpoint(step_dir));
  return ckpt.verify_all();
}

std::vector<std::pair<int64_t, std::string>> list_steps(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (!it->is_directory(ec2)) continue;
    const auto step = parse_step_dir_name(it->path().filename().string());
    if (step) steps.emplace_back(*step, it->path().string());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<std::string> find_latest_valid(const std::string& root, std::vector<std::string>* skipped,
                                      VerifyLevel level) {
  std::vector<std::string> reasons;
  auto steps = list_steps(root);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string& dir = it->second;
    Status st;
    Result<Checkpoint> ckpt = open_checkpoint(dir);
    if (!ckpt.is_ok()) {
      st = ckpt.status();
    } else if (ckpt->step() != it->first) {
      st = Status::corrupt(dir + ": manifest says step " + std::to_string(ckpt->step()));
    } else {
      st = level == VerifyLevel::kFull ? ckpt->verify_all() : ckpt->check_files();
    }
    if (st.is_ok()) {
      if (skipped) skipped->insert(skipped->end(), reasons.begin(), reasons.end());
      return dir;
    }
    reasons.push_back(dir + ": " + st.message());
  }
  if (skipped) skipped->insert(skipped->end(), reasons.begin(), reasons.end());
  std::string message = root + ": no valid checkpoint";
  for (const std::string& r : reasons) message += "\n  skipped " + r;
  return Status::invalid_input(message);
}

Result<std::string> resolve_step_dir(const std::string& path, std::string* note) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return Status::invalid_input(path + ": no such directory");
  const std::string name = fs::path(path).lexically_normal().filename().string();
  if (fs::exists(path + "/" + kManifestName, ec) || parse_step_dir_name(name) ||
      name.ends_with(".tmp")) {
    return path;
  }
  const std::string latest = path + "/" + kLatestName;
  std::string problem;
  if (auto pointer = read_latest(path, &problem)) {
    const std::string text = step_dir_name(pointer->step);
    if (fs::is_directory(path + "/" + text, ec)) return path + "/" + text;
    if (note) *note = latest + " names '" + text + "', which does not exist; ";
  } else if (!problem.empty() && note) {
    *note = problem + "; ";
  }
  auto steps = list_steps(path);
  if (steps.empty()) {
    return Status::invalid_input(path + ": not a checkpoint directory (no " + kManifestName +
                                 ", latest or step_<N>)");
  }
  if (note && !note->empty()) *note += "using the newest, " + steps.back().second;
  return steps.back().second;
}

std::string inspect_checkpoint(const Checkpoint& ckpt) {
  const Manifest& m = ckpt.manifest();
  std::string s;
  char line[512];
  s += "checkpoint  " + ckpt.dir() + "\n";
  s += "format      " + std::string(kCheckpointFormat) + " v" + std::to_string(m.version) + "\n";
  s += "step        " + std::to_string(m.step) + "\n";
  s += "world size  " + std::to_string(m.world_size) + "\n";
  s += "trainer state:\n";
  for (const auto& [key, value] : m.trainer_state.items()) {
    std::string v = value.is_string() ? value.get<std::string>() : value.dump();
    while (!v.empty() && v.back() == '\n') v.pop_back();
    const size_t lines = static_cast<size_t>(std::count(v.begin(), v.end(), '\n'));
    if (const size_t nl = v.find('\n'); nl != std::string::npos) v = v.substr(0, nl) + " ...";
    if (v.size() > 100) v = v.substr(0, 97) + "...";
    if (lines > 0) v += " (" + std::to_string(lines + 1) + " lines)";
    std::snprintf(line, sizeof(line), "  %-20s %s\n", key.c_str(), v.c_str());
    s += line;
  }
  int64_t elements = 0, bytes = 0;
  for (const auto& [name, t] : m.tensors) {
    elements += volume(t.shape);
    bytes += volume(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
  }
  std::snprintf(line, sizeof(line), "tensors (%zu, %lld elements, %lld bytes):\n", m.tensors.size(),
                static_cast<long long>(elements), static_cast<long long>(bytes));
  s += line;
  for (const auto& [name, t] : m.tensors) {
    std::snprintf(line, sizeof(line), "  %-48s %-4s %-18s %12lld B  %zu box%s\n", name.c_str(),
                  dtype_name(t.dtype), dims_to_string(t.shape).c_str(),
                  static_cast<long long>(volume(t.shape) * static_cast<int64_t>(dtype_size(t.dtype))),
                  t.boxes.size(),
                  t.boxes.size() == 1 ? "" : "es");
    s += line;
  }
  int64_t file_bytes = 0;
  for (const ManifestFile& f : m.files) file_bytes += f.bytes;
  std::snprintf(line, sizeof(line), "files (%zu, %lld bytes):\n", m.files.size(),
                static_cast<long long>(file_bytes));
  s += line;
  for (const ManifestFile& f : m.files) {
    size_t boxes = 0;
    for (const auto& [name, t] : m.tensors)
      for (const ManifestBox& b : t.boxes) boxes += b.file == f.name;
    std::snprintf(line, sizeof(line), "  %-16s rank %-5d %12lld B  %zu box%s\n", f.name.c_str(),
                  f.rank, static_cast<long long>(f.bytes), boxes, boxes == 1 ? "" : "es");
    s += line;
  }
  return s;
}

}  // namespace trident
