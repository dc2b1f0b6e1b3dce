// Subcommands of the `trident` executable (docs/ARCHITECTURE.md "Commands and exit codes"). Each
// returns the process exit code: 0 done, 1 failure, 2 bad usage/config/input,
// 3 stopped on a signal (after a checkpoint was saved, or during start-up).
// Every subcommand answers --help / -h with its usage on stdout and exit 0.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace trident {

// Dispatches argv[1] to a subcommand, under run_guarded.
int run_cli(int argc, char** argv);

// Runs `body` and returns its exit code; an exception that escapes it becomes exit 1 with
// a message on stderr instead of std::terminate's abort and core dump:
//   std::bad_alloc:   "trident: out of memory (std::bad_alloc): ..."
//   std::exception:   "trident: internal error: <what()>"
//   anything else:    "trident: internal error: unknown exception"
// Only the calling thread is covered: an exception on another thread still terminates.
int run_guarded(const std::function<int()>& body);

int cmd_train(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_ckpt(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);

}  // namespace trident
