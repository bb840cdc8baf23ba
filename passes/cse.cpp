// Common-subexpression elimination over the topologically ordered ops.
#include <normgrad/passes/cse.hpp>

#include <map>
#include <string>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {

StatusOr<bool> CsePass::run(Graph& graph) const {
  // One walk in topological order: an op whose inputs (after the merges so
  // far) and attributes match an earlier op's goes, and its readers read the
  // earlier op's outputs. The rewriter keeps producers and consumers current.
  // Not the greedy driver: a merge changes only its readers' signatures, and
  // they come later in this order, so one walk finds every merge.
  std::map<std::string, int64_t> seen;  // signature -> op id
  std::vector<int64_t> order;
  for (const Op& op : graph.ops()) order.push_back(op.id());
  bool changed = false;
  for (int64_t id : order) {
    const Op op = *graph.op(id);  // a copy: edits move the ops
    const std::string sig = op_signature(op, /*with_input_ids=*/true, /*with_output_ids=*/false);
    // Opaque ops are never merged, and neither is an op an opaque op reads: the
    // caller runs that op itself and passes the tensor ids it knows.
    bool observable = op.kind() == OpKind::kEnd || op_kind_is_opaque(op.kind());
    for (const LogicalTensor& lt : op.outputs()) {
      observable = observable || is_graph_output(graph, lt.id);
      for (const Use& u : graph.uses(lt.id))
        observable = observable || op_kind_is_opaque(graph.op(u.op_id)->kind());
    }
    auto it = seen.find(sig);
    if (it == seen.end()) {
      seen.emplace(sig, id);
      continue;
    }
    if (observable) continue;
    const Op first = *graph.op(it->second);
    for (size_t k = 0; k < op.outputs().size(); ++k)
      NG_RETURN_IF_ERROR(graph.replace_all_uses_with(op.outputs()[k].id, first.outputs()[k]));
    NG_RETURN_IF_ERROR(graph.erase_op(id));
    changed = true;
  }
  return changed;
}

}  // namespace normgrad
