#include "trainer/commands.h"

#include <cstdio>
#include <cstring>

namespace trident {

namespace {
void print_usage() {
  std::fprintf(stderr,
               "usage: trident <command> [options]\n"
               "  train    --config FILE [--set section.key=value ...] [--resume auto|none|DIR]\n"
               "  prepare  --input FILES... --out DIR --tokenizer byte|gpt2\n"
               "  ckpt     inspect|verify DIR\n");
}
}  // namespace

int run_cli(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "train") return cmd_train(args);
  if (command == "prepare") return cmd_prepare(args);
  if (command == "ckpt") return cmd_ckpt(args);
  std::fprintf(stderr, "trident: unknown command '%s'\n", command.c_str());
  print_usage();
  return 2;
}

}  // namespace trident
