// An out-of-tree pass, built against an installed normgrad and loaded with
// `normgrad opt --load-pass-plugin=libdrop_identity_transpose.so`.
//
//   before:  x -> StaticTranspose(order = 0, 1, ..., r-1) -> t -> consumers
//   after:   x -> consumers
//
// An identity transpose moves no data; frameworks leave them behind after
// layout propagation. The pass rewires every reader of t to read x, and keeps
// the transpose when t is a graph output (the caller expects that tensor id).
#include <normgrad/passes/pass.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace {

using normgrad::Graph;
using normgrad::Op;
using normgrad::OpKind;

bool is_identity(const Op& op) {
  auto order = op.attr_s64s("order");
  if (!order.ok()) return false;
  const auto rank = static_cast<int64_t>(order->size());
  for (int64_t i = 0; i < rank; ++i) {
    if (((*order)[static_cast<size_t>(i)] + rank) % rank != i) return false;
  }
  return true;
}

class DropIdentityTransposePass final : public normgrad::Pass {
 public:
  const char* name() const override { return "drop-identity-transpose"; }

  normgrad::StatusOr<bool> run(Graph& graph) const override {
    // With the rewriter API: readers move to the transpose's input, then the
    // transpose, now unread, goes; the graph stays consistent at every step.
    std::vector<Op> identities;
    for (const Op& op : graph.ops()) {
      if (op.kind() == OpKind::kStaticTranspose && is_identity(op) &&
          !normgrad::is_graph_output(graph, op.outputs()[0].id))
        identities.push_back(op);
    }
    for (const Op& op : identities) {
      NG_RETURN_IF_ERROR(graph.replace_all_uses_with(op.outputs()[0].id, op.inputs()[0]));
      NG_RETURN_IF_ERROR(graph.erase_op(op.id()));
    }
    return !identities.empty();
  }
};

}  // namespace

// The plugin's entry point: registers its passes by name.
extern "C" normgrad::Status normgrad_register_passes() {
  return normgrad::register_pass("drop-identity-transpose",
                                 "removes StaticTranspose ops whose order is the identity",
                                 [] { return std::make_unique<DropIdentityTransposePass>(); });
}
