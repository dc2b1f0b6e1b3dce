#include "checkpoint/cli.h"

#include <filesystem>

#include "checkpoint/reader.h"
#include "checkpoint/train_state.h"

namespace trident {

namespace fs = std::filesystem;

int run_ckpt_command(const std::vector<std::string>& args, std::string* out, std::string* err) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    *out += kCkptUsage;
    return 0;
  }
  if (args.size() != 2 || (args[0] != "inspect" && args[0] != "verify")) {
    *err += "trident ckpt: expected 'inspect DIR' or 'verify DIR'\n";
    *err += kCkptUsage;
    return 2;
  }
  const std::string& action = args[0];
  std::string note;
  Result<std::string> step_dir = resolve_step_dir(args[1], &note);
  if (!step_dir.is_ok()) {
    *err += "trident ckpt " + action + ": " + step_dir.status().message() + "\n";
    return step_dir.status().exit_code();
  }
  if (!note.empty()) *err += "trident ckpt " + action + ": note: " + note + "\n";

  Result<Checkpoint> ckpt = open_checkpoint(step_dir.value());
  if (!ckpt.is_ok()) {
    *err += "trident ckpt " + action + ": " + ckpt.status().message() + "\n";
    return ckpt.status().exit_code() == 0 ? 1 : ckpt.status().exit_code();
  }
  if (action == "inspect") {
    *out += inspect_checkpoint(ckpt.value());
    if (step_dir.value() != args[1]) {  // a root: list its steps too
      *out += "steps under " + args[1] + ":";
      for (const auto& [step, path] : list_steps(args[1])) {
        out->push_back(' ');
        *out += fs::path(path).filename().string();
      }
      *out += "\n";
    }
    Status files = ckpt->check_files();
    if (!files.is_ok()) {
      *err += "trident ckpt inspect: " + files.message() + "\n";
      return 1;
    }
    return 0;
  }
  Status st = ckpt->verify_all();
  if (st.is_ok()) {
    // The trainer state too: resume rejects a checkpoint whose state is incomplete or
    // impossible, so verify must not call it intact.
    st = parse_train_state(ckpt->trainer_state(), ckpt->step(), ckpt->manifest().world_size,
                           step_dir.value() + "/" + kManifestName)
             .status();
  }
  if (!st.is_ok()) {
    *err += "trident ckpt verify: " + st.message() + "\n";
    return 1;
  }
  const Manifest& m = ckpt->manifest();
  size_t boxes = 0;
  for (const auto& [name, t] : m.tensors) boxes += t.boxes.size();
  *out += "OK " + step_dir.value() + ": step " + std::to_string(m.step) + ", " +
          std::to_string(m.tensors.size()) + " tensors, " + std::to_string(boxes) + " boxes in " +
          std::to_string(m.files.size()) + " files, " + std::to_string(m.total_payload_bytes()) +
          " bytes verified\n";
  return 0;
}

}  // namespace trident
