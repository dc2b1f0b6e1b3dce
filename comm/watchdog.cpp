#include "comm/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "core/check.h"

namespace trident {

namespace {

// Longer timeouts are treated as this, so deadline arithmetic cannot overflow.
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 365)};

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", s);
  return text;
}

// The default on_hang: the line, then exit without running anything that might need the
// blocked thread's locks (stdio, MPI, destructors).
[[noreturn]] void report_and_exit(const HangReport& report) {
  const std::string line = report.message + "\n";
  std::size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  std::_Exit(kWatchdogExitCode);
}

}  // namespace

Watchdog::Watchdog(WatchdogOptions options) : options_(std::move(options)) {
  TRIDENT_CHECK_MSG(call_observer() == nullptr,
                    "a Watchdog (or another CallObserver) is already installed; one per process");
  TRIDENT_CHECK_MSG(options_.poll_interval.count() > 0, "watchdog poll_interval must be > 0");
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  host_ = host;
  thread_ = std::thread([this] { run(); });
  set_call_observer(this);
}

Watchdog::~Watchdog() {
  set_call_observer(nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

std::uint64_t Watchdog::call_started(const Communicator& comm, const char* call, int peer,
                                     const CollectiveOptions& opts) {
  Entry entry;
  entry.report.call = call;
  entry.report.label = opts.label;
  entry.report.group = comm.name();
  entry.report.group_rank = comm.rank();
  entry.report.group_size = comm.size();
  entry.report.peer = peer;
  entry.comm = &comm;
  const std::chrono::milliseconds timeout = std::min(comm.effective_timeout(opts), kMaxTimeout);
  entry.report.timeout_s = std::chrono::duration<double>(timeout).count();
  entry.started = Clock::now();
  entry.deadline = entry.started + timeout;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t token = next_token_++;
  calls_.emplace(token, std::move(entry));
  return token;
}

void Watchdog::learn_hosts(Communicator& world) {
  // HOST_NAME_MAX is 64 on Linux; one more byte keeps the name terminated.
  constexpr std::size_t kName = 65;
  std::vector<char> mine(kName, '\0'), all(kName * static_cast<std::size_t>(world.size()));
  std::memcpy(mine.data(), host_.data(), std::min(host_.size(), kName - 1));
  world.all_gather(CommBuf::host(std::as_writable_bytes(std::span(mine))),
                   CommBuf::host(std::as_writable_bytes(std::span(all))),
                   {.label = "host names"});
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) hosts.emplace_back(all.data() + r * kName);
  set_hosts(std::move(hosts));
}

void Watchdog::set_hosts(std::vector<std::string> hosts_by_world_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  hosts_ = std::move(hosts_by_world_rank);
}

std::vector<std::string> Watchdog::hosts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hosts_;
}

void Watchdog::call_ended(std::uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.erase(token);
}

HangReport Watchdog::make_report(const Entry& entry, Clock::time_point now) const {
  HangReport report = entry.report;
  report.world_rank = process_identity().rank;
  report.waited_s = std::chrono::duration<double>(now - entry.started).count();
  report.step = step_.load(std::memory_order_relaxed);
  // Where the other side is: the members' world ranks from the communicator, their hosts
  // from learn_hosts (hosts_ is read under mutex_, which run() holds here).
  const std::vector<int> members = entry.comm ? entry.comm->world_ranks() : std::vector<int>{};
  auto host_of = [&](int world_rank) -> std::string {
    return world_rank >= 0 && static_cast<std::size_t>(world_rank) < hosts_.size()
               ? hosts_[static_cast<std::size_t>(world_rank)]
               : std::string();
  };
  if (members.size() == static_cast<std::size_t>(report.group_size)) {
    if (report.peer >= 0 && report.peer < report.group_size) {
      report.peer_world_rank = members[static_cast<std::size_t>(report.peer)];
      report.peer_host = host_of(report.peer_world_rank);
    }
    for (int w : members) {
      const std::string h = host_of(w);
      if (!h.empty() && std::find(report.group_hosts.begin(), report.group_hosts.end(), h) ==
                            report.group_hosts.end()) {
        report.group_hosts.push_back(h);
      }
    }
  }
  std::string m = "[rank " + std::to_string(report.world_rank) + " on " + host_ +
                  "] watchdog: " + report.call;
  if (!report.label.empty()) m += " '" + report.label + "'";
  if (report.peer >= 0) {
    m += (report.call == "recv"        ? " from rank "
          : report.call == "batch_p2p" ? " with rank "
                                       : " to rank ") +
         std::to_string(report.peer);
  }
  m += " in group '" + report.group + "' (rank " + std::to_string(report.group_rank) + "/" +
       std::to_string(report.group_size) + ") has not completed after " +
       seconds(report.waited_s) + " (timeout " + seconds(report.timeout_s) + ") ";
  m += report.step >= 0 ? "at step " + std::to_string(report.step) : "before the first step";
  if (report.peer_world_rank >= 0) {
    m += "; rank " + std::to_string(report.peer) + " is world rank " +
         std::to_string(report.peer_world_rank);
    if (!report.peer_host.empty()) m += " on host " + report.peer_host;
  } else if (!report.group_hosts.empty()) {
    // At most 8 names: a line per hung rank must stay readable on a big job.
    constexpr std::size_t kMaxHosts = 8;
    m += report.group_hosts.size() > 1 ? "; the group's ranks are on hosts "
                                        : "; the group's ranks are on host ";
    for (std::size_t i = 0; i < std::min(report.group_hosts.size(), kMaxHosts); ++i) {
      m += (i ? ", " : "") + report.group_hosts[i];
    }
    if (report.group_hosts.size() > kMaxHosts) {
      m += " and " + std::to_string(report.group_hosts.size() - kMaxHosts) + " more";
    }
  }
  m += "; a peer of this group is hung, dead or in a different call; aborting";
  report.message = std::move(m);
  return report;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point wake_at = now + options_.poll_interval;
    std::vector<HangReport> due;  // oldest call first (tokens grow with time)
    for (auto& [token, entry] : calls_) {
      if (entry.reported) continue;
      if (entry.deadline <= now) {
        entry.reported = true;
        due.push_back(make_report(entry, now));
      } else {
        wake_at = std::min(wake_at, entry.deadline);
      }
    }
    if (!due.empty()) {
      lock.unlock();  // on_hang may take its time; the calls must still be able to end
      for (const HangReport& report : due) {
        if (!options_.on_hang) report_and_exit(report);
        options_.on_hang(report);
      }
      lock.lock();
      continue;
    }
    wake_.wait_until(lock, wake_at, [this] { return stopping_; });
  }
}

}  // namespace trident
