// Small helpers shared by the rewriting passes: finding ops by id, renaming
// tensor ids across the graph, and whether a tensor is an explicit graph output.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {

// The ops of `graph` whose ids are not in `removed`, in order.
std::vector<Op> without_ops(const Graph& graph, const std::set<int64_t>& removed);
// Every input reading tensor `from` reads `to` instead (metadata taken from `to_desc`).
void rename_uses(std::vector<Op>& ops, int64_t from, const LogicalTensor& to_desc);
// True when output_ports are given and list `tensor_id`.
bool is_output_port(const Graph& graph, int64_t tensor_id);
// True when `tensor_id` must stay observable: an explicit output port, or (with no
// explicit ports) a tensor no op consumes.
bool is_graph_output(const Graph& graph, int64_t tensor_id);
// The only consumer op of `tensor_id`, or nullptr when there are none or several.
const Op* sole_consumer(const Graph& graph, int64_t tensor_id);

}  // namespace normgrad
