// trident: the command-line entry point. Subcommands live in trainer/commands.h.
#include "cli/commands.h"

int main(int argc, char** argv) { return trident::run_cli(argc, argv); }
