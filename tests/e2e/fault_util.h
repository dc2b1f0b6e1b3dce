// Helpers for the failure tests (fault_test.cpp): launching `trident` (alone or under
// mpirun) as a background job whose output goes to a log file, watching that log,
// SIGKILLing one rank of the job, and reading losses and parameters back from metrics
// files and checkpoints.
//
// Processes: a Job is started with fork + exec in its own process group; every process
// of the job (mpirun and its ranks) carries the environment variable TRIDENT_TEST_TAG
// with a value unique to the job, which is how a rank's pid is found (/proc/<pid>/environ,
// with OMPI_COMM_WORLD_RANK) and how a job that overruns its deadline is cleaned up
// (only processes carrying the job's tag are ever signalled).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/reader.h"
#include "tests/e2e/cli_util.h"

namespace trident::testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The mpirun prefix used by the CMake mpi tests: shared memory only, more ranks than
// cores allowed, root allowed (CI).
inline std::string mpirun_prefix(int np) {
  return "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np " +
         std::to_string(np) + " ";
}

// The pids of live processes whose environment holds every "KEY=VALUE" in `needles`.
inline std::vector<pid_t> pids_with_env(const std::vector<std::string>& needles) {
  std::vector<pid_t> out;
  for (int pid : testing::live_pids()) {
    const std::string env = read_text("/proc/" + std::to_string(pid) + "/environ");
    if (env.empty()) continue;
    // Entries are NUL-separated; match whole entries.
    std::vector<std::string> entries;
    size_t start = 0;
    while (start < env.size()) {
      size_t nul = env.find('\0', start);
      if (nul == std::string::npos) nul = env.size();
      entries.push_back(env.substr(start, nul - start));
      start = nul + 1;
    }
    bool all = true;
    for (const std::string& n : needles) {
      bool found = false;
      for (const std::string& en : entries) found = found || en == n;
      all = all && found;
    }
    if (all) out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

// One background command (through /bin/sh), stdout and stderr to `log_path`.
class Job {
 public:
  Job(const std::string& command, const std::string& log_path) : log_path_(log_path) {
    static int counter = 0;
    tag_ = std::to_string(getpid()) + "_" + std::to_string(++counter) + "_" +
           std::to_string(Clock::now().time_since_epoch().count());
    const std::string full = "exec env TRIDENT_TEST_TAG=" + tag_ + " " + command;
    started_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      // A test runner started in the background inherits an ignored SIGINT, which would
      // carry over exec and make the job deaf to it; jobs start with default handling.
      signal(SIGINT, SIG_DFL);
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
      execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Job() {
    if (!exit_code_) {
      kill_all(SIGKILL);
      wait_for(std::chrono::seconds(5));
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& tag() const { return tag_; }
  Clock::time_point started() const { return started_; }
  std::string log() const { return read_text(log_path_); }
  bool running() { return !poll().has_value(); }

  // The exit code once the job has ended (128 + signal when killed), else nullopt.
  std::optional<int> poll() {
    if (exit_code_ || pid_ <= 0) return pid_ <= 0 ? std::optional<int>(-1) : exit_code_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      ended_ = Clock::now();
    }
    return exit_code_;
  }
  // Waits up to `limit`; on overrun kills every process of the job and returns nullopt.
  std::optional<int> wait_for(std::chrono::duration<double> limit) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
    while (!poll()) {
      if (Clock::now() >= deadline) {
        kill_all(SIGKILL);
        while (!poll()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return std::nullopt;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_code_;
  }
  Clock::time_point ended() const { return ended_; }

  // The pid of world rank `rank` (a process carrying this job's tag and that rank).
  std::optional<pid_t> rank_pid(int rank) const {
    auto pids = pids_with_env({"TRIDENT_TEST_TAG=" + tag_,
                               "OMPI_COMM_WORLD_RANK=" + std::to_string(rank)});
    if (pids.empty()) return std::nullopt;
    return pids.front();
  }

  // Signals the whole job: its process group and every process carrying its tag.
  void kill_all(int sig) {
    if (pid_ > 0) ::kill(-pid_, sig);
    for (pid_t p : pids_with_env({"TRIDENT_TEST_TAG=" + tag_})) ::kill(p, sig);
  }

 private:
  std::string log_path_;
  std::string tag_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  Clock::time_point started_, ended_;
};

// The per-step losses of a metrics file, by step, as exact decimal text.
inline std::map<int, std::string> losses_by_step(const std::string& metrics_path) {
  std::map<int, std::string> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.contains("loss") || !r.contains("step")) continue;
    out[r["step"].get<int>()] = r["loss"].dump();
  }
  return out;
}

// Every "param/*" tensor of a committed checkpoint (read through the verifying reader).
inline std::map<std::string, std::vector<float>> read_params(const std::string& step_dir,
                                                             std::string* error) {
  std::map<std::string, std::vector<float>> out;
  auto ckpt = open_checkpoint(step_dir);
  if (!ckpt.is_ok()) {
    *error = ckpt.status().message();
    return out;
  }
  for (const auto& [name, t] : ckpt->manifest().tensors) {
    if (name.rfind("param/", 0) != 0) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    Status st = ckpt->read_tensor(name, v.data());
    if (!st.is_ok()) {
      *error = st.message();
      return {};
    }
    out[name.substr(6)] = std::move(v);
  }
  return out;
}

// Bitwise equality of two float vectors.
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Directory names under `root` (not recursive), sorted.
inline std::vector<std::string> dir_entries(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace trident::testing
