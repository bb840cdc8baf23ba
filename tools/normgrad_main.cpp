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
    "\n"
    "see docs/cli.md for details.\n";

}  // namespace

int main(int argc, char** argv) {
  using normgrad::cli::Args;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  Args args;
  std::string error;
  if (command == "run") {
    if (!normgrad::cli::parse_args(argc, argv, 2, {"check"},
                                   {"backend", "inputs", "outputs", "iters", "threads", "seed"}, &args, &error)) {
      std::cerr << "normgrad run: " << error << "\n";
      return 2;
    }
    return normgrad::cli::run_command(args);
  }
  std::cerr << "normgrad: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
