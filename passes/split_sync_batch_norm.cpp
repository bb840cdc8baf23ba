// SplitSyncBatchNormPass: Reduce -> AllReduce -> Apply for synchronized batch norms.
#include <normgrad/passes/split_sync_batch_norm.hpp>

#include <algorithm>
#include <charconv>
#include <sstream>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/pattern.hpp>
#include <normgrad/passes/rewrite_driver.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

// Training, or frozen statistics with diff_gamma/diff_beta (sums over the
// whole batch too); a frozen diff_src alone needs nothing from other processes.
bool is_synchronized(const Op& bn) {
  if (bn.kind() != OpKind::kBatchNormTrainingBackward || !bn.has_attr("sync_group")) return false;
  const auto training = bn.attr_bool("is_training");  // set by canonicalize
  return (training.ok() && *training) || bn.outputs().size() == 3;
}

// What every process must run alike for the AllReduce `role` of `bn`: its
// kind, src dtype, layout, channels, epsilon and momentum (not the batch:
// each process holds its own slice). AllReduce's `signature` attribute.
std::string signature(const Op& bn, const char* role, int64_t channels, const std::string& format) {
  std::ostringstream s;
  s << op_kind_name(bn.kind()) << "/" << role << " " << dtype_name(bn.inputs()[0].dtype) << " "
    << format << " C=" << channels;
  for (const char* attr : {"epsilon", "momentum"}) {
    auto v = bn.attr_f32(attr);
    if (!v.ok()) continue;
    char text[32];
    const auto end = std::to_chars(text, text + sizeof(text), *v).ptr;  // shortest, exact
    s << " " << attr << "=" << std::string(text, end);
  }
  return s.str();
}

// What both halves of a split name: the group, the new ops' name prefix and
// the data format; a synchronized batch norm needs known shapes.
struct SplitNames {
  std::string group, base, format;
};

StatusOr<SplitNames> split_names(const Graph& graph, const Op& bn) {
  if (!graph.unknown_shape_error(bn).ok())
    return invalid_graph(bn.label() + ": a synchronized batch norm needs known shapes");
  SplitNames n;
  n.group = *bn.attr_string("sync_group");
  n.base = bn.name().empty() ? "bn" + std::to_string(bn.id()) : bn.name();
  n.format = bn.has_attr("data_format") ? *bn.attr_string("data_format") : "NXC";
  return n;
}

// The forward: Reduce (this process's sum, M2 about its mean and count, in
// f64) -> AllReduce (sum, count) -> Merge (M2 moved to the global mean) ->
// AllReduce (M2) -> Apply, which keeps the op's id and outputs, so an
// epilogue after it still fuses.
Status split_forward(Graph& graph, const Op& bn) {
  NG_ASSIGN_OR_RETURN(const SplitNames names, split_names(graph, bn));
  const std::string& group = names.group;
  const std::string& base = names.base;
  const std::string& format = names.format;
  const BatchNormForwardTrainingPorts ports(bn);
  const int64_t c = ports.mean().dims[0];
  auto f64 = [&] { return LogicalTensor(graph.new_tensor_id(), DataType::kF64, {c}); };
  auto count = [&] { return LogicalTensor(graph.new_tensor_id(), DataType::kS64, {1}); };
  const LogicalTensor lsum = f64(), lm2 = f64(), lcount = count();
  const LogicalTensor gsum = f64(), gcount = count(), m2_part = f64(), gm2 = f64();

  Op reduce(graph.new_op_id(), OpKind::kBatchNormForwardReduce, base + "/reduce");
  reduce.set_attr("data_format", format);
  reduce.add_input(ports.src()).add_output(lsum).add_output(lm2).add_output(lcount);
  Op sums(graph.new_op_id(), OpKind::kAllReduce, base + "/allreduce_sum");
  sums.set_attr("group", group).set_attr("signature", signature(bn, "sum", c, format));
  sums.add_input(lsum).add_input(lcount).add_output(gsum).add_output(gcount);
  Op merge(graph.new_op_id(), OpKind::kBatchNormForwardMerge, base + "/merge");
  merge.add_input(lsum).add_input(lm2).add_input(lcount).add_input(gsum).add_input(gcount);
  merge.add_output(m2_part);
  Op m2s(graph.new_op_id(), OpKind::kAllReduce, base + "/allreduce_m2");
  m2s.set_attr("group", group).set_attr("signature", signature(bn, "m2", c, format));
  m2s.add_input(m2_part).add_output(gm2);
  Op apply(bn.id(), OpKind::kBatchNormForwardApply, base + "/apply");
  for (const char* attr : {"epsilon", "momentum"}) {
    if (bn.has_attr(attr)) apply.set_attr(attr, bn.attrs().at(attr));
  }
  apply.set_attr("data_format", format);
  apply.add_input(ports.src()).add_input(ports.mean()).add_input(ports.variance());
  apply.add_input(gsum).add_input(gm2).add_input(gcount);
  if (ports.has_gamma()) apply.add_input(ports.gamma()).add_input(ports.beta());
  for (const LogicalTensor& lt : bn.outputs()) apply.add_output(lt);
  for (Op* op : {&reduce, &sums, &merge, &m2s})
    NG_RETURN_IF_ERROR(graph.insert_op(std::move(*op), bn.id()));
  return graph.replace_op(bn.id(), std::move(apply));
}

// The backward: Reduce (this process's sums and count) -> AllReduce ->
// Apply, which keeps the op's id and outputs; a fusible producer of src or
// diff_dst is cloned for the Reduce, so both halves still fuse it.
Status split_backward(Graph& graph, const Op& bn) {
  NG_ASSIGN_OR_RETURN(const SplitNames names, split_names(graph, bn));
  const std::string& group = names.group;
  const std::string& base = names.base;
  const std::string& format = names.format;
  const BatchNormTrainingBackwardPorts ports(bn);
  const LogicalTensor& mean = ports.mean();
  const int64_t c = mean.dims[0];
  // src and diff_dst as the Reduce half reads them (a clone of a fusible producer's output).
  LogicalTensor reduce_in[2] = {ports.src(), ports.diff_dst()};
  for (size_t port : {ports.src_port(), ports.diff_dst_port()}) {
    const LogicalTensor& t = bn.inputs()[port];
    if (!fusible_bn_backward_producer(graph, bn, port).ok()) continue;
    const Op& producer = *graph.producer(t.id);
    Op copy(graph.new_op_id(), producer.kind(), producer.name() + "/for_reduce");
    for (const auto& [k, v] : producer.attrs()) copy.set_attr(k, v);
    for (const LogicalTensor& lt : producer.inputs()) copy.add_input(lt);
    LogicalTensor out = t;
    out.id = graph.new_tensor_id();
    copy.add_output(out);
    reduce_in[port] = out;
    NG_RETURN_IF_ERROR(graph.insert_op(std::move(copy), bn.id()));
  }
  Op reduce(graph.new_op_id(), OpKind::kBatchNormBackwardReduce, base + "/reduce");
  reduce.set_attr("data_format", format);
  reduce.add_input(reduce_in[0]).add_input(reduce_in[1]).add_input(mean);
  LogicalTensor local[3] = {LogicalTensor(graph.new_tensor_id(), DataType::kF32, {c}),
                            LogicalTensor(graph.new_tensor_id(), DataType::kF32, {c}),
                            LogicalTensor(graph.new_tensor_id(), DataType::kS64, {1})};
  for (const LogicalTensor& lt : local) reduce.add_output(lt);

  Op all_reduce(graph.new_op_id(), OpKind::kAllReduce, base + "/allreduce");
  all_reduce.set_attr("group", group).set_attr("signature", signature(bn, "sums", c, format));
  Op apply(bn.id(), OpKind::kBatchNormBackwardApply, base + "/apply");
  apply.set_attr("epsilon", bn.attrs().at("epsilon"));
  apply.set_attr("data_format", format);
  if (!*bn.attr_bool("is_training")) apply.set_attr("is_training", false);
  if (bn.has_attr("variance_is_inv_std"))
    apply.set_attr("variance_is_inv_std", bn.attrs().at("variance_is_inv_std"));
  apply.add_input(ports.src()).add_input(ports.diff_dst()).add_input(mean);
  apply.add_input(ports.variance());
  for (const LogicalTensor& lt : local) {
    all_reduce.add_input(lt);
    LogicalTensor global = lt;
    global.id = graph.new_tensor_id();
    all_reduce.add_output(global);
    apply.add_input(global);
  }
  if (ports.has_gamma()) apply.add_input(ports.gamma());
  for (const LogicalTensor& lt : bn.outputs()) apply.add_output(lt);
  NG_RETURN_IF_ERROR(graph.insert_op(std::move(reduce), bn.id()));
  NG_RETURN_IF_ERROR(graph.insert_op(std::move(all_reduce), bn.id()));
  NG_RETURN_IF_ERROR(graph.replace_op(bn.id(), std::move(apply)));
  return ok_status();
}

}  // namespace

StatusOr<bool> SplitSyncBatchNormPass::run(Graph& graph) const {
  // Each batch norm is rewritten once, into kinds no pattern anchors at.
  // The ops are copied first: the edits replace them.
  RewritePattern forward{"split-sync-forward",
                         {OpKind::kBatchNormForwardTraining},
                         [](Graph& g, const Op& op) -> StatusOr<bool> {
                           if (!op.has_attr("sync_group")) return false;
                           const Op bn = op;
                           NG_RETURN_IF_ERROR(split_forward(g, bn));
                           return true;
                         }};
  RewritePattern backward{"split-sync-backward",
                          {OpKind::kBatchNormTrainingBackward},
                          [](Graph& g, const Op& op) -> StatusOr<bool> {
                            if (!is_synchronized(op)) return false;
                            const Op bn = op;
                            NG_RETURN_IF_ERROR(split_backward(g, bn));
                            return true;
                          }};
  return apply_patterns_greedily(graph, {forward, backward});
}

}  // namespace normgrad
