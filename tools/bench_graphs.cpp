// The graphs `normgrad bench` times (tools/bench_graphs.hpp).
#include "tools/bench_graphs.hpp"

#include <cstdlib>
#include <iostream>

namespace normgrad {
namespace cli {
namespace {

// The bench's graphs are built from fixed ops: a refusal is a bug here, said
// and stopped, never a graph timed with an op missing.
void add_op_or_abort(Graph& g, Op op) {
  const std::string label = op.label();
  const Status s = g.add_op(std::move(op));
  if (!s.ok()) {
    std::cerr << "normgrad bench: internal: the bench graph refused " << label << ": "
              << s.to_string() << "\n";
    std::abort();
  }
}

}  // namespace

// The bench graph: BatchNormTrainingBackward with gamma and 3 outputs, optionally
// fed by ReLUBackward or Add on diff_dst (and with add-relu-side, an Add in
// front of the ReLUBackward). With relu-siblings a second batch norm (src 20,
// statistics 22-24, outputs 25-27) reads the ReLUBackward's output too, as a
// downsampling block's shortcut does; add-relu-siblings has the Add in front
// as well. `nchw` is {N, C, H, W}.
Graph make_graph(const Dims& nchw, const std::string& layout, DataType dt,
                 const std::string& fused) {
  const Dims data = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
  const int64_t c = nchw[1];
  Graph g;
  int64_t dy_id = 1;
  const bool side = fused == "relu-side" || fused == "add-relu-side";
  const bool siblings = fused == "relu-siblings" || fused == "add-relu-siblings";
  if (fused == "add-relu-side" ||
      fused == "add-relu-siblings") {  // the gradient Add: the ReLUBackward's gradient is 11's sum
    Op add(2, OpKind::kAdd, "gradient_add");
    add.add_input(LogicalTensor(13, dt, data))
        .add_input(LogicalTensor(14, dt, data))
        .add_output(LogicalTensor(11, dt, data));
    add_op_or_abort(g, add);
  }
  if (fused != "none") {
    const bool relu = fused == "relu" || side || siblings;
    Op pre(1, relu ? OpKind::kReLUBackward : OpKind::kAdd, relu ? "relu_bwd" : fused);
    if (relu) pre.set_attr("use_dst", true);
    pre.add_input(LogicalTensor(10, dt, data))
        .add_input(LogicalTensor(11, dt, data))
        .add_output(LogicalTensor(12, dt, data));
    add_op_or_abort(g, pre);
    dy_id = 12;
  }
  Op bn(0, OpKind::kBatchNormTrainingBackward, "bn");
  bn.set_attr("epsilon", 1e-5f).set_attr("data_format", layout);
  bn.add_input(LogicalTensor(0, dt, data)).add_input(LogicalTensor(dy_id, dt, data));
  for (int i = 2; i <= 4; ++i) bn.add_input(LogicalTensor(i, DataType::kF32, {c}));
  bn.add_output(LogicalTensor(5, dt, data))
      .add_output(LogicalTensor(6, DataType::kF32, {c}))
      .add_output(LogicalTensor(7, DataType::kF32, {c}));
  add_op_or_abort(g, bn);
  if (siblings) {
    Op second(3, OpKind::kBatchNormTrainingBackward, "shortcut_bn");
    second.set_attr("epsilon", 1e-5f).set_attr("data_format", layout);
    second.add_input(LogicalTensor(20, dt, data)).add_input(LogicalTensor(dy_id, dt, data));
    for (int i = 22; i <= 24; ++i) second.add_input(LogicalTensor(i, DataType::kF32, {c}));
    second.add_output(LogicalTensor(25, dt, data))
        .add_output(LogicalTensor(26, DataType::kF32, {c}))
        .add_output(LogicalTensor(27, DataType::kF32, {c}));
    add_op_or_abort(g, second);
  }
  // relu-side: the gradient through the ReLU is a result too (as a residual
  // block's, which its shortcut also reads).
  if (side) g.set_output_ports({5, 6, 7, 12});
  return g;
}

// The forward bench graph: BatchNormForwardTraining with gamma and beta,
// optionally followed by ReLU ("relu") or by Add of a residual and ReLU
// ("add": ResNet's BN -> Add -> ReLU); with "add-siblings" the residual is a
// second batch norm's dst (src 20, statistics 21-24), a downsampling block's
// shortcut. relu-side and add-relu-side are relu and add with the ReLU's
// input a graph output too (as a LeakyReLU's backward reads it).
Graph make_forward_graph(const Dims& nchw, const std::string& layout, DataType dt,
                         const std::string& fused) {
  const Dims data = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
  const int64_t c = nchw[1];
  Graph g;
  Op bn(0, OpKind::kBatchNormForwardTraining, "bn");
  bn.set_attr("epsilon", 1e-5f).set_attr("data_format", layout);
  bn.add_input(LogicalTensor(0, dt, data));
  for (int i = 1; i <= 4; ++i) bn.add_input(LogicalTensor(i, DataType::kF32, {c}));
  bn.add_output(LogicalTensor(5, dt, data));
  for (int i = 6; i <= 9; ++i) bn.add_output(LogicalTensor(i, DataType::kF32, {c}));
  add_op_or_abort(g, bn);
  int64_t y = 5;
  if (fused == "add-siblings") {
    Op second(3, OpKind::kBatchNormForwardTraining, "shortcut_bn");
    second.set_attr("epsilon", 1e-5f).set_attr("data_format", layout);
    second.add_input(LogicalTensor(20, dt, data));
    for (int i = 21; i <= 24; ++i) second.add_input(LogicalTensor(i, DataType::kF32, {c}));
    second.add_output(LogicalTensor(10, dt, data));
    for (int i = 25; i <= 28; ++i) second.add_output(LogicalTensor(i, DataType::kF32, {c}));
    add_op_or_abort(g, second);
  }
  if (fused == "add" || fused == "add-siblings" || fused == "add-relu-side") {
    Op add(1, OpKind::kAdd, "add");
    add.add_input(LogicalTensor(5, dt, data))
        .add_input(LogicalTensor(10, dt, data))
        .add_output(LogicalTensor(11, dt, data));
    add_op_or_abort(g, add);
    y = 11;
  }
  if (fused != "none") {
    Op relu(2, OpKind::kReLU, "relu");
    relu.add_input(LogicalTensor(y, dt, data)).add_output(LogicalTensor(12, dt, data));
    add_op_or_abort(g, relu);
  }
  if (fused == "relu-side" || fused == "add-relu-side") g.set_output_ports({6, 7, 8, 9, y, 12});
  return g;
}

Graph make_phase_graph(const Dims& nchw, const std::string& layout, DataType dt, bool reduce) {
  const Dims data = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
  const int64_t c = nchw[1];
  Graph g;
  Op op(0, reduce ? OpKind::kBatchNormBackwardReduce : OpKind::kBatchNormBackwardApply,
        reduce ? "reduce" : "apply");
  op.set_attr("data_format", layout);
  op.add_input(LogicalTensor(0, dt, data))
      .add_input(LogicalTensor(1, dt, data))
      .add_input(LogicalTensor(2, DataType::kF32, {c}));
  if (reduce) {
    op.add_output(LogicalTensor(5, DataType::kF32, {c}))
        .add_output(LogicalTensor(6, DataType::kF32, {c}))
        .add_output(LogicalTensor(7, DataType::kS64, {1}));
  } else {
    op.set_attr("epsilon", 1e-5f);
    op.add_input(LogicalTensor(3, DataType::kF32, {c}))
        .add_input(LogicalTensor(8, DataType::kF32, {c}))
        .add_input(LogicalTensor(9, DataType::kF32, {c}))
        .add_input(LogicalTensor(10, DataType::kS64, {1}))
        .add_input(LogicalTensor(4, DataType::kF32, {c}));
    op.add_output(LogicalTensor(11, dt, data));
  }
  add_op_or_abort(g, op);
  return g;
}

Graph make_from_dst_graph(const Dims& nchw, const std::string& layout, DataType dt, float alpha) {
  const Dims data = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
  const int64_t c = nchw[1];
  Op op(0, OpKind::kBatchNormTrainingBackwardFromDst, "abn_bwd");
  op.set_attr("epsilon", 1e-5f).set_attr("data_format", layout);
  op.set_attr("activation", std::string("leaky_relu")).set_attr("alpha", alpha);
  op.add_input(LogicalTensor(0, dt, data)).add_input(LogicalTensor(1, dt, data));
  for (int i = 2; i <= 4; ++i) op.add_input(LogicalTensor(i, DataType::kF32, {c}));
  op.add_output(LogicalTensor(5, dt, data))
      .add_output(LogicalTensor(6, DataType::kF32, {c}))
      .add_output(LogicalTensor(7, DataType::kF32, {c}));
  Graph g;
  add_op_or_abort(g, op);
  return g;
}

NamedShapes bench_shape_set(const std::string& name) {
  if (name == "cached") {
    // Cache-resident problems (1.6 and 1.6 MB of src + diff_dst in f32): the
    // limit is instructions, not DRAM, so a slow-memory host cannot hide an
    // inefficient kernel. GB/s here is on cached data, not a DRAM roofline share.
    return {{"1x256x28x28", {1, 256, 28, 28}}, {"4x512x14x14", {4, 512, 14, 14}}};
  }
  if (name != "small" && name != "resnet50") return {};
  NamedShapes shapes;
  if (name == "resnet50") {
    shapes = {{"32x64x112x112", {32, 64, 112, 112}},
              {"32x256x56x56", {32, 256, 56, 56}},
              {"32x512x28x28", {32, 512, 28, 28}},
              {"32x1024x14x14", {32, 1024, 14, 14}},
              {"32x2048x7x7", {32, 2048, 7, 7}}};
  }
  shapes.push_back({"1x32x28x28", {1, 32, 28, 28}});
  shapes.push_back({"2x192x71x71", {2, 192, 71, 71}});
  return shapes;
}

}  // namespace cli
}  // namespace normgrad
