#include "trainer/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace trident {

namespace {

// Lock-free atomics: safe to touch from a handler running on any thread.
std::atomic<int> g_stop{0};
std::atomic<int> g_graceful{0};
static_assert(std::atomic<int>::is_always_lock_free);

// String literals only: a handler may not format or allocate.
const char* startup_message(int signo) {
  switch (signo) {
    case SIGTERM:
      return "trident: SIGTERM during start-up: exiting now (nothing trained yet; the newest "
             "checkpoint is unchanged)\n";
    case SIGINT:
      return "trident: SIGINT during start-up: exiting now (nothing trained yet; the newest "
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
  // exchange: of two signals handled at once on two threads, exactly one is the second.
  if (g_stop.exchange(1) != 0) exit_now(second_signal_message(signo), 128 + signo);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls resume; the flag is read between steps
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

void set_stop_mode_graceful() { g_graceful.store(1); }
bool stop_requested() { return g_stop.load() != 0; }
void request_stop() { g_stop.store(1); }

}  // namespace trident
