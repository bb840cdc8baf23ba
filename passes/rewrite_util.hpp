// Small queries shared by the rewriting passes: whether a tensor is a graph
// output, and a tensor's only reader. Edits go through Graph's rewriter API
// (erase_op, insert_op, replace_op, replace_all_uses_with).
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {

// True when output_ports are given and list `tensor_id`.
bool is_output_port(const Graph& graph, int64_t tensor_id);
// True when `tensor_id` must stay observable: an explicit output port, or (with no
// explicit ports) a tensor no op consumes.
bool is_graph_output(const Graph& graph, int64_t tensor_id);
// The only consumer op of `tensor_id`, or nullptr when there are none or several.
const Op* sole_consumer(const Graph& graph, int64_t tensor_id);

}  // namespace normgrad
