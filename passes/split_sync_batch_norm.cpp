// SplitSyncBatchNormPass: Reduce -> AllReduce -> Apply for synchronized batch norms.
#include <normgrad/passes/split_sync_batch_norm.hpp>

#include <algorithm>

#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

bool is_fusible_producer(OpKind k) {
  return k == OpKind::kReLUBackward || k == OpKind::kAdd;
}

// Training, or frozen statistics with diff_gamma/diff_beta (sums over the
// whole batch too); a frozen diff_src alone needs nothing from other processes.
bool is_synchronized(const Op& bn) {
  if (bn.kind() != OpKind::kBatchNormTrainingBackward || !bn.has_attr("sync_group")) return false;
  const auto training = bn.attr_bool("is_training");  // set by canonicalize
  return (training.ok() && *training) || bn.outputs().size() == 3;
}

}  // namespace

StatusOr<bool> SplitSyncBatchNormPass::run(Graph& graph) const {
  std::vector<Op> ops;
  std::vector<int64_t> cloned;  // producers now read by the Reduce half through a copy
  bool changed = false;
  for (const Op& bn : graph.ops()) {
    if (!is_synchronized(bn)) {
      ops.push_back(bn);
      continue;
    }
    if (!graph.unknown_shape_error(bn).ok())
      return invalid_graph(bn.label() + ": a synchronized batch norm needs known shapes");
    const std::string group = *bn.attr_string("sync_group");
    const std::string base = bn.name().empty() ? "bn" + std::to_string(bn.id()) : bn.name();
    const LogicalTensor& mean = bn.inputs()[2];
    const int64_t c = mean.dims[0];
    // src and diff_dst as the Reduce half reads them (a clone of a fusible producer's output).
    LogicalTensor reduce_in[2] = {bn.inputs()[0], bn.inputs()[1]};
    for (size_t port = 0; port < 2; ++port) {
      const LogicalTensor& t = bn.inputs()[port];
      const int64_t p = graph.producer_of(t.id);
      if (p < 0 || bn.inputs()[1 - port].id == t.id || is_output_port(graph, t.id)) continue;
      const Op& producer = graph.ops()[static_cast<size_t>(p)];
      if (!is_fusible_producer(producer.kind()) || graph.consumers_of(t.id).size() != 1) continue;
      Op copy(graph.new_op_id(), producer.kind(), producer.name() + "/for_reduce");
      for (const auto& [k, v] : producer.attrs()) copy.set_attr(k, v);
      for (const LogicalTensor& lt : producer.inputs()) copy.add_input(lt);
      LogicalTensor out = t;
      out.id = graph.new_tensor_id();
      copy.add_output(out);
      reduce_in[port] = out;
      ops.push_back(std::move(copy));
      cloned.push_back(producer.id());
    }
    const std::string format = bn.has_attr("data_format") ? *bn.attr_string("data_format") : "NXC";
    Op reduce(graph.new_op_id(), OpKind::kBatchNormBackwardReduce, base + "/reduce");
    reduce.set_attr("data_format", format);
    reduce.add_input(reduce_in[0]).add_input(reduce_in[1]).add_input(mean);
    LogicalTensor local[3] = {LogicalTensor(graph.new_tensor_id(), DataType::kF32, {c}),
                              LogicalTensor(graph.new_tensor_id(), DataType::kF32, {c}),
                              LogicalTensor(graph.new_tensor_id(), DataType::kS64, {1})};
    for (const LogicalTensor& lt : local) reduce.add_output(lt);

    Op all_reduce(graph.new_op_id(), OpKind::kAllReduce, base + "/allreduce");
    all_reduce.set_attr("group", group);
    Op apply(bn.id(), OpKind::kBatchNormBackwardApply, base + "/apply");
    apply.set_attr("epsilon", bn.attrs().at("epsilon"));
    apply.set_attr("data_format", format);
    if (!*bn.attr_bool("is_training")) apply.set_attr("is_training", false);
    if (bn.has_attr("variance_is_inv_std"))
      apply.set_attr("variance_is_inv_std", bn.attrs().at("variance_is_inv_std"));
    for (size_t i = 0; i < 4; ++i) apply.add_input(bn.inputs()[i]);
    for (const LogicalTensor& lt : local) {
      all_reduce.add_input(lt);
      LogicalTensor global = lt;
      global.id = graph.new_tensor_id();
      all_reduce.add_output(global);
      apply.add_input(global);
    }
    if (bn.inputs().size() == 5) apply.add_input(bn.inputs()[4]);
    for (const LogicalTensor& lt : bn.outputs()) apply.add_output(lt);
    ops.push_back(std::move(reduce));
    ops.push_back(std::move(all_reduce));
    ops.push_back(std::move(apply));
    changed = true;
  }
  if (changed) graph.mutable_ops() = std::move(ops);
  return changed;
}

}  // namespace normgrad
