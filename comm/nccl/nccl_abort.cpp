#include "comm/nccl/nccl_abort.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace trident {

namespace {

struct Action {
  std::uint64_t id;
  std::string what;
  std::function<void()> abort;
};

// Process-wide by nature: the watchdog aborts every communicator of the process.
struct Registry {
  std::mutex mutex;
  std::vector<Action> actions;  // registration order
  std::uint64_t next_id = 1;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: usable from any thread at exit
  return *r;
}

void write_stderr(const std::string& text) {
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + written, text.size() - written);
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
}

}  // namespace

std::uint64_t register_nccl_abort(std::string what, std::function<void()> abort) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::uint64_t id = r.next_id++;
  r.actions.push_back({id, std::move(what), std::move(abort)});
  return id;
}

void unregister_nccl_abort(std::uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase_if(r.actions, [id](const Action& a) { return a.id == id; });
}

std::size_t registered_nccl_aborts() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.actions.size();
}

NcclAbortOutcome abort_nccl_communicators(std::chrono::milliseconds bound) {
  std::vector<Action> actions;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    actions.swap(r.actions);  // each action runs at most once
  }
  std::reverse(actions.begin(), actions.end());  // newest (children) first
  NcclAbortOutcome outcome;
  for (const Action& a : actions) {
    if (!outcome.names.empty()) outcome.names += ", ";
    outcome.names += a.what;
  }
  // Shared with the helper thread, which may outlive this call when an abort hangs.
  struct Progress {
    std::mutex mutex;
    std::condition_variable done;
    std::size_t finished = 0;
  };
  auto progress = std::make_shared<Progress>();
  const std::size_t total = actions.size();
  std::thread([progress, actions = std::move(actions)] {
    for (const Action& a : actions) {
      a.abort();
      std::lock_guard<std::mutex> lock(progress->mutex);
      ++progress->finished;
      progress->done.notify_all();
    }
  }).detach();
  std::unique_lock<std::mutex> lock(progress->mutex);
  progress->done.wait_for(lock, bound, [&] { return progress->finished == total; });
  outcome.aborted = progress->finished;
  outcome.pending = total - progress->finished;
  return outcome;
}

std::string nccl_abort_summary(const NcclAbortOutcome& outcome, std::chrono::milliseconds bound) {
  const std::size_t total = outcome.aborted + outcome.pending;
  std::string line = "watchdog: ";
  if (outcome.pending == 0) {
    line += "aborted " + std::to_string(total) + " NCCL communicator" + (total == 1 ? "" : "s");
    if (!outcome.names.empty()) line += " (" + outcome.names + ")";
    return line + "; exiting 1";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f s", std::chrono::duration<double>(bound).count());
  return line + std::to_string(outcome.pending) + " of " + std::to_string(total) +
         " NCCL communicators not aborted after " + seconds + " (" + outcome.names +
         "); exiting 1 anyway";
}

void abort_nccl_and_exit(const std::string& message, std::chrono::milliseconds bound) {
  // The message first: if anything below goes wrong, the reason is already on stderr.
  write_stderr(message + "\n");
  const NcclAbortOutcome outcome = abort_nccl_communicators(bound);
  write_stderr(nccl_abort_summary(outcome, bound) + "\n");
  std::_Exit(kWatchdogExitCode);
}

std::function<void(const HangReport&)> nccl_hang_handler(std::chrono::milliseconds bound) {
  return [bound](const HangReport& report) { abort_nccl_and_exit(report.message, bound); };
}

}  // namespace trident
