// Helpers for end-to-end tests that compare training runs through their checkpoints and
// metrics files: read every tensor of a committed step directory, the per-step losses
// of a metrics file (as exact decimal strings), a relative distance between tensor sets,
// and the pids of a running job found by a unique string in their command lines.
//
// Failures are reported as values the caller asserts on (an error string, an empty
// result); nothing here aborts.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/cli_util.h"

#include "checkpoint/reader.h"

namespace trident::testing {

using TensorMap = std::map<std::string, std::vector<float>>;  // global name -> values

// `trident train --config CONFIG` (OMP threads passive), then a step directory under its
// checkpoint root `ckpt_root`; "" with *error set when training fails or wrote none.
inline std::string train_to_step(const std::string& config, const std::string& ckpt_root,
                                 std::string* error) {
  const CommandResult train =
      run_command("OMP_WAIT_POLICY=passive " + trident_binary() + " train --config " + config);
  if (train.exit_code != 0) {
    *error = train.output;
    return "";
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ckpt_root, ec)) {
    if (e.path().filename().string().rfind("step_", 0) == 0) return e.path().string();
  }
  *error = "no step directory in " + ckpt_root;
  return "";
}

// Every tensor of the checkpoint in step_dir (full global shapes, row-major). On failure
// returns an empty map and sets *error.
inline TensorMap read_all_tensors(const std::string& step_dir, std::string* error) {
  TensorMap out;
  auto ckpt = open_checkpoint(step_dir);
  if (!ckpt.is_ok()) {
    *error = ckpt.status().message();
    return {};
  }
  for (const auto& [name, tensor] : ckpt.value().manifest().tensors) {
    int64_t n = 1;
    for (int64_t d : tensor.shape) n *= d;
    std::vector<float>& values = out[name];
    values.resize(static_cast<size_t>(n));
    Status st = ckpt.value().read_tensor(name, values.data());
    if (!st.is_ok()) {
      *error = st.message();
      return {};
    }
  }
  return out;
}

// The trainer_state stored in step_dir's manifest (null when it cannot be opened).
inline nlohmann::json checkpoint_trainer_state(const std::string& step_dir) {
  auto ckpt = open_checkpoint(step_dir);
  return ckpt.is_ok() ? ckpt.value().trainer_state() : nlohmann::json();
}

// step -> loss of every per-step record in a metrics file, the loss as its JSON text
// (the writer prints full double precision, so equal text means equal bits).
inline std::map<int, std::string> metrics_losses(const std::string& path) {
  std::map<int, std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("loss")) out[j["step"].get<int>()] = j["loss"].dump();
  }
  return out;
}

// Number of per-step records in a metrics file written so far (0 when missing).
inline int metrics_steps_written(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '}' && line.find("\"loss\"") != std::string::npos) ++n;
  }
  return n;
}

// True when a and b hold exactly the same bits.
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ||a - b|| / ||b|| over one tensor.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Pids of live processes whose executable name (comm) is `comm` and whose command line
// contains `needle` (e.g. a run's unique checkpoint directory).
inline std::vector<int> find_processes(const std::string& comm, const std::string& needle) {
  std::vector<int> pids;
  for (int pid : live_pids()) {
    const std::string base = "/proc/" + std::to_string(pid);
    std::string name;
    std::getline(std::ifstream(base + "/comm"), name);
    if (name != comm) continue;
    std::ifstream cmd(base + "/cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find(needle) != std::string::npos) pids.push_back(pid);
  }
  return pids;
}

}  // namespace trident::testing
