// Helpers for tests that run the trident binary: a scratch directory, a command runner
// that captures output and exit code, and a small English token corpus.
#pragma once

#include <dirent.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "tests/common/scratch_dir.h"
#include "tests/model/tiny_config.h"

namespace trident::testing {

// The model: line of the command-line runs: a gpt2 over byte tokens small enough that a
// step takes milliseconds, so a run is start-up and checkpoint fsyncs.
inline std::string cli_model_yaml() {
  return tiny_model_yaml(Arch::kGpt2, {.seq_len = 16, .n_heads = 2, .d_model = 32});
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The pids of every live process (numeric entries of /proc).
inline std::vector<int> live_pids() {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  if (!proc) return pids;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid > 0 && *end == '\0') pids.push_back(static_cast<int>(pid));
  }
  closedir(proc);
  return pids;
}

inline std::string trident_binary() { return std::string(TRIDENT_BINARY_DIR) + "/trident"; }


// Byte tokens of repeated English sentences: structured enough that a small model's
// loss falls quickly, and fixed so runs are comparable.
inline std::vector<uint32_t> english_bytes(size_t min_tokens) {
  static const char* kText =
      "It is a truth universally acknowledged, that a single man in possession of a good "
      "fortune, must be in want of a wife. However little known the feelings or views of "
      "such a man may be on his first entering a neighbourhood, this truth is so well fixed "
      "in the minds of the surrounding families, that he is considered the rightful property "
      "of some one or other of their daughters. ";
  std::vector<uint32_t> tokens;
  while (tokens.size() < min_tokens) {
    for (const char* p = kText; *p; ++p) tokens.push_back(static_cast<unsigned char>(*p));
  }
  return tokens;
}

}  // namespace trident::testing
