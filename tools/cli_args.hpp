// Command-line parsing for the subcommands, on CLI11 (Debian's libcli11-dev).
//
// Each subcommand declares a CLI::App with its options; parse_args runs it on
// the subcommand's arguments. benchdnn's knob language (`normgrad run
// --case=...`) keeps its own grammar in tools/cli_knobs.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace normgrad {
namespace cli {

// -1: parsed, go on; otherwise the exit code (0 after --help, 2 on a bad command line).
inline int parse_args(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 consumes the vector from the back
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n(" << app.get_name()
              << " --help lists the options)\n";
    return 2;
  }
  return -1;
}

}  // namespace cli
}  // namespace normgrad
