// Rewrite helpers for the passes.
#include <normgrad/passes/rewrite_util.hpp>

#include <algorithm>

namespace normgrad {

bool is_output_port(const Graph& graph, int64_t tensor_id) {
  if (!graph.output_ports()) return false;
  const auto& ports = *graph.output_ports();
  return std::find(ports.begin(), ports.end(), tensor_id) != ports.end();
}

bool is_graph_output(const Graph& graph, int64_t tensor_id) {
  if (graph.output_ports()) return is_output_port(graph, tensor_id);
  for (const Use& u : graph.uses(tensor_id)) {
    if (graph.op(u.op_id)->kind() != OpKind::kEnd) return false;
  }
  return true;
}

const Op* sole_consumer(const Graph& graph, int64_t tensor_id) {
  const std::vector<Use> uses = graph.uses(tensor_id);
  if (uses.empty()) return nullptr;
  for (const Use& u : uses) {
    if (u.op_id != uses[0].op_id) return nullptr;  // several readers
  }
  return graph.op(uses[0].op_id);
}

}  // namespace normgrad
