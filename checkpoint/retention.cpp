#include "checkpoint/retention.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "checkpoint/durable_io.h"
#include "checkpoint/lineage.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"

namespace trident {

namespace fs = std::filesystem;

namespace {

// "step_<digits><suffix>", e.g. step_20.tmp: names only Trident itself creates.
bool is_step_name_with(const std::string& name, const std::string& suffix) {
  if (!name.ends_with(suffix)) return false;
  return parse_step_dir_name(name.substr(0, name.size() - suffix.size())).has_value();
}

bool is_crash_leftover(const std::string& name) {
  return is_step_name_with(name, ".tmp") || is_step_name_with(name, ".deleting") ||
         name == std::string(kLatestName) + ".tmp" || name.rfind(".trident-probe-", 0) == 0;
}

Status remove_matching(const std::string& root, bool (*match)(const std::string&),
                       std::vector<std::string>* removed) {
  std::error_code ec;
  std::vector<std::string> doomed;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (match(it->path().filename().string())) doomed.push_back(it->path().string());
  }
  for (const std::string& path : doomed) TRIDENT_RETURN_IF_ERROR(remove_tree(path));
  if (!doomed.empty()) TRIDENT_RETURN_IF_ERROR(fsync_dir(root));
  if (removed) removed->insert(removed->end(), doomed.begin(), doomed.end());
  return Status::ok();
}

bool is_deleting(const std::string& name) { return is_step_name_with(name, ".deleting"); }

}  // namespace

Status remove_crash_leftovers(const std::string& root, std::vector<std::string>* removed) {
  return remove_matching(root, is_crash_leftover, removed);
}

Status apply_retention(const std::string& root, const RetentionPolicy& policy,
                       std::vector<std::string>* deleted) {
  // Leftovers of an interrupted earlier deletion.
  TRIDENT_RETURN_IF_ERROR(remove_matching(root, is_deleting, nullptr));
  if (policy.keep_last <= 0) return Status::ok();
  // Manifests only: a run's identity is all that attribution needs; the rank files are
  // checked below for the newest kept step alone.
  const std::vector<StepInfo> steps = scan_steps(root, /*check_files=*/false);  // ascending

  // The run's own checkpoints; one whose run cannot be read is nobody's and stays.
  std::vector<const StepInfo*> own;
  for (const StepInfo& s : steps) {
    if (!policy.run_id || (s.state && s.state->run_id == *policy.run_id)) own.push_back(&s);
  }
  if (static_cast<int>(own.size()) <= policy.keep_last) return Status::ok();

  std::set<int64_t> keep = policy.protect;
  for (size_t i = own.size() - static_cast<size_t>(policy.keep_last); i < own.size(); ++i) {
    keep.insert(own[i]->step);
  }
  std::string problem;
  if (auto latest = read_latest(root, &problem)) keep.insert(latest->step);
  for (auto it = own.rbegin(); it != own.rend(); ++it) {
    const Status& parsed = policy.run_id ? (*it)->status : (*it)->structure;
    if (parsed.is_ok() && check_step_files((*it)->dir).is_ok()) {  // the newest valid one
      keep.insert((*it)->step);
      break;
    }
  }
  bool renamed = false;
  for (const StepInfo* s : own) {
    if (keep.count(s->step)) continue;
    const std::string doomed = s->dir + ".deleting";
    if (::rename(s->dir.c_str(), doomed.c_str()) != 0) {
      return Status::io_error(s->dir + ": rename for deletion failed");
    }
    renamed = true;
    TRIDENT_RETURN_IF_ERROR(remove_tree(doomed));
    if (deleted) deleted->push_back(s->dir);
  }
  if (renamed) TRIDENT_RETURN_IF_ERROR(fsync_dir(root));
  return Status::ok();
}

Status apply_retention(const std::string& root, int keep_last, std::optional<int64_t> protect_step,
                       std::vector<std::string>* deleted) {
  RetentionPolicy policy;
  policy.keep_last = keep_last;
  if (protect_step) policy.protect.insert(*protect_step);
  return apply_retention(root, policy, deleted);
}

}  // namespace trident
