// The fast graph-JSON reader, and the tensor checks both readers share.
//
// A network's graph is 10^5 ops and a hundred megabytes of JSON; read
// through a document (even one op's at a time) its parse costs more than the
// whole compile. scan_graph_json reads the text straight into ops. It takes
// only what it can read without doubt: well-formed JSON with the keys and
// types oneDNN writes, plain strings (no escapes), values the checks accept.
// At anything else it gives up, and graph_from_json reads the text again with
// the checked reader, whose message says what is wrong and where. So a graph
// it returns is the one the checked reader returns, and every error comes
// from the checked reader. Internal to graph/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

// One tensor's fields as the JSON gives them, before oneDNN's conventions
// (INT64_MIN or -1: unknown) and the checks.
struct TensorFields {
  int64_t id = -1;
  std::string dtype;
  Dims shape;
  std::optional<Dims> stride;
  std::optional<std::string> layout_type, property_type;
};

// The tensor the fields describe, or why not; `where` (its JSON path) is used
// only in messages.
StatusOr<LogicalTensor> finish_tensor(TensorFields f, const std::string& where);

// Reads the ops of `text` into `g` (at most op_limit of them) and the root's
// other members into `root_rest`, a small JSON object for the checked reader.
// False when it meets anything it does not take (then `g` is partly filled).
bool scan_graph_json(const std::string& text, size_t op_limit, Graph* g, std::string* root_rest);

}  // namespace normgrad
