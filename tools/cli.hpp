// The `normgrad` subcommands and their shared argument parsing.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace normgrad {
namespace cli {

// Parsed `--key value` / `--key=value` options and positional arguments.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  bool has(const std::string& key) const { return options.count(key) != 0; }
  std::string get(const std::string& key, const std::string& fallback = "") const {
    auto it = options.find(key);
    return it == options.end() ? fallback : it->second;
  }
};

// `flags` are options that take no value (e.g. "check").
bool parse_args(int argc, char** argv, int first, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued, Args* args, std::string* error);

int run_command(const Args& args);

}  // namespace cli
}  // namespace normgrad
