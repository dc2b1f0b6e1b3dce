// trident: the command-line entry point. Subcommands live in cli/commands.h.
#include "cli/commands.h"

int main(int argc, char** argv) { return trident::run_cli(argc, argv); }
