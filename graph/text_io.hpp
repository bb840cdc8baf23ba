// The text form of a graph: one op per line, for pass tests and for reading.
//
//   graph input_ports=[0, 1] output_ports=[5]
//   %5:f32[8,64] = ReLUBackward#1 "relu"(%10:f32[8,64], %11:f32[8,64]) {use_dst=true}
//
// A tensor is `%id:dtype[dims]`, then `{strides}` when they are not the
// dense row-major ones, `@any`/`@opaque`/`@undef` for a layout other than
// strided and `!constant`/`!variable`/`!host_scalar` for a property; `?`
// is an unknown dim or stride, `[*]` an unknown rank, `[]` a scalar.
// Attributes print as `name=value`: strings quoted, bools true/false, s64 as
// integers, f32 with an `f` suffix (`1e-05f`), lists in brackets (an empty
// f32 list as `[]f`). The `graph` line is printed only when it says
// something (ports, or a version, engine or fpmath other than the default).
// Printing is stable (ops in
// their order, attributes sorted), and reading gives the same graph back, so
// FileCheck tests may write their input in this form. Lines starting with
// `//` are comments; `// -----` separates the cases of one file
// (split_text_cases).
#pragma once

#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

std::string graph_to_text(const Graph& graph);
// Ops are added (checked against their schemas); the caller finalizes.
// Errors give the line and column: "line 3:17: expected ')'".
StatusOr<Graph> graph_from_text(const std::string& text);

// The cases of a file split at lines that are exactly `// -----`, with the
// number of the line each case starts on.
std::vector<std::pair<int, std::string>> split_text_cases(const std::string& text);

}  // namespace normgrad
