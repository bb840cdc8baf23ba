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

#include <normgrad/backends/backend.hpp>

namespace normgrad {
namespace cli {

// "auto, jit, dnnl, mpi or ref": the backend registry's names, for --help.
inline std::string backend_names_help() {
  const std::vector<std::string>& names = known_backend_names();
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// The top-level usage is made from the same CLI::App each subcommand parses
// with: while describing() is set, parse_args appends the app's synopsis to
// described() instead of parsing, and the subcommand returns at once.
inline bool& describing() {
  static bool on = false;
  return on;
}
inline std::string& described() {
  static std::string text;
  return text;
}

// Greedy wrap of `items` at 96 columns after `lead`, continuation lines
// indented by `indent` spaces.
inline std::string wrap_items(const std::string& lead, const std::vector<std::string>& items,
                              size_t indent) {
  std::string out, row = lead;
  for (const std::string& it : items) {
    if (row.size() > indent && row.size() + 1 + it.size() > 96) {
      out += row + "\n";
      row = std::string(indent, ' ');
    }
    row += (row.size() == indent && !out.empty() ? "" : " ") + it;
  }
  return out + row + "\n";
}

// "  opt [--passes TEXT] [--print-after-all] ... graph" and the description,
// from the app's own options (help left out).
inline std::string synopsis(const CLI::App& app) {
  std::vector<std::string> items;
  for (const CLI::Option* o : app.get_options()) {
    const std::string name = o->get_name(false, true);
    if (name == "-h,--help" || name.empty()) continue;
    if (o->get_positional()) {
      items.push_back(o->get_required() ? o->get_name(true) : "[" + o->get_name(true) + "]");
      continue;
    }
    std::string value;
    if (o->get_expected_min() > 0) {  // takes a value (flags take none)
      const std::string type = o->get_type_name();
      value = " " + (type.empty() ? std::string("VALUE") : type.substr(0, type.find(':')));
    }
    items.push_back("[" + name + value + "]");
  }
  if (app.get_allow_extras()) items.push_back("[knobs...] [GRAPH.json]");
  const std::string name = app.get_name().substr(app.get_name().rfind(' ') + 1);
  std::vector<std::string> words;
  std::string w;
  for (char c : app.get_description() + " ") {
    if (c != ' ') {
      w += c;
    } else if (!w.empty()) {
      words.push_back(w);
      w.clear();
    }
  }
  return wrap_items("  " + name, items, 6) + wrap_items("     ", words, 6);
}

// ", "-joined, for messages.
inline std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : ", ") + items[i];
  return s;
}

// A validator for a comma-separated list whose every item is one of `valid`:
// a bad item fails the parse (exit 2, before any work), naming it and the
// valid values, as CLI11's IsMember does for a single value.
inline CLI::Validator list_of(std::vector<std::string> valid) {
  const std::string names = joined(valid);
  return CLI::Validator(
      [valid, names](std::string& value) -> std::string {
        size_t start = 0, items = 0;
        while (start <= value.size()) {
          const size_t end = std::min(value.find(',', start), value.size());
          const std::string item = value.substr(start, end - start);
          start = end + 1;
          if (item.empty()) continue;
          ++items;
          if (std::find(valid.begin(), valid.end(), item) == valid.end())
            return "'" + item + "' is not one of " + names;
        }
        return items == 0 ? "expected one or more of " + names : std::string();
      },
      "LIST");
}

// -1: parsed, go on; otherwise the exit code (0 after --help, 2 on a bad command line).
inline int parse_args(CLI::App& app, std::vector<std::string> args) {
  if (describing()) {
    described() += synopsis(app);
    return 0;
  }
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
