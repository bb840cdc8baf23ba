// Transpose and cast folding into batch-norm backward.
#include <normgrad/passes/fold_layout.hpp>

#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

// order that moves the channel from dim 1 to last (NCX -> NXC), and its inverse.
std::vector<int64_t> to_channels_last(int rank) {
  std::vector<int64_t> o = {0};
  for (int i = 2; i < rank; ++i) o.push_back(i);
  o.push_back(1);
  return o;
}
std::vector<int64_t> to_channels_first(int rank) {
  std::vector<int64_t> o = {0, rank - 1};
  for (int i = 1; i < rank - 1; ++i) o.push_back(i);
  return o;
}

std::vector<int64_t> normalized_order(const Op& t) {
  auto order = t.attr_s64s("order");
  if (!order.ok()) return {};
  const auto rank = static_cast<int64_t>(order->size());
  for (int64_t& o : *order) o = (o + rank) % rank;
  return *order;
}

// The producer op of input `port` of `op` when it is of `kind` and feeds only `op`.
const Op* sole_producer(const Graph& g, const Op& op, size_t port, OpKind kind) {
  const Op* producer = g.producer(op.inputs()[port].id);
  if (producer == nullptr || producer->kind() != kind) return nullptr;
  const int64_t t = op.inputs()[port].id;
  if (sole_consumer(g, t) != &op || is_output_port(g, t)) return nullptr;
  if (op.inputs()[1 - port].id == t) return nullptr;
  return producer;
}

// Folds every producer/consumer pair of conversions around a batch-norm
// backward, in one walk; `check` decides whether the three conversion ops
// fit, `rewrite` edits the new batch norm. A fold removes its three
// conversions and enables no other (a conversion between two batch norms is
// the first one's output and the second one's input: folding the first
// erases it), so one walk folds all there is.
template <typename Check, typename Rewrite>
StatusOr<bool> fold_around(Graph& g, OpKind conversion, const Check& check,
                           const Rewrite& rewrite) {
  // The candidates' ids first: the edits below move ops in g.ops().
  std::vector<int64_t> candidates;
  for (const Op& op : g.ops()) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) candidates.push_back(op.id());
  }
  bool changed = false;
  for (int64_t bn_id : candidates) {
    const Op* found = g.op(bn_id);
    if (found == nullptr) continue;
    const Op& bn = *found;
    if (bn.kind() != OpKind::kBatchNormTrainingBackward || !g.unknown_shape_error(bn).ok())
      continue;
    using Ports = BatchNormTrainingBackwardPorts;
    const Ports ports(bn);
    const Op* in_src = sole_producer(g, bn, Ports::src_port(), conversion);
    const Op* in_dy = sole_producer(g, bn, Ports::diff_dst_port(), conversion);
    const Op* out = sole_consumer(g, ports.diff_src().id);
    if (!in_src || !in_dy || !out || out->kind() != conversion ||
        is_output_port(g, ports.diff_src().id))
      continue;
    if (!check(bn, *in_src, *in_dy, *out)) continue;
    // A conversion has one input and one output.
    Op folded = bn;
    folded.mutable_inputs()[Ports::src_port()] = in_src->inputs()[0];
    folded.mutable_inputs()[Ports::diff_dst_port()] = in_dy->inputs()[0];
    folded.mutable_outputs()[0] = out->outputs()[0];
    rewrite(folded);
    const int64_t src_id = in_src->id(), dy_id = in_dy->id(), out_id = out->id();
    // The rewriter, in an order that is valid at every step: the output
    // conversion goes, the batch norm writes its tensor instead, and the
    // input conversions, now unread, go.
    NG_RETURN_IF_ERROR(g.erase_op(out_id));
    NG_RETURN_IF_ERROR(g.replace_op(folded.id(), folded));
    NG_RETURN_IF_ERROR(g.erase_op(src_id));
    if (dy_id != src_id) NG_RETURN_IF_ERROR(g.erase_op(dy_id));
    changed = true;
  }
  return changed;
}

}  // namespace

// Every fold in one run (passes.def still runs them to a fixed point, which
// then ends after the second, unchanged run).
StatusOr<bool> FoldTransposePass::run(Graph& graph) const {
  return fold_around(
      graph, OpKind::kStaticTranspose,
      [](const Op& bn, const Op& a, const Op& b, const Op& out) {
        auto d = describe_batch_norm(bn);
        if (!d.ok()) return false;
        const int rank = static_cast<int>(d->dims.size());
        if (rank < 3) return false;
        const bool nxc = d->format == DataFormat::kNXC;
        const auto in_order = nxc ? to_channels_last(rank) : to_channels_first(rank);
        const auto out_order = nxc ? to_channels_first(rank) : to_channels_last(rank);
        return normalized_order(a) == in_order && normalized_order(b) == in_order &&
               normalized_order(out) == out_order;
      },
      [](Op& bn) {
        auto d = describe_batch_norm(bn);
        const bool was_nxc = !d.ok() || d->format == DataFormat::kNXC;
        bn.set_attr("data_format", std::string(was_nxc ? "NCX" : "NXC"));
      });
}

StatusOr<bool> FoldCastPass::run(Graph& graph) const {
  return fold_around(
      graph, OpKind::kTypeCast,
      [](const Op& bn, const Op& a, const Op& b, const Op& out) {
        const DataType t = a.inputs()[0].dtype;
        // Only narrow data computed in f32, with f32 statistics: a supported combination after
        // folding.
        if (t != DataType::kBF16 && t != DataType::kF16) return false;
        const BatchNormTrainingBackwardPorts ports(bn);
        if (ports.src().dtype != DataType::kF32 || ports.mean().dtype != DataType::kF32)
          return false;
        return b.inputs()[0].dtype == t && out.outputs()[0].dtype == t;
      },
      [](Op&) {});
}

}  // namespace normgrad
