// Common-subexpression elimination over the topologically ordered ops.
#include <normgrad/passes/cse.hpp>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

// Two ops can be the same only if their kinds and input tensor ids match, so
// ops are first grouped by that: cheap to hash, and in a real network almost
// every group has one op. The full signature (attributes, output dtypes and
// shapes), a string, is built only for an op whose group already holds one.
struct InputsKey {
  OpKind kind;
  std::vector<int64_t> inputs;
  bool operator==(const InputsKey& o) const { return kind == o.kind && inputs == o.inputs; }
};

struct InputsKeyHash {
  size_t operator()(const InputsKey& k) const {
    uint64_t h = static_cast<uint64_t>(k.kind) * 0x9E3779B97F4A7C15ull;
    for (int64_t id : k.inputs) h = (h ^ static_cast<uint64_t>(id)) * 0x100000001B3ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// An earlier op of a group, with its signature once some later op needed it.
struct Earlier {
  int64_t id;
  std::string sig;
};

}  // namespace

StatusOr<bool> CsePass::run(Graph& graph) const {
  // One walk in topological order: an op whose inputs (after the merges so
  // far) and attributes match an earlier op's goes, and its readers read the
  // earlier op's outputs. The rewriter keeps producers and consumers current.
  // Not the greedy driver: a merge changes only its readers' signatures, and
  // they come later in this order, so one walk finds every merge (and an
  // earlier op's signature, once built, stays valid).
  std::unordered_map<InputsKey, std::vector<Earlier>, InputsKeyHash> groups;
  groups.reserve(graph.ops().size());
  std::vector<int64_t> order;
  order.reserve(graph.ops().size());
  for (const Op& op : graph.ops()) order.push_back(op.id());
  bool changed = false;
  for (int64_t id : order) {
    const Op& op = *graph.op(id);
    InputsKey key{op.kind(), {}};
    key.inputs.reserve(op.inputs().size());
    for (const LogicalTensor& lt : op.inputs()) key.inputs.push_back(lt.id);
    std::vector<Earlier>& group = groups[std::move(key)];
    if (group.empty()) {
      group.push_back({id, {}});
      continue;
    }
    const std::string sig = op_signature(op, /*with_input_ids=*/true, /*with_output_ids=*/false);
    const Earlier* same = nullptr;
    for (Earlier& e : group) {
      if (e.sig.empty()) e.sig = op_signature(*graph.op(e.id), true, false);
      if (e.sig == sig) {
        same = &e;
        break;
      }
    }
    if (same == nullptr) {
      group.push_back({id, sig});
      continue;
    }
    // Opaque ops are never merged, and neither is an op an opaque op reads: the
    // caller runs that op itself and passes the tensor ids it knows.
    bool observable = op.kind() == OpKind::kEnd || op_kind_is_opaque(op.kind());
    for (const LogicalTensor& lt : op.outputs()) {
      observable = observable || is_graph_output(graph, lt.id);
      for (const Use& u : graph.uses(lt.id))
        observable = observable || op_kind_is_opaque(graph.op(u.op_id)->kind());
    }
    if (observable) continue;
    const std::vector<LogicalTensor> outputs = op.outputs();  // a copy: edits move the ops
    const std::vector<LogicalTensor> first = graph.op(same->id)->outputs();
    for (size_t k = 0; k < outputs.size(); ++k)
      NG_RETURN_IF_ERROR(graph.replace_all_uses_with(outputs[k].id, first[k]));
    NG_RETURN_IF_ERROR(graph.erase_op(id));
    changed = true;
  }
  return changed;
}

}  // namespace normgrad
