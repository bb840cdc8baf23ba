// CanonicalizePass: TensorFlow gradients to BatchNormTrainingBackward, explicit modes.
#include <normgrad/passes/canonicalize.hpp>

#include <algorithm>
#include <vector>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/tf_batch_norm.hpp>
#include <normgrad/passes/rewrite_driver.hpp>

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

// The reserve outputs a TensorFlow gradient had after its three gradients
// have no producer once it is replaced: End ops that only marked one go, any
// other reader gets it as an (empty) graph input, and output ports drop it.
Status drop_reserve_outputs(Graph& graph, const std::vector<int64_t>& dropped) {
  for (int64_t id : dropped) {
    std::vector<int64_t> ends;
    for (const Use& u : graph.uses(id)) {
      if (graph.op(u.op_id)->kind() == OpKind::kEnd) ends.push_back(u.op_id);
    }
    for (int64_t end : ends) NG_RETURN_IF_ERROR(graph.erase_op(end));
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
      if (std::find(dropped.begin(), dropped.end(), id) == dropped.end()) ports.push_back(id);
    }
    graph.set_output_ports(std::move(ports));
  }
  return ok_status();
}

}  // namespace

StatusOr<bool> CanonicalizePass::run(Graph& graph) const {
  // Each op is rewritten once, into a form no pattern matches again; the
  // ops are copied from first, as the edits replace them.
  RewritePattern tf_gradient{
      "tf-gradient-to-backward",
      {OpKind::kFusedBatchNormGrad, OpKind::kFusedBatchNormGradV2, OpKind::kFusedBatchNormGradV3},
      [](Graph& g, const Op& op) -> StatusOr<bool> {
        NG_ASSIGN_OR_RETURN(Op bn, rewrite_tf(op));
        std::vector<int64_t> dropped;  // the reserve outputs after the three gradients
        for (size_t i = FusedBatchNormGradPorts::offset_backprop_port() + 1;
             i < op.outputs().size(); ++i)
          dropped.push_back(op.outputs()[i].id);
        NG_RETURN_IF_ERROR(g.replace_op(op.id(), std::move(bn)));
        NG_RETURN_IF_ERROR(drop_reserve_outputs(g, dropped));
        return true;
      }};
  RewritePattern explicit_mode{"explicit-training-mode",
                               {OpKind::kBatchNormTrainingBackward},
                               [](Graph& g, const Op& op) -> StatusOr<bool> {
                                 if (op.has_attr("is_training")) return false;
                                 Op bn = op;
                                 const bool training = op.outputs().size() == 3;
                                 bn.set_attr("is_training", training);
                                 if (!training && bn.inputs().size() == 5)
                                   bn.mutable_inputs().pop_back();  // oneDNN ignores gamma here
                                 NG_RETURN_IF_ERROR(g.replace_op(op.id(), std::move(bn)));
                                 return true;
                               }};
  return apply_patterns_greedily(graph, {tf_gradient, explicit_mode});
}

}  // namespace normgrad
