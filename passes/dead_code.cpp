// Dead-output and dead-op elimination.
#include <normgrad/passes/dead_code.hpp>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

bool is_dead(const Graph& graph, int64_t tensor_id) {
  return graph.output_ports() && graph.uses(tensor_id).empty() && !is_output_port(graph, tensor_id);
}

}  // namespace

StatusOr<bool> DeadOutputEliminationPass::run(Graph& graph) const {
  if (!graph.output_ports()) return false;
  bool changed = false;
  for (size_t k = 0; k < graph.ops().size(); ++k) {
    const Op& op = graph.ops()[k];
    if (op.kind() != OpKind::kBatchNormTrainingBackward || op.outputs().size() != 3) continue;
    const BatchNormTrainingBackwardPorts ports(op);
    if (!is_dead(graph, ports.diff_gamma().id) || !is_dead(graph, ports.diff_beta().id)) continue;
    Op trimmed = op;
    if (!trimmed.has_attr("is_training"))
      trimmed.set_attr("is_training", true);  // 3 outputs meant training
    trimmed.mutable_outputs().resize(1);
    NG_RETURN_IF_ERROR(graph.replace_op(op.id(), std::move(trimmed)));
    changed = true;
  }
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
