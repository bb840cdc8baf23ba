// Transpose and cast folding into batch-norm backward.
#include <normgrad/passes/fold_layout.hpp>

#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/rewrite_driver.hpp>
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

// The producer op of the batch norm's src (`of_src`) or diff_dst when it is
// of `kind` and feeds only that port.
const Op* sole_producer(const Graph& g, const Op& bn, bool of_src, OpKind kind) {
  const BatchNormTrainingBackwardPorts ports(bn);
  const int64_t t = (of_src ? ports.src() : ports.diff_dst()).id;
  const Op* producer = g.producer(t);
  if (producer == nullptr || producer->kind() != kind) return nullptr;
  if (sole_consumer(g, t) != &bn || is_output_port(g, t)) return nullptr;
  if ((of_src ? ports.diff_dst() : ports.src()).id == t) return nullptr;
  return producer;
}

// Folds every producer/consumer pair of conversions around a batch-norm
// backward: a pattern anchored at the batch norm, run by the greedy driver
// (one visit per batch norm, and again only where an edit touched it).
// `check` decides whether the three conversion ops fit, `rewrite` edits the
// new batch norm.
template <typename Check, typename Rewrite>
StatusOr<bool> fold_around(Graph& g, OpKind conversion, const Check& check,
                           const Rewrite& rewrite) {
  auto fold = [&](Graph& graph, const Op& bn) -> StatusOr<bool> {
    if (!graph.unknown_shape_error(bn).ok()) return false;
    using Ports = BatchNormTrainingBackwardPorts;
    const Ports ports(bn);
    const Op* in_src = sole_producer(graph, bn, true, conversion);
    const Op* in_dy = sole_producer(graph, bn, false, conversion);
    const Op* out = sole_consumer(graph, ports.diff_src().id);
    if (!in_src || !in_dy || !out || out->kind() != conversion ||
        is_output_port(graph, ports.diff_src().id))
      return false;
    if (!check(bn, *in_src, *in_dy, *out)) return false;
    Op folded = bn;
    folded.mutable_inputs()[Ports::src_port()] = elementwise_src(*in_src);
    folded.mutable_inputs()[Ports::diff_dst_port()] = elementwise_src(*in_dy);
    folded.mutable_outputs()[Ports::diff_src_port()] = elementwise_dst(*out);
    rewrite(folded);
    const int64_t src_id = in_src->id(), dy_id = in_dy->id(), out_id = out->id();
    // The rewriter, in an order that is valid at every step: the output
    // conversion hands its tensor over (it writes a fresh one for the moment,
    // while the tensor's readers, which come after it, keep reading it), the
    // batch norm writes that tensor instead, and the three conversions, now
    // unread, go. The tensor keeps its id, so an output port naming it still
    // names it.
    Op handed_over = *out;
    LogicalTensor spare = elementwise_dst(*out);
    spare.id = graph.new_tensor_id();
    handed_over.mutable_outputs().assign(1, spare);
    NG_RETURN_IF_ERROR(graph.replace_op(out_id, std::move(handed_over)));
    NG_RETURN_IF_ERROR(graph.replace_op(folded.id(), folded));
    NG_RETURN_IF_ERROR(graph.erase_op(out_id));
    NG_RETURN_IF_ERROR(graph.erase_op(src_id));
    if (dy_id != src_id) NG_RETURN_IF_ERROR(graph.erase_op(dy_id));
    return true;
  };
  return apply_patterns_greedily(
      g, {{"fold-conversions", {OpKind::kBatchNormTrainingBackward}, fold}});
}

}  // namespace

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
        const DataType t = elementwise_src(a).dtype;
        // Only narrow data computed in f32, with f32 statistics: a supported combination after
        // folding.
        if (t != DataType::kBF16 && t != DataType::kF16) return false;
        const BatchNormTrainingBackwardPorts ports(bn);
        if (ports.src().dtype != DataType::kF32 || ports.mean().dtype != DataType::kF32)
          return false;
        return elementwise_src(b).dtype == t && elementwise_dst(out).dtype == t;
      },
      [](Op&) {});
}

}  // namespace normgrad
