// The `normgrad` subcommands.
#pragma once

#include <string>
#include <vector>

namespace normgrad {
namespace cli {

// `normgrad run` with its arguments (after the word `run`); returns the exit code.
int run_command(const std::vector<std::string>& argv);
// `normgrad bench`: backends side by side (docs/performance.md).
int bench_command(const std::vector<std::string>& argv);
// `normgrad opt`, `partitions`, `dot` (docs/cli.md).
int opt_command(const std::vector<std::string>& argv);
int partitions_command(const std::vector<std::string>& argv);
int dot_command(const std::vector<std::string>& argv);

}  // namespace cli
}  // namespace normgrad
