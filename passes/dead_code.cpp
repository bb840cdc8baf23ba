// Dead-output and dead-op elimination.
#include <normgrad/passes/dead_code.hpp>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/rewrite_driver.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

bool is_dead(const Graph& graph, int64_t tensor_id) {
  return graph.output_ports() && graph.uses(tensor_id).empty() && !is_output_port(graph, tensor_id);
}

}  // namespace

StatusOr<bool> DeadOutputEliminationPass::run(Graph& graph) const {
  if (!graph.output_ports()) return false;
  RewritePattern trim{"trim-dead-reductions",
                      {OpKind::kBatchNormTrainingBackward},
                      [](Graph& g, const Op& op) -> StatusOr<bool> {
                        if (op.outputs().size() != 3) return false;
                        const BatchNormTrainingBackwardPorts ports(op);
                        if (!is_dead(g, ports.diff_gamma().id) || !is_dead(g, ports.diff_beta().id))
                          return false;
                        Op trimmed = op;
                        if (!trimmed.has_attr("is_training"))
                          trimmed.set_attr("is_training", true);  // 3 outputs meant training
                        trimmed.mutable_outputs().resize(1);
                        NG_RETURN_IF_ERROR(g.replace_op(op.id(), std::move(trimmed)));
                        return true;
                      }};
  return apply_patterns_greedily(graph, {trim});
}

StatusOr<bool> DeadOpEliminationPass::run(Graph& graph) const {
  if (!graph.output_ports()) return false;
  // An op whose outputs nobody reads goes; the driver then looks at its
  // producers again, so whole dead chains go in one run.
  RewritePattern erase{
      "erase-dead-op", {}, [](Graph& g, const Op& op) -> StatusOr<bool> {
        // Opaque ops are the framework's: never removed, whatever reads
        // their outputs.
        if (op.kind() == OpKind::kEnd || op.outputs().empty() || op_kind_is_opaque(op.kind()))
          return false;
        for (const LogicalTensor& lt : op.outputs()) {
          if (!is_dead(g, lt.id)) return false;
        }
        if (g.ops().size() == 1) return invalid_graph("dead-op elimination would remove every op");
        NG_RETURN_IF_ERROR(g.erase_op(op.id()));
        return true;
      }};
  return apply_patterns_greedily(graph, {erase});
}

}  // namespace normgrad
