#include "checkpoint/retention.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"

namespace trident {

namespace fs = std::filesystem;

namespace {

std::optional<int64_t> latest_step(const std::string& root) {
  std::string text;
  if (!read_whole_file(root + "/" + kLatestName, &text).is_ok()) return std::nullopt;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return parse_step_dir_name(text);
}

}  // namespace

Status remove_crash_leftovers(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> doomed;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(".tmp") || name.ends_with(".deleting")) doomed.push_back(it->path().string());
  }
  for (const std::string& path : doomed) TRIDENT_RETURN_IF_ERROR(remove_tree(path));
  if (!doomed.empty()) TRIDENT_RETURN_IF_ERROR(fsync_dir(root));
  return Status::ok();
}

Status apply_retention(const std::string& root, int keep_last, std::optional<int64_t> protect_step,
                       std::vector<std::string>* deleted) {
  // Leftovers of an interrupted earlier deletion.
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().ends_with(".deleting")) {
      TRIDENT_RETURN_IF_ERROR(remove_tree(it->path().string()));
    }
  }
  if (keep_last <= 0) return Status::ok();
  const auto steps = list_steps(root);  // ascending
  if (static_cast<int>(steps.size()) <= keep_last) return Status::ok();

  std::set<int64_t> keep;
  for (size_t i = steps.size() - static_cast<size_t>(keep_last); i < steps.size(); ++i) {
    keep.insert(steps[i].first);
  }
  if (auto latest = latest_step(root)) keep.insert(*latest);
  if (protect_step) {
    keep.insert(*protect_step);
  } else {
    Result<std::string> newest = find_latest_valid(root, nullptr, VerifyLevel::kCheap);
    if (newest.is_ok()) {
      if (auto s = parse_step_dir_name(fs::path(newest.value()).filename().string())) keep.insert(*s);
    }
  }
  bool renamed = false;
  for (const auto& [step, path] : steps) {
    if (keep.count(step)) continue;
    const std::string doomed = path + ".deleting";
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      return Status::io_error(path + ": rename for deletion failed");
    }
    renamed = true;
    TRIDENT_RETURN_IF_ERROR(remove_tree(doomed));
    if (deleted) deleted->push_back(path);
  }
  if (renamed) TRIDENT_RETURN_IF_ERROR(fsync_dir(root));
  return Status::ok();
}

}  // namespace trident
