// normgrad: the command-line entry point. Dispatches to the subcommands.
#include <cstdlib>
#include <cstring>

#include <unistd.h>
#include <iostream>

#include <normgrad/graph/version.hpp>

#include "tools/cli.hpp"
#include "tools/cli_args.hpp"

namespace {

// The usage: every subcommand's synopsis, made from the CLI::App it parses
// with (tools/cli_args.hpp), so the two cannot disagree.
std::string usage() {
  using namespace normgrad::cli;
  describing() = true;
  described() = "usage: normgrad <command> [options]   (normgrad <command> --help for details)\n\n";
  run_command({});
  opt_command({});
  partitions_command({});
  dot_command({});
  fuzz_command({});
  tune_command({});
  bench_command({});
  describing() = false;
  return described() +
         "\nsee docs/cli.md for every option and docs/performance.md for the bench.\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "normgrad " << normgrad::version_string() << "\n";
    return 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "run") return normgrad::cli::run_command(args);
  if (command == "opt") return normgrad::cli::opt_command(args);
  if (command == "partitions") return normgrad::cli::partitions_command(args);
  if (command == "dot") return normgrad::cli::dot_command(args);
  if (command == "fuzz") return normgrad::cli::fuzz_command(args);
  if (command == "tune") return normgrad::cli::tune_command(args);
  if (command == "bench") {
    // oneDNN's OpenMP threads spin after each parallel region and, on a small
    // machine, steal the cores of whatever runs next in the interleaved loop.
    // libgomp reads its policy at load time, so set it and start again.
    if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
      setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
      execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
    }
    return normgrad::cli::bench_command(args);
  }
  std::cerr << "normgrad: unknown command '" << command << "'\n\n" << usage();
  return 2;
}
