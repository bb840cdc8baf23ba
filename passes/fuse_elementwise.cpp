// FuseElementwisePass: grouping rules for elementwise producers of batch-norm backward.
#include <normgrad/passes/fuse_elementwise.hpp>

#include <normgrad/passes/rewrite_util.hpp>

#include <algorithm>

namespace normgrad {
namespace {

bool is_fusible_producer(OpKind k) {
  return k == OpKind::kReLUBackward || k == OpKind::kAdd;
}

}  // namespace

StatusOr<bool> FuseElementwisePass::run(Graph& graph) const {
  bool changed = false;
  const auto& ops = graph.ops();
  for (const Op& bn : ops) {
    const bool backward = bn.kind() == OpKind::kBatchNormTrainingBackward ||
                          bn.kind() == OpKind::kBatchNormBackwardReduce ||
                          bn.kind() == OpKind::kBatchNormBackwardApply;
    if (!backward || !graph.unknown_shape_error(bn).ok()) continue;
    for (size_t port = 0; port < 2; ++port) {
      const LogicalTensor& t = bn.inputs()[port];
      const int64_t p = graph.producer_of(t.id);
      if (p < 0) continue;
      const Op& producer = ops[static_cast<size_t>(p)];
      if (!is_fusible_producer(producer.kind())) continue;
      if (graph.fusion_groups().count(producer.id())) continue;  // already grouped
      const auto consumers = graph.consumers_of(t.id);
      if (consumers.size() != 1 || ops[consumers[0]].id() != bn.id())
        continue;                                      // a second consumer
      if (bn.inputs()[1 - port].id == t.id) continue;  // feeds both data ports
      if (is_output_port(graph, t.id)) continue;
      bool uniform = t.dtype == bn.inputs()[0].dtype;
      for (const LogicalTensor& in : producer.inputs())  // no broadcast, no mixed dtypes
        uniform = uniform && in.dtype == t.dtype && in.dims == t.dims;
      if (!uniform) continue;
      graph.set_fusion_group(producer.id(), bn.id());
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
