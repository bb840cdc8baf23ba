// normgrad: the command-line entry point. Dispatches to the subcommands.
#include <cstring>
#include <iostream>

#include "tools/cli.hpp"

namespace {

const char kUsage[] =
    "usage: normgrad <command> [options]\n"
    "\n"
    "commands:\n"
    "  run GRAPH.json [--backend auto|ref|dnnl|jit] [--inputs DIR] [--outputs DIR]\n"
    "                 [--check] [--iters N] [--threads N] [--seed S]\n"
    "      load, verify, compile and execute a oneDNN-format graph; --check compares\n"
    "      every output with the reference backend (exit 0 only if all pass)\n"
    "  run [--mode=C|P|CP|R] [--dt=DT] [--in-shapes=ID:AxB+...] [--op-attrs=ID:NAME:VAL+...]\n"
    "      [--mb=N] [--reset] --case=GRAPH.json | --batch=FILE\n"
    "      benchdnn's graph-driver knobs and batch files, with its summary line\n"
    "\n"
    "see docs/cli.md for details.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "run")
    return normgrad::cli::run_command(std::vector<std::string>(argv + 2, argv + argc));
  std::cerr << "normgrad: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
