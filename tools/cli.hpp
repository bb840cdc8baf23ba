// The `normgrad` subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {
namespace cli {

// A graph file, oneDNN JSON or the text form (told apart by the first
// character that is not a comment), loaded and not finalized.
StatusOr<Graph> load_graph_file(const std::string& path);
// The same for a file's text.
StatusOr<Graph> parse_graph(const std::string& text);

// `normgrad run` with its arguments (after the word `run`); returns the exit code.
int run_command(const std::vector<std::string>& argv);
// `normgrad bench`: backends side by side (docs/performance.md).
int bench_command(const std::vector<std::string>& argv);
// `normgrad bench --compile`: the compiler's cost per op on generated graphs
// of each size in `sizes` and each shape (chain, ladder, fan-out, folds,
// resnet), or on the graph file `graph_path` when it is not empty.
int bench_compile(const std::vector<int64_t>& sizes, const std::vector<std::string>& shapes,
                  const std::string& graph_path, const std::string& json_out);
// `normgrad opt`, `partitions`, `dot` (docs/cli.md).
int opt_command(const std::vector<std::string>& argv);
int partitions_command(const std::vector<std::string>& argv);
int dot_command(const std::vector<std::string>& argv);
// `normgrad fuzz`: random graphs on every backend against ref (cli_fuzz.cpp).
int fuzz_command(const std::vector<std::string>& argv);
// `normgrad tune`: the JIT's variants timed per shape class, the winners
// cached for this host (cli_tune.cpp).
int tune_command(const std::vector<std::string>& argv);

}  // namespace cli
}  // namespace normgrad
