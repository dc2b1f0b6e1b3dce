// `trident ckpt inspect|verify DIR`: a thin wrapper over run_ckpt_command
// (checkpoint/cli.h), which holds the logic so checkpoint_tests can exercise it.
// Exit 0 intact, 1 corrupt (naming the file and tensor), 2 bad usage.
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/cli.h"
#include "cli/commands.h"

namespace trident {

int cmd_ckpt(const std::vector<std::string>& args) {
  std::string out, err;
  const int code = run_ckpt_command(args, &out, &err);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  std::fputs(err.c_str(), stderr);
  return code;
}

}  // namespace trident
