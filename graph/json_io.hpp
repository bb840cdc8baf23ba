// Loading and saving graphs in oneDNN's graph JSON format.
//
// The format is the one benchdnn's graph driver reads and oneDNN's graph dump
// writes. The reader accepts the writer's quirks (bools as 0/1, unknown dims as
// INT64_MIN, fpmath_mode_apply_to_int as a string or bool, any key order) and
// rejects anything else with the JSON location of the problem, e.g.
//   graph[0].inputs[3].shape: expected an array of integers
// Nesting depth and text size are limited before the parser runs. A fast
// reader takes the text straight into ops; where it meets anything it does
// not take, the checked reader reads the text again, converting ops one by
// one as its parser meets them, and says what is wrong.
#pragma once

#include <string>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

struct JsonLimits {
  size_t max_bytes = size_t{512} << 20;  // 512 MiB of text (10^5 ops take 100-140 MiB)
  int max_depth = 32;                    // oneDNN's graphs nest 5 levels deep
  size_t max_ops = 1000000;
  // Read with the fast reader first (the checked one only where it gives up);
  // false reads with the checked reader alone. Both give the same graphs and
  // the same errors: the switch is there to test that.
  bool fast_reader = true;
};

// Parses JSON text into a graph whose ops have been added (checked against their
// schemas); the caller decides when to finalize (after benchdnn-style rewrites).
StatusOr<Graph> graph_from_json(const std::string& text, const JsonLimits& limits = {});
StatusOr<Graph> load_graph(const std::string& path, const JsonLimits& limits = {});

// Writes what oneDNN reads: 2-space indented, keys in oneDNN's order.
std::string graph_to_json(const Graph& graph);
Status save_graph(const Graph& graph, const std::string& path);

// Reads a whole file, refusing files larger than max_bytes.
StatusOr<std::string> read_text_file(const std::string& path, size_t max_bytes);

}  // namespace normgrad
