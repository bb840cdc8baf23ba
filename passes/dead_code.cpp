// Dead-output and dead-op elimination.
#include <normgrad/passes/dead_code.hpp>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

bool is_dead(const Graph& graph, int64_t tensor_id) {
  return graph.output_ports() && graph.consumers_of(tensor_id).empty() &&
         !is_output_port(graph, tensor_id);
}

}  // namespace

StatusOr<bool> DeadOutputEliminationPass::run(Graph& graph) const {
  if (!graph.output_ports()) return false;
  std::vector<Op> ops = graph.ops();
  bool changed = false;
  for (Op& op : ops) {
    if (op.kind() != OpKind::kBatchNormTrainingBackward || op.outputs().size() != 3) continue;
    if (!is_dead(graph, op.outputs()[1].id) || !is_dead(graph, op.outputs()[2].id)) continue;
    if (!op.has_attr("is_training")) op.set_attr("is_training", true);  // 3 outputs meant training
    op.mutable_outputs().resize(1);
    changed = true;
  }
  if (changed) graph.mutable_ops() = std::move(ops);
  return changed;
}

StatusOr<bool> DeadOpEliminationPass::run(Graph& graph) const {
  if (!graph.output_ports()) return false;
  // In reverse topological order an op whose outputs nobody reads goes; its
  // producers come later in the walk and see it gone (the rewriter keeps the
  // consumers current), so one walk removes whole dead chains.
  bool changed = false;
  for (size_t k = graph.ops().size(); k-- > 0;) {
    const Op& op = graph.ops()[k];
    // Opaque ops are the framework's: never removed, whatever reads their outputs.
    if (op.kind() == OpKind::kEnd || op.outputs().empty() || op_kind_is_opaque(op.kind())) continue;
    bool all_dead = true;
    for (const LogicalTensor& lt : op.outputs()) all_dead = all_dead && is_dead(graph, lt.id);
    if (!all_dead) continue;
    if (graph.ops().size() == 1) return invalid_graph("dead-op elimination would remove every op");
    NG_RETURN_IF_ERROR(graph.erase_op(op.id()));
    changed = true;
  }
  return changed;
}

}  // namespace normgrad
