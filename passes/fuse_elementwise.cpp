// FuseElementwisePass: grouping rules for elementwise producers of batch-norm backward.
#include <normgrad/passes/fuse_elementwise.hpp>

#include <normgrad/passes/rewrite_util.hpp>

#include <algorithm>

namespace normgrad {
namespace {

bool is_fusible_producer(OpKind k) {
  return k == OpKind::kReLUBackward || k == OpKind::kAdd;
}

bool is_bn_backward(OpKind k) {
  return k == OpKind::kBatchNormTrainingBackward || k == OpKind::kBatchNormBackwardReduce ||
         k == OpKind::kBatchNormBackwardApply;
}

// The producer of data port `port` of `bn` joins its group, or why not.
Status producer_fuses(const Graph& graph, const Op& bn, size_t port, const Op** producer_out) {
  const LogicalTensor& t = bn.inputs()[port];
  const int64_t p = graph.producer_of(t.id);
  if (p < 0) return unimplemented("tensor " + std::to_string(t.id) + " is a graph input");
  const Op& producer = graph.ops()[static_cast<size_t>(p)];
  *producer_out = &producer;
  if (!is_fusible_producer(producer.kind()))
    return unimplemented(producer.label() + " is not ReLUBackward or Add");
  if (graph.fusion_groups().count(producer.id()))
    return unimplemented(producer.label() + " is in another group already");
  const auto consumers = graph.consumers_of(t.id);
  if (consumers.size() != 1 || graph.ops()[consumers[0]].id() != bn.id())
    return unimplemented("tensor " + std::to_string(t.id) + " has another reader");
  if (bn.inputs()[1 - port].id == t.id)
    return unimplemented("tensor " + std::to_string(t.id) + " feeds both data ports");
  if (is_output_port(graph, t.id))
    return unimplemented("tensor " + std::to_string(t.id) + " is a graph output");
  bool uniform = t.dtype == bn.inputs()[0].dtype;
  for (const LogicalTensor& in : producer.inputs())  // no broadcast, no mixed dtypes
    uniform = uniform && in.dtype == t.dtype && in.dims == t.dims;
  if (!uniform) return unimplemented(producer.label() + " broadcasts or mixes dtypes");
  return ok_status();
}

}  // namespace

std::vector<std::string> explain_fusion(const Graph& graph) {
  std::vector<std::string> lines;
  for (const Op& bn : graph.ops()) {
    if (!is_bn_backward(bn.kind())) continue;
    if (Status known = graph.unknown_shape_error(bn); !known.ok()) {
      lines.push_back(bn.label() + ": no fusion (" + known.message() + ")");
      continue;
    }
    for (size_t port = 0; port < 2; ++port) {
      const Op* producer = nullptr;
      const Status s = producer_fuses(graph, bn, port, &producer);
      const std::string what =
          bn.label() + " port " + std::to_string(port) + (port == 0 ? " (src)" : " (diff_dst)");
      const auto g = graph.fusion_groups().find(bn.id());
      const bool grouped_here = producer && g != graph.fusion_groups().end() &&
                                graph.fusion_groups().count(producer->id()) &&
                                graph.fusion_groups().at(producer->id()) == g->second;
      lines.push_back(
          what + ": " +
          (grouped_here ? producer->label() + " fused" : "not fused (" + s.message() + ")"));
    }
  }
  return lines;
}

StatusOr<bool> FuseElementwisePass::run(Graph& graph) const {
  bool changed = false;
  const auto& ops = graph.ops();
  for (const Op& bn : ops) {
    if (!is_bn_backward(bn.kind()) || !graph.unknown_shape_error(bn).ok()) continue;
    for (size_t port = 0; port < 2; ++port) {
      const Op* producer = nullptr;
      if (!producer_fuses(graph, bn, port, &producer).ok()) continue;
      graph.set_fusion_group(producer->id(), bn.id());
      graph.set_fusion_group(bn.id(), bn.id());
      changed = true;
    }
  }
  for (const Op& bn : ops) {
    if (bn.kind() != OpKind::kBatchNormInference || !graph.unknown_shape_error(bn).ok()) continue;
    if (graph.fusion_groups().count(bn.id())) continue;
    const LogicalTensor& y = bn.outputs()[0];
    const auto consumers = graph.consumers_of(y.id);
    if (consumers.size() != 1 || is_output_port(graph, y.id)) continue;
    const Op& relu = ops[consumers[0]];
    if (relu.kind() != OpKind::kReLU || relu.outputs()[0].dtype != y.dtype) continue;
    // oneDNN's int8 pattern around it: Dequantize -> [BN -> ReLU] -> Quantize,
    // each link the only consumer of the one before.
    const int64_t deq = graph.producer_of(bn.inputs()[0].id);
    const auto relu_users = graph.consumers_of(relu.outputs()[0].id);
    const bool int8 = deq >= 0 && ops[static_cast<size_t>(deq)].kind() == OpKind::kDequantize &&
                      graph.consumers_of(bn.inputs()[0].id).size() == 1 &&
                      !is_output_port(graph, bn.inputs()[0].id) && relu_users.size() == 1 &&
                      ops[relu_users[0]].kind() == OpKind::kQuantize &&
                      !is_output_port(graph, relu.outputs()[0].id);
    const int64_t anchor = int8 ? ops[relu_users[0]].id() : relu.id();
    if (int8) {
      graph.set_fusion_group(ops[static_cast<size_t>(deq)].id(), anchor);
      graph.set_fusion_group(relu.id(), anchor);
    }
    graph.set_fusion_group(bn.id(), anchor);
    graph.set_fusion_group(relu.id(), anchor);
    graph.set_fusion_group(anchor, anchor);
    changed = true;
  }
  return changed;
}

}  // namespace normgrad
