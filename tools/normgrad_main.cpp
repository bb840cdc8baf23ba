// normgrad: the command-line entry point. Dispatches to the subcommands.
#include <cstdlib>
#include <cstring>

#include <unistd.h>
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
    "  opt GRAPH.json [--passes=p1,p2] [--print-after-all] [-o OUT.json]\n"
    "      run passes (default: the compile pipeline) and print the graph\n"
    "  partitions GRAPH.json [--json] [--backend B]\n"
    "      list partitions with their ops, backend, kernel and tensors\n"
    "  dot GRAPH.json [--after-passes]\n"
    "      Graphviz with partitions as clusters, dtype and shape on the edges\n"
    "  bench [--shapes=resnet50|small] [--backends=jit,dnnl,ref] [--dt=f32,bf16,f16]\n"
    "        [--layouts=NCX,NXC] [--fused=none,relu,add] [--threads N] [--iters N] [--cold]\n"
    "        [--json OUT] [--svg OUT]\n"
    "      backends side by side, interleaved, next to an in-run bandwidth roofline\n"
    "\n"
    "see docs/cli.md and docs/performance.md for details.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "run") return normgrad::cli::run_command(args);
  if (command == "opt") return normgrad::cli::opt_command(args);
  if (command == "partitions") return normgrad::cli::partitions_command(args);
  if (command == "dot") return normgrad::cli::dot_command(args);
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
  std::cerr << "normgrad: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
