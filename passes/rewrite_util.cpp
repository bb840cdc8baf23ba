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
