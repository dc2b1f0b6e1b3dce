#include "trainer/signals.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <csignal>

namespace trident {

namespace {

// Lock-free atomics: safe to touch from a handler running on any thread.
std::atomic<int> g_stop{0};
std::atomic<int> g_graceful{0};
std::atomic<int64_t> g_first_ns{0};  // CLOCK_MONOTONIC time of the first stop signal
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

// One request often arrives as several signals within milliseconds: Ctrl-C reaches
// mpirun and every rank of the terminal's process group, and mpirun forwards it again;
// scancel signals the tasks while train.sbatch forwards SIGUSR1. Signals closer than
// this to the first are the same request.
constexpr int64_t kSameRequestNs = 500'000'000;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// String literals only: a handler may not format or allocate.
const char* startup_message(int signo) {
  switch (signo) {
    case SIGTERM:
      return "trident: SIGTERM during start-up: exiting now (nothing trained yet; the newest "
             "checkpoint is unchanged)\n";
    case SIGINT:
      return "trident: SIGINT during start-up: exiting now (nothing trained yet; the newest "
             "checkpoint is unchanged)\n";
    case SIGHUP:
      return "trident: SIGHUP during start-up: exiting now (nothing trained yet; the newest "
             "checkpoint is unchanged)\n";
    default:
      return "trident: SIGUSR1 during start-up: exiting now (nothing trained yet; the newest "
             "checkpoint is unchanged)\n";
  }
}

const char* second_signal_message(int signo) {
  switch (signo) {
    case SIGTERM:
      return "trident: second SIGTERM while a stop was pending: exiting now without saving "
             "(the newest committed checkpoint is unchanged)\n";
    case SIGINT:
      return "trident: second SIGINT while a stop was pending: exiting now without saving "
             "(the newest committed checkpoint is unchanged)\n";
    case SIGHUP:
      return "trident: second SIGHUP while a stop was pending: exiting now without saving "
             "(the newest committed checkpoint is unchanged)\n";
    default:
      return "trident: second SIGUSR1 while a stop was pending: exiting now without saving "
             "(the newest committed checkpoint is unchanged)\n";
  }
}

[[noreturn]] void exit_now(const char* message, int code) {
  size_t n = 0;
  while (message[n] != '\0') ++n;  // strlen is not on every list of async-signal-safe calls
  ssize_t ignored = ::write(STDERR_FILENO, message, n);
  (void)ignored;
  ::_exit(code);
}

extern "C" void on_stop_signal(int signo) {
  if (g_graceful.load() == 0) exit_now(startup_message(signo), 3);
  const int64_t now = monotonic_ns();
  // exchange: of two signals handled at once on two threads, exactly one is the first.
  if (g_stop.exchange(1) == 0) {
    g_first_ns.store(now);
    return;
  }
  const int64_t first = g_first_ns.load();
  if (first != 0 && now - first < kSameRequestNs) return;  // a duplicate of the first
  exit_now(second_signal_message(signo), 128 + signo);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls resume; the flag is read between steps
  sigaction(SIGTERM, &action, nullptr);
  // A shell starts background jobs (`cmd &`) with SIGINT ignored so that Ctrl-C at the
  // terminal spares them, and nohup ignores SIGHUP so that closing the terminal does; keep
  // both that way. Otherwise SIGHUP (a closed terminal, a dropped ssh session) is a stop
  // like SIGTERM rather than its default, death without a save.
  for (int signo : {SIGINT, SIGHUP}) {
    struct sigaction inherited {};
    if (sigaction(signo, nullptr, &inherited) != 0 || inherited.sa_handler != SIG_IGN) {
      sigaction(signo, &action, nullptr);
    }
  }
  sigaction(SIGUSR1, &action, nullptr);
}

void set_stop_mode_graceful() { g_graceful.store(1); }
bool stop_requested() { return g_stop.load() != 0; }
void request_stop() { g_stop.store(1); }

}  // namespace trident
