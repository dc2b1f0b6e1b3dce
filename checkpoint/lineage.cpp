#include "checkpoint/lineage.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"

namespace trident {

namespace fs = std::filesystem;

namespace {

std::string describe_run(const StepInfo& s) {
  if (!s.state) return "unreadable";
  return s.state->run_id.empty() ? "a run without lineage (trainer state version 1)"
                                 : "run " + s.state->run_id;
}

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

}  // namespace

Status check_step_files(const std::string& step_dir) {
  TRIDENT_ASSIGN_OR_RETURN(Checkpoint ckpt, open_checkpoint(step_dir));
  return ckpt.check_files();
}

std::vector<StepInfo> scan_steps(const std::string& root, bool check_files) {
  std::vector<StepInfo> out;
  for (const auto& [step, dir] : list_steps(root)) {
    StepInfo info;
    info.step = step;
    info.dir = dir;
    Result<Checkpoint> ckpt = open_checkpoint(dir);
    if (!ckpt.is_ok()) {
      info.structure = info.status = ckpt.status();
    } else if (ckpt->step() != step) {
      info.structure = info.status =
          Status::corrupt(dir + ": manifest says step " + std::to_string(ckpt->step()));
    } else {
      if (check_files) info.structure = ckpt->check_files();
      auto state = parse_train_state(ckpt->trainer_state(), ckpt->step(),
                                     ckpt->manifest().world_size, dir + "/" + kManifestName);
      if (state.is_ok()) {
        info.state = std::move(state).value();
        info.status = info.structure;
      } else {
        info.status = state.status();
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<TrainState> verify_training_checkpoint(const std::string& step_dir) {
  TRIDENT_ASSIGN_OR_RETURN(Checkpoint ckpt, open_checkpoint(step_dir));
  TRIDENT_ASSIGN_OR_RETURN(TrainState state,
                           parse_train_state(ckpt.trainer_state(), ckpt.step(),
                                             ckpt.manifest().world_size,
                                             step_dir + "/" + kManifestName));
  TRIDENT_RETURN_IF_ERROR(ckpt.verify_all());
  return state;
}

Result<ResumeChoice> choose_auto_resume(const std::string& root) {
  ResumeChoice choice;
  const std::vector<StepInfo> steps = scan_steps(root);
  std::string problem;
  const std::optional<LatestPointer> latest = read_latest(root, &problem);
  if (!problem.empty()) choice.warnings.push_back("ignoring " + problem);
  if (steps.empty()) {
    if (latest) {
      choice.warnings.push_back(root + "/latest names " + step_dir_name(latest->step) +
                                ", but there is no checkpoint; starting from scratch");
    }
    return choice;
  }

  // The candidates, in order of preference.
  std::vector<const StepInfo*> candidates;
  std::vector<std::string> reasons;  // why each rejected checkpoint was rejected
  if (latest) {
    const StepInfo* head = nullptr;
    for (const StepInfo& s : steps) {
      if (s.step == latest->step) head = &s;
    }
    std::string lineage = latest->run_id;
    if (lineage.empty() && head && head->state) lineage = head->state->run_id;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const StepInfo& s = *it;
      if (s.step <= latest->step) break;
      if (!latest->uid.empty() && s.state && s.state->descends_from(latest->uid)) {
        candidates.push_back(&s);  // committed, but `latest` was not updated after it
      } else {
        choice.warnings.push_back("ignoring " + s.dir + " (" + describe_run(s) +
                                  "): newer than " + root + "/latest (" +
                                  step_dir_name(latest->step) + ") but does not continue it");
      }
    }
    if (head == nullptr) {
      reasons.push_back(root + "/latest names " + step_dir_name(latest->step) +
                        ", which does not exist");
    } else if (!latest->uid.empty() && head->state && head->state->checkpoint_uid != latest->uid) {
      reasons.push_back(head->dir + ": holds checkpoint " + head->state->checkpoint_uid +
                        ", not " + latest->uid + " that latest names");
    } else {
      candidates.push_back(head);
    }
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const StepInfo& s = *it;
      if (s.step >= latest->step) continue;
      if (s.state && s.state->run_id == lineage) {
        candidates.push_back(&s);
      } else if (s.state) {
        choice.warnings.push_back("ignoring " + s.dir + ": a checkpoint of " + describe_run(s) +
                                  ", not of the run latest names");
      } else {
        reasons.push_back(s.dir + ": " + s.status.message());
      }
    }
  } else {
    // No `latest` (written by a crash before the first update, or by hand): acceptable
    // only when every readable checkpoint belongs to one run.
    std::set<std::string> runs;
    for (const StepInfo& s : steps) {
      if (s.state) runs.insert(s.state->run_id);
    }
    if (runs.size() > 1) {
      std::string list;
      for (const StepInfo& s : steps) list += "\n  " + s.dir + ": " + describe_run(s);
      return Status::invalid_input(root + ": holds checkpoints of " + std::to_string(runs.size()) +
                                   " different runs and no readable `latest`, so --resume auto "
                                   "cannot tell which run to continue; resume one explicitly "
                                   "with --resume DIR/step_<N>:" + list);
    }
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) candidates.push_back(&*it);
  }

  for (const StepInfo* c : candidates) {
    Status st = c->status;
    if (st.is_ok()) st = verify_training_checkpoint(c->dir).status();
    if (st.is_ok()) {
      for (const std::string& r : reasons) choice.warnings.push_back("skipping checkpoint " + r);
      choice.dir = c->dir;
      return choice;
    }
    reasons.push_back(st.message().rfind(c->dir, 0) == 0 ? st.message()
                                                          : c->dir + ": " + st.message());
  }
  std::string message = root + ": no valid checkpoint to continue, and " +
                        std::to_string(steps.size()) +
                        " step directories exist; refusing to start from scratch over them "
                        "(fix or remove them, or use another checkpoint.dir):";
  for (const std::string& r : reasons) message += "\n  " + r;
  for (const std::string& w : choice.warnings) message += "\n  " + w;
  return Status::invalid_input(message);
}

Status check_fresh_start(const std::string& root) {
  const std::vector<StepInfo> steps = scan_steps(root);
  if (steps.empty()) return Status::ok();
  std::string list;
  for (const StepInfo& s : steps) {
    list += ' ';
    list += fs::path(s.dir).filename().string();
  }
  std::string run;
  if (steps.back().state) run = " (" + describe_run(steps.back()) + ")";
  return Status::invalid_config(
      "--resume none: checkpoint.dir " + root + " already holds checkpoints" + run + ":" + list +
      ". Starting a second run there would mix two runs in one directory. Continue it with "
      "--resume auto, use another checkpoint.dir, or remove the old checkpoints first");
}

Status prepare_continuation(const std::string& root, const std::string& from_dir,
                            const TrainState& from, std::vector<std::string>* moved) {
  const bool inside = same_directory(fs::path(from_dir).parent_path().string(), root);
  const std::vector<StepInfo> steps = scan_steps(root);
  if (!inside) {
    for (const StepInfo& s : steps) {
      if (s.state && s.state->run_id != from.run_id) {
        return Status::invalid_config(
            "checkpoint.dir " + root + " holds checkpoints of another run (" + s.dir + ": " +
            describe_run(s) + "); continuing " + from_dir + " there would mix two runs in one "
            "directory: use an empty checkpoint.dir");
      }
    }
  }
  bool renamed = false;
  for (const StepInfo& s : steps) {
    if (s.step <= from.step) continue;
    std::string target = s.dir + ".abandoned";
    std::error_code ec;
    for (int k = 2; fs::exists(target, ec); ++k) target = s.dir + ".abandoned." + std::to_string(k);
    if (::rename(s.dir.c_str(), target.c_str()) != 0) {
      return Status::io_error(s.dir + ": cannot set it aside as " + target);
    }
    renamed = true;
    if (moved) moved->push_back(target);
  }
  if (renamed) TRIDENT_RETURN_IF_ERROR(fsync_dir(root));
  if (inside) {
    TRIDENT_RETURN_IF_ERROR(write_file_atomic(root + "/" + kLatestName,
                                              latest_text(from.step, from.run_id, from.checkpoint_uid)));
  }
  return Status::ok();
}

}  // namespace trident
