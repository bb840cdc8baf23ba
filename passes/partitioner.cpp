// Partitioner: fusion groups become one partition each, every other op its own.
#include <normgrad/passes/partitioner.hpp>

#include <normgrad/graph/op_checks.hpp>

#include <algorithm>
#include <map>
#include <set>

namespace normgrad {

StatusOr<std::vector<Partition>> partition_graph(const Graph& graph) {
  if (!graph.finalized()) return invalid_graph("partition_graph: the graph is not finalized");
  const auto& groups = graph.fusion_groups();
  std::set<int64_t> graph_out;
  for (const LogicalTensor& lt : graph.graph_outputs()) graph_out.insert(lt.id);
  // A partition is emitted at its last op in topological order, so its inputs are ready.
  std::map<int64_t, std::vector<const Op*>> members;  // anchor -> ops in topological order
  std::map<int64_t, size_t> last_index;
  for (size_t k = 0; k < graph.ops().size(); ++k) {
    const Op& op = graph.ops()[k];
    if (op.kind() == OpKind::kEnd) continue;
    auto it = groups.find(op.id());
    const int64_t anchor = it == groups.end() ? op.id() : it->second;
    members[anchor].push_back(&op);
    last_index[anchor] = k;
  }
  std::vector<std::pair<size_t, int64_t>> order;
  for (const auto& [anchor, k] : last_index) order.emplace_back(k, anchor);
  std::sort(order.begin(), order.end());
  std::vector<Partition> parts;
  for (const auto& [k, anchor] : order) {
    Partition p;
    p.id = static_cast<int64_t>(parts.size());
    std::set<int64_t> inside_ops, produced, seen_in;
    for (const Op* op : members[anchor]) {
      p.ops.push_back(*op);
      inside_ops.insert(op->id());
      for (const LogicalTensor& lt : op->outputs()) produced.insert(lt.id);
    }
    for (const Op* op : members[anchor]) {
      for (const LogicalTensor& lt : op->inputs()) {
        if (!produced.count(lt.id) && seen_in.insert(lt.id).second) p.inputs.push_back(lt);
      }
    }
    for (const Op* op : members[anchor]) {
      for (const LogicalTensor& lt : op->outputs()) {
        // Internal tensors stay inside; anything read outside, or a graph output, leaves.
        bool outside =
            graph_out.count(lt.id) != 0 || graph.consumers_of(lt.id).empty() || p.ops.size() == 1;
        for (size_t c : graph.consumers_of(lt.id)) {
          const Op& consumer = graph.ops()[c];
          outside = outside || (!inside_ops.count(consumer.id()));
        }
        if (outside) p.outputs.push_back(lt);
      }
    }
    for (const Op& op : p.ops) {
      if (!p.supported) break;
      if (op_kind_is_opaque(op.kind())) {
        p.supported = false;
        p.reason = std::string("normgrad has no kernel for ") + op.kind_spelling() +
                   " (an op kind it carries but does not run)";
        break;
      }
      for (const auto* list : {&op.inputs(), &op.outputs()}) {
        for (const LogicalTensor& lt : *list) {
          if (lt.layout == LayoutType::kOpaque && p.supported) {
            p.supported = false;
            p.reason = "tensor " + std::to_string(lt.id) +
                       " has an opaque (backend-private) layout that normgrad cannot read";
          }
        }
      }
    }
    parts.push_back(std::move(p));
  }
  return parts;
}

}  // namespace normgrad
