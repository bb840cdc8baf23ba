// Partitioner: one partition per op, with boundary tensors in port order.
#include "passes/partitioner.hpp"

namespace normgrad {

StatusOr<std::vector<Partition>> partition_graph(const Graph& graph) {
  if (!graph.finalized()) return invalid_graph("partition_graph: the graph is not finalized");
  std::vector<Partition> parts;
  for (const Op& op : graph.ops()) {
    if (op.kind() == OpKind::kEnd) continue;
    Partition p;
    p.id = static_cast<int64_t>(parts.size());
    p.ops.push_back(op);
    p.inputs = op.inputs();
    p.outputs = op.outputs();
    parts.push_back(std::move(p));
  }
  return parts;
}

}  // namespace normgrad
