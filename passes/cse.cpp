// Common-subexpression elimination over the topologically ordered ops.
#include <normgrad/passes/cse.hpp>

#include <map>
#include <string>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {

StatusOr<bool> CsePass::run(Graph& graph) const {
  // One pass in topological order: an op whose (renamed) inputs and attributes
  // were seen before is dropped, and its outputs are renamed to the first op's.
  std::map<int64_t, LogicalTensor> renames;
  std::map<std::string, size_t> seen;  // signature -> index in `kept`
  std::vector<Op> kept;
  bool changed = false;
  for (Op op : graph.ops()) {
    for (LogicalTensor& lt : op.mutable_inputs()) {
      if (auto it = renames.find(lt.id); it != renames.end()) lt = it->second;
    }
    const std::string sig = op_signature(op, /*with_input_ids=*/true, /*with_output_ids=*/false);
    // Opaque ops are never merged, and neither is an op an opaque op reads: the
    // caller runs that op itself and passes the tensor ids it knows.
    bool observable = op.kind() == OpKind::kEnd || op_kind_is_opaque(op.kind());
    for (const LogicalTensor& lt : op.outputs()) {
      observable = observable || is_graph_output(graph, lt.id);
      for (size_t c : graph.consumers_of(lt.id))
        observable = observable || op_kind_is_opaque(graph.ops()[c].kind());
    }
    auto it = seen.find(sig);
    if (it != seen.end() && !observable) {
      const Op& first = kept[it->second];
      for (size_t k = 0; k < op.outputs().size(); ++k)
        renames[op.outputs()[k].id] = first.outputs()[k];
      changed = true;
      continue;
    }
    if (it == seen.end()) seen.emplace(sig, kept.size());
    kept.push_back(std::move(op));
  }
  if (changed) graph.mutable_ops() = std::move(kept);
  return changed;
}

}  // namespace normgrad
