// CanonicalizePass: TensorFlow gradients to BatchNormTrainingBackward, explicit modes.
#include <normgrad/passes/canonicalize.hpp>

#include <algorithm>
#include <set>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/tf_batch_norm.hpp>

namespace normgrad {
namespace {

StatusOr<Op> rewrite_tf(const Op& tf) {
  NG_ASSIGN_OR_RETURN(TfBatchNormFormat f, tf_batch_norm_format(tf));
  Op bn(tf.id(), OpKind::kBatchNormTrainingBackward, tf.name());
  float eps = 0.0001f;  // TensorFlow's default
  if (tf.has_attr("epsilon")) {
    NG_ASSIGN_OR_RETURN(eps, tf.attr_f32("epsilon"));
  }
  bool training = true;
  if (tf.has_attr("is_training")) {
    NG_ASSIGN_OR_RETURN(training, tf.attr_bool("is_training"));
  }
  bool inv_std = false;
  if (tf.has_attr("reserve_space_2_is_inv_std")) {
    NG_ASSIGN_OR_RETURN(inv_std, tf.attr_bool("reserve_space_2_is_inv_std"));
  }
  bn.set_attr("epsilon", eps);
  bn.set_attr("data_format", std::string(f.channels_last ? "NXC" : "NCX"));
  bn.set_attr("is_training", training);
  if (inv_std) bn.set_attr("variance_is_inv_std", true);
  if (tf.has_attr("sync_group")) bn.set_attr("sync_group", tf.attrs().at("sync_group"));
  // V1, V2 and V3 name their first five inputs and three outputs alike
  // (V3 adds reserve_space_3, which TensorFlow's CPU kernel ignores).
  auto ports = [&](auto tf_ports) {
    bn.add_input(tf_ports.x())
        .add_input(tf_ports.y_backprop())
        .add_input(tf_ports.reserve_space_1())
        .add_input(tf_ports.reserve_space_2())
        .add_input(tf_ports.scale());
    bn.add_output(tf_ports.x_backprop())
        .add_output(tf_ports.scale_backprop())
        .add_output(tf_ports.offset_backprop());
  };
  if (tf.kind() == OpKind::kFusedBatchNormGradV3) {
    ports(FusedBatchNormGradV3Ports(tf));
  } else if (tf.kind() == OpKind::kFusedBatchNormGradV2) {
    ports(FusedBatchNormGradV2Ports(tf));
  } else {
    ports(FusedBatchNormGradPorts(tf));
  }
  return bn;
}

}  // namespace

StatusOr<bool> CanonicalizePass::run(Graph& graph) const {
  bool changed = false;
  std::set<int64_t> dropped;  // empty reserve outputs that lost their producer
  std::vector<int64_t> ids;
  for (const Op& op : graph.ops()) ids.push_back(op.id());
  for (int64_t id : ids) {
    const Op& op = *graph.op(id);
    if (is_tf_batch_norm_grad(op.kind())) {
      NG_ASSIGN_OR_RETURN(Op bn, rewrite_tf(op));
      // The reserve outputs after the three gradients.
      for (size_t i = FusedBatchNormGradPorts::offset_backprop_port() + 1; i < op.outputs().size();
           ++i)
        dropped.insert(op.outputs()[i].id);
      NG_RETURN_IF_ERROR(graph.replace_op(id, std::move(bn)));
      changed = true;
    } else if (op.kind() == OpKind::kBatchNormTrainingBackward && !op.has_attr("is_training")) {
      Op bn = op;
      const bool training = op.outputs().size() == 3;
      bn.set_attr("is_training", training);
      if (!training && bn.inputs().size() == 5)
        bn.mutable_inputs().pop_back();  // oneDNN ignores gamma here
      NG_RETURN_IF_ERROR(graph.replace_op(id, std::move(bn)));
      changed = true;
    }
  }
  if (dropped.empty()) return changed;
  // End ops that only marked a dropped reserve output go too; any other
  // reader of one gets it as an (empty) graph input.
  for (int64_t id : ids) {
    const Op* op = graph.op(id);
    if (op != nullptr && op->kind() == OpKind::kEnd && dropped.count(EndPorts(*op).src().id))
      NG_RETURN_IF_ERROR(graph.erase_op(id));
  }
  if (graph.input_ports()) {
    std::vector<int64_t> ports = *graph.input_ports();
    for (int64_t id : dropped) {
      if (!graph.uses(id).empty() && std::find(ports.begin(), ports.end(), id) == ports.end())
        ports.push_back(id);
    }
    graph.set_input_ports(std::move(ports));
  }
  if (graph.output_ports()) {
    std::vector<int64_t> ports;
    for (int64_t id : *graph.output_ports()) {
      if (!dropped.count(id)) ports.push_back(id);
    }
    graph.set_output_ports(std::move(ports));
  }
  return changed;
}

}  // namespace normgrad
