// normgrad: the command-line entry point. Dispatches to the subcommands.
#include <cstdlib>
#include <cstring>

#include <unistd.h>
#include <iostream>
#include <string>

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

// The graph tools build a network's graph out of millions of small blocks;
// with 4 KiB pages, first touching them costs more than the compiler's work
// (a 10^5-op graph: about 180,000 page faults, 2 s of its 8). glibc backs its
// heap with transparent huge pages when asked by a tunable, which it reads at
// load time only: so set it and start again, as bench does for OpenMP. Where
// the kernel gives no huge pages, the tunable changes nothing.
void prefer_huge_pages(char** argv) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.hugetlb") != nullptr) return;
  std::string value = "glibc.malloc.hugetlb=1";
  if (tunables != nullptr && *tunables != '\0') value = std::string(tunables) + ":" + value;
  setenv("GLIBC_TUNABLES", value.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
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
  if (command == "opt" || command == "partitions" || command == "dot") prefer_huge_pages(argv);
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
