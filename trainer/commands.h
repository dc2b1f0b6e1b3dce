// Subcommands of the `trident` executable (DESIGN.md, "The user's surface"). Each
// returns the process exit code: 0 done, 1 failure, 2 bad usage/config/input,
// 3 stopped on a signal after a checkpoint was saved.
#pragma once

#include <string>
#include <vector>

namespace trident {

int run_cli(int argc, char** argv);

int cmd_train(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_ckpt(const std::vector<std::string>& args);

}  // namespace trident
