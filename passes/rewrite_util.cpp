// Rewrite helpers for the passes.
#include <normgrad/passes/rewrite_util.hpp>

#include <algorithm>

namespace normgrad {

std::vector<Op> without_ops(const Graph& graph, const std::set<int64_t>& removed) {
  std::vector<Op> ops;
  for (const Op& op : graph.ops()) {
    if (!removed.count(op.id())) ops.push_back(op);
  }
  return ops;
}

void rename_uses(std::vector<Op>& ops, int64_t from, const LogicalTensor& to_desc) {
  for (Op& op : ops) {
    for (LogicalTensor& lt : op.mutable_inputs()) {
      if (lt.id == from) lt = to_desc;
    }
  }
}

bool is_output_port(const Graph& graph, int64_t tensor_id) {
  if (!graph.output_ports()) return false;
  const auto& ports = *graph.output_ports();
  return std::find(ports.begin(), ports.end(), tensor_id) != ports.end();
}

bool is_graph_output(const Graph& graph, int64_t tensor_id) {
  if (graph.output_ports()) return is_output_port(graph, tensor_id);
  for (size_t c : graph.consumers_of(tensor_id)) {
    if (graph.ops()[c].kind() != OpKind::kEnd) return false;
  }
  return true;
}

const Op* sole_consumer(const Graph& graph, int64_t tensor_id) {
  const auto consumers = graph.consumers_of(tensor_id);
  if (consumers.size() != 1) return nullptr;
  return &graph.ops()[consumers[0]];
}

}  // namespace normgrad
