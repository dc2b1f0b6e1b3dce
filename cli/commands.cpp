#include "cli/commands.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

namespace trident {

namespace {
void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: trident <command> [options]\n"
               "  train    --config FILE [--set section.key=value ...] [--resume auto|none|DIR]\n"
               "           train a model (exit 3: stopped by a signal)\n"
               "  plan     --config FILE --devices N [--gpu NAME] [--gpus-per-node K] [--json]\n"
               "           memory, communication and time of every layout; the recommended one\n"
               "  prepare  --input FILES... --out DIR --tokenizer byte|gpt2\n"
               "           [--val-fraction F] [--shard-tokens N]\n"
               "           tokenize text into token files\n"
               "  ckpt     inspect|verify DIR\n"
               "           show or check a checkpoint\n"
               "  export   --checkpoint DIR --format safetensors --out DIR\n"
               "           write a checkpoint as a Hugging Face model directory\n"
               "  generate --checkpoint DIR --prompt TEXT [--max-new-tokens N]\n"
               "           [--temperature T] [--top-k K] [--seed S]\n"
               "           continue a prompt with a trained model\n"
               "`trident <command> --help` describes a command.\n");
}
}  // namespace

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::bad_alloc& e) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "trident: out of memory (std::bad_alloc: %s): the model, batch or data does "
                 "not fit in this process's memory\n",
                 e.what());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "trident: internal error: %s\n", e.what());
  } catch (...) {
    std::fflush(stdout);
    std::fprintf(stderr, "trident: internal error: unknown exception\n");
  }
  return 1;
}

int run_cli(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage(stdout);
    return 0;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  return run_guarded([&] {
    if (command == "train") return cmd_train(args);
    if (command == "plan") return cmd_plan(args);
    if (command == "prepare") return cmd_prepare(args);
    if (command == "ckpt") return cmd_ckpt(args);
    if (command == "export") return cmd_export(args);
    if (command == "generate") return cmd_generate(args);
    std::fprintf(stderr, "trident: unknown command '%s'\n", command.c_str());
    print_usage(stderr);
    return 2;
  });
}

}  // namespace trident
