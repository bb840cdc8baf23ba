// Pattern matchers: the structural, dtype and layout rules of each fusion.
#include <normgrad/passes/pattern.hpp>

#include <algorithm>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

// A BatchNormInference whose src a Dequantize produces is an int8 chain's,
// which oneDNN's int8 pattern quantizes around as a whole.
Status outside_int8_chain(const Graph& graph, const Op& bn) {
  const Op* producer = graph.producer(BatchNormInferencePorts(bn).src().id);
  if (producer != nullptr && producer->kind() == OpKind::kDequantize)
    return unimplemented("src comes from " + producer->label() +
                         ": an int8 chain, which oneDNN's int8 pattern takes whole");
  return ok_status();
}

// The three batch-norm backward kinds share their data ports' indices.
constexpr size_t kSrcPort = BatchNormTrainingBackwardPorts::src_port();
constexpr size_t kDiffDstPort = BatchNormTrainingBackwardPorts::diff_dst_port();
static_assert(BatchNormBackwardReducePorts::src_port() == kSrcPort &&
                  BatchNormBackwardApplyPorts::src_port() == kSrcPort &&
                  BatchNormBackwardReducePorts::diff_dst_port() == kDiffDstPort &&
                  BatchNormBackwardApplyPorts::diff_dst_port() == kDiffDstPort,
              "op_ports.def: the backward kinds disagree on src/diff_dst");

bool is_bn_backward(OpKind k) {
  const auto& kinds = bn_backward_kinds();
  return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
}

Pattern fused_pattern(std::string name, std::string backend, std::vector<OpKind> anchors,
                      PatternMatcher match) {
  Pattern p;
  p.name = std::move(name);
  p.backend = std::move(backend);
  p.anchors = std::move(anchors);
  p.fused = true;
  p.match = std::move(match);
  return p;
}

// `t` is read by `reader` alone, on one port, and is not an explicit graph output.
Status only_reader(const Graph& graph, int64_t t, const Op& reader) {
  const std::vector<Use> uses = graph.uses(t);
  for (const Use& u : uses) {
    if (u.op_id != reader.id())
      return unimplemented("tensor " + std::to_string(t) + " has another reader");
  }
  if (uses.size() != 1)
    return unimplemented("tensor " + std::to_string(t) + " feeds " + std::to_string(uses.size()) +
                         " ports of " + reader.label());
  if (is_output_port(graph, t))
    return unimplemented("tensor " + std::to_string(t) + " is a graph output");
  return ok_status();
}

// Two batch norms one walk can take together: src (input 0 of the training
// forward and backward) of the same dims and dtype, the same data_format
// (oneDNN's default NXC when absent).
static_assert(kSrcPort == 0 && BatchNormForwardTrainingPorts::src_port() == 0,
              "op_ports.def: src is input 0 of the training kinds");
bool same_walk(const Op& a, const Op& b) {
  auto format = [](const Op& op) {
    return op.has_attr("data_format") ? *op.attr_string("data_format") : std::string("NXC");
  };
  const LogicalTensor &x = a.inputs()[0], &y = b.inputs()[0];
  return x.dims == y.dims && x.dtype == y.dtype && format(a) == format(b);
}

}  // namespace

bool Pattern::anchored_at(OpKind kind) const {
  return anchors.empty() || std::find(anchors.begin(), anchors.end(), kind) != anchors.end();
}

const std::vector<OpKind>& bn_backward_kinds() {
  static const std::vector<OpKind> kinds = {OpKind::kBatchNormTrainingBackward,
                                            OpKind::kBatchNormBackwardReduce,
                                            OpKind::kBatchNormBackwardApply};
  return kinds;
}

Pattern bn_backward_producers_pattern(std::string backend, bool side_output) {
  return fused_pattern("bn_bwd_producers", std::move(backend), bn_backward_kinds(),
                       [side_output](const Graph& graph, const Op& bn) {
                         return match_bn_backward_producers(graph, bn, side_output);
                       });
}

Pattern bn_backward_siblings_pattern(std::string backend) {
  return fused_pattern("bn_bwd_siblings", std::move(backend), {OpKind::kBatchNormTrainingBackward},
                       match_bn_backward_siblings);
}

Pattern bn_inference_relu_pattern(std::string backend) {
  return fused_pattern("bn_inference_relu", std::move(backend), {OpKind::kBatchNormInference},
                       match_bn_inference_relu);
}

Pattern bn_forward_epilogue_pattern(std::string backend) {
  return fused_pattern("bn_fwd_epilogue", std::move(backend),
                       {OpKind::kBatchNormForwardTraining, OpKind::kBatchNormForwardApply,
                        OpKind::kBatchNormInference},
                       [](const Graph& graph, const Op& bn) {
                         return match_bn_forward_epilogue(graph, bn, /*side_output=*/false);
                       });
}

Pattern bn_forward_side_output_pattern(std::string backend) {
  return fused_pattern("bn_fwd_side_output", std::move(backend),
                       {OpKind::kBatchNormForwardTraining, OpKind::kBatchNormForwardApply},
                       match_bn_forward_side_output);
}

Pattern bn_forward_siblings_pattern(std::string backend) {
  return fused_pattern("bn_fwd_siblings", std::move(backend), {OpKind::kBatchNormForwardTraining},
                       match_bn_forward_siblings);
}

Pattern int8_bn_chain_pattern(std::string backend) {
  return fused_pattern("int8_bn_chain", std::move(backend), {OpKind::kBatchNormInference},
                       match_int8_bn_chain);
}

Pattern bn_inference_pattern(std::string backend) {
  Pattern p = single_op_pattern("bn_inf", std::move(backend), {OpKind::kBatchNormInference});
  p.match = [](const Graph& graph, const Op& bn) -> StatusOr<PatternOps> {
    NG_RETURN_IF_ERROR(outside_int8_chain(graph, bn));
    return PatternOps{{{bn.id(), FusionRole::kAnchor}}, ""};
  };
  return p;
}

Pattern single_op_pattern(std::string name, std::string backend, std::vector<OpKind> kinds) {
  Pattern p;
  p.name = std::move(name);
  p.backend = std::move(backend);
  p.anchors = std::move(kinds);
  p.match = [](const Graph&, const Op& anchor) -> StatusOr<PatternOps> {
    return PatternOps{{{anchor.id(), FusionRole::kAnchor}}, ""};
  };
  return p;
}

Pattern collective_pattern(std::string name, std::string backend) {
  Pattern p = single_op_pattern(std::move(name), std::move(backend), {OpKind::kAllReduce});
  p.collective = true;
  return p;
}

const Op* gradient_add(const Graph& graph, const Op& relu_backward) {
  if (relu_backward.kind() != OpKind::kReLUBackward) return nullptr;
  const LogicalTensor& g = ReLUBackwardPorts(relu_backward).diff_dst();
  const Op* add = graph.producer(g.id);
  if (add == nullptr || add->kind() != OpKind::kAdd) return nullptr;
  if (!only_reader(graph, g.id, relu_backward).ok()) return nullptr;
  for (const LogicalTensor& in : add->inputs()) {  // no broadcast, no mixed dtypes
    if (in.dtype != g.dtype || in.dims != g.dims) return nullptr;
  }
  return add;
}

Status fusible_bn_backward_producer(const Graph& graph, const Op& bn, size_t port,
                                    bool side_output) {
  const LogicalTensor& t = bn.inputs()[port];
  const Op* p = graph.producer(t.id);
  if (p == nullptr) return unimplemented("tensor " + std::to_string(t.id) + " is a graph input");
  const Op& producer = *p;
  if (producer.kind() != OpKind::kReLUBackward && producer.kind() != OpKind::kAdd)
    return unimplemented(producer.label() + " is not ReLUBackward or Add");
  bool uniform = t.dtype == bn.inputs()[kSrcPort].dtype;
  for (const LogicalTensor& in : producer.inputs())  // no broadcast, no mixed dtypes
    uniform = uniform && in.dtype == t.dtype && in.dims == t.dims;
  if (!uniform) return unimplemented(producer.label() + " broadcasts or mixes dtypes");
  const Status alone = only_reader(graph, t.id, bn);
  if (alone.ok() || !side_output || port != kDiffDstPort ||
      bn.kind() != OpKind::kBatchNormTrainingBackward)
    return alone;
  // Read elsewhere too: the kernel writes it as a side output, if the batch
  // norm reads it on diff_dst alone.
  for (const LogicalTensor& in : bn.inputs()) {
    if (&in != &t && in.id == t.id) return alone;  // "feeds 2 ports of ..."
  }
  return ok_status();
}

StatusOr<PatternOps> match_bn_backward_producers(const Graph& graph, const Op& bn,
                                                 bool side_output) {
  if (!is_bn_backward(bn.kind()))
    return unimplemented(bn.label() + " is not a batch-norm backward");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(bn));
  PatternOps m;
  for (size_t port : {kSrcPort, kDiffDstPort}) {
    const bool src = port == kSrcPort;
    const Status s = fusible_bn_backward_producer(graph, bn, port, side_output);
    if (s.ok()) {
      if (!only_reader(graph, bn.inputs()[port].id, bn).ok())
        m.note += std::string(m.note.empty() ? "" : "; ") + "diff_dst: tensor " +
                  std::to_string(bn.inputs()[port].id) + " written as a side output";
      const Op& producer = *graph.producer(bn.inputs()[port].id);
      if (side_output && !src) {
        if (const Op* add = gradient_add(graph, producer)) {
          m.ops.push_back({add->id(), FusionRole::kGradientAdd});
          m.note += std::string(m.note.empty() ? "" : "; ") + "diff_dst: through " + add->label();
        }
      }
      m.ops.push_back(
          {producer.id(), src ? FusionRole::kSrcProducer : FusionRole::kDiffDstProducer});
    } else {
      m.note +=
          std::string(m.note.empty() ? "" : "; ") + (src ? "src: " : "diff_dst: ") + s.message();
    }
  }
  if (m.ops.empty()) return unimplemented("no producer to fuse (" + m.note + ")");
  m.ops.push_back({bn.id(), FusionRole::kAnchor});
  return m;
}

StatusOr<PatternOps> match_bn_backward_siblings(const Graph& graph, const Op& bn) {
  if (bn.kind() != OpKind::kBatchNormTrainingBackward)
    return unimplemented(bn.label() + " is not BatchNormTrainingBackward");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(bn));
  // The producer as the side-output rule takes it (uniform, read on one port
  // of bn), then its readers: bn and one more training backward, both on
  // diff_dst, and nothing else.
  NG_RETURN_IF_ERROR(fusible_bn_backward_producer(graph, bn, kDiffDstPort, /*side_output=*/true));
  const LogicalTensor& t = bn.inputs()[kDiffDstPort];
  if (is_output_port(graph, t.id))
    return unimplemented("tensor " + std::to_string(t.id) + " is a graph output");
  const std::vector<Use> uses = graph.uses(t.id);
  const Op* sib = nullptr;
  for (const Use& u : uses) {
    const Op& reader = *graph.op(u.op_id);
    if (reader.id() == bn.id()) continue;
    if (sib != nullptr || reader.kind() != OpKind::kBatchNormTrainingBackward ||
        u.port != kDiffDstPort)
      return unimplemented("tensor " + std::to_string(t.id) +
                           " is read by other ops than two batch-norm backwards' diff_dst");
    sib = &reader;
  }
  if (sib == nullptr || uses.size() != 2)
    return unimplemented("tensor " + std::to_string(t.id) + " has no second batch-norm reader");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(*sib));
  if (!same_walk(bn, *sib))
    return unimplemented(sib->label() + " differs in src shape, dtype or data_format");
  PatternOps m;
  const Op& producer = *graph.producer(t.id);
  if (const Op* add = gradient_add(graph, producer)) {
    m.ops.push_back({add->id(), FusionRole::kGradientAdd});
    m.note = "diff_dst: through " + add->label() + "; ";
  }
  m.ops.push_back({producer.id(), FusionRole::kDiffDstProducer});
  m.ops.push_back({bn.id(), FusionRole::kAnchor});
  m.ops.push_back({sib->id(), FusionRole::kSibling});
  m.note += "diff_dst: tensor " + std::to_string(t.id) + " read by " + sib->label() + " too";
  return m;
}

StatusOr<PatternOps> match_bn_inference_relu(const Graph& graph, const Op& bn) {
  if (bn.kind() != OpKind::kBatchNormInference)
    return unimplemented(bn.label() + " is not BatchNormInference");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(bn));
  const LogicalTensor& y = BatchNormInferencePorts(bn).dst();
  const Op* relu = sole_consumer(graph, y.id);
  if (relu == nullptr || relu->kind() != OpKind::kReLU)
    return unimplemented("dst is not read by one ReLU alone");
  NG_RETURN_IF_ERROR(only_reader(graph, y.id, *relu));
  if (ReLUPorts(*relu).dst().dtype != y.dtype)
    return unimplemented(relu->label() + " changes the dtype");
  return PatternOps{{{bn.id(), FusionRole::kAnchor}, {relu->id(), FusionRole::kActivation}}, ""};
}

StatusOr<PatternOps> match_int8_bn_chain(const Graph& graph, const Op& bn) {
  NG_ASSIGN_OR_RETURN(PatternOps ops, match_bn_inference_relu(graph, bn));
  const LogicalTensor& src = BatchNormInferencePorts(bn).src();
  const Op* deq = graph.producer(src.id);
  if (deq == nullptr || deq->kind() != OpKind::kDequantize)
    return unimplemented("src is not produced by a Dequantize");
  NG_RETURN_IF_ERROR(only_reader(graph, src.id, bn));
  const Op& relu = *graph.op(ops.ops[1].op_id);
  const int64_t relu_dst = ReLUPorts(relu).dst().id;
  const Op* quant = sole_consumer(graph, relu_dst);
  if (quant == nullptr || quant->kind() != OpKind::kQuantize)
    return unimplemented("the ReLU's dst is not read by one Quantize alone");
  NG_RETURN_IF_ERROR(only_reader(graph, relu_dst, *quant));
  return PatternOps{{{deq->id(), FusionRole::kDequantize},
                     {bn.id(), FusionRole::kAnchor},
                     {relu.id(), FusionRole::kActivation},
                     {quant->id(), FusionRole::kQuantize}},
                    ""};
}

namespace {

// The ReLU or LeakyReLU of y's dtype that reads y: y's only reader, or with
// `side_output` the first such reader among others (y is then a side
// output); nullptr when there is none. An activation has one input, so it
// reads y on one port.
const Op* fusible_activation(const Graph& graph, const LogicalTensor& y, bool side_output) {
  auto activation = [&](const Op* op) {
    return op != nullptr && (op->kind() == OpKind::kReLU || op->kind() == OpKind::kLeakyReLU) &&
           elementwise_dst(*op).dtype == y.dtype;
  };
  const Op* only = sole_consumer(graph, y.id);
  if (activation(only) && only_reader(graph, y.id, *only).ok()) return only;
  if (!side_output) return nullptr;
  for (const Use& u : graph.uses(y.id)) {
    const Op* op = graph.op(u.op_id);
    if (activation(op)) return op;
  }
  return nullptr;
}

}  // namespace

StatusOr<PatternOps> match_bn_forward_epilogue(const Graph& graph, const Op& bn, bool side_output) {
  // The forward, the Apply part of a synchronized one, or the inference
  // (the same dst).
  const bool apply = bn.kind() == OpKind::kBatchNormForwardApply;
  const bool inference = bn.kind() == OpKind::kBatchNormInference;
  if (bn.kind() != OpKind::kBatchNormForwardTraining && !apply && !inference)
    return unimplemented(bn.label() +
                         " is not BatchNormForwardTraining, BatchNormForwardApply or "
                         "BatchNormInference");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(bn));
  if (inference) NG_RETURN_IF_ERROR(outside_int8_chain(graph, bn));
  PatternOps m{{{bn.id(), FusionRole::kAnchor}}, ""};
  LogicalTensor y = apply       ? BatchNormForwardApplyPorts(bn).dst()
                    : inference ? BatchNormInferencePorts(bn).dst()
                                : BatchNormForwardTrainingPorts(bn).dst();
  const Op* next = sole_consumer(graph, y.id);
  if (next != nullptr && next->kind() == OpKind::kAdd && only_reader(graph, y.id, *next).ok()) {
    // The residual must be dst's twin: same dims (no broadcast), same dtype.
    const AddPorts add(*next);
    const LogicalTensor& other = add.src_0().id == y.id ? add.src_1() : add.src_0();
    if (other.id == y.id) {
      m.note = "the Add reads dst twice";
    } else if (other.dims != y.dims || other.dtype != y.dtype || add.dst().dtype != y.dtype) {
      m.note = next->label() + " broadcasts or mixes dtypes";
    } else {
      m.ops.push_back({next->id(), FusionRole::kResidualAdd});
      y = add.dst();
      next = sole_consumer(graph, y.id);
    }
  }
  if (const Op* act = fusible_activation(graph, y, side_output)) {
    m.ops.push_back({act->id(), FusionRole::kActivation});
    if (!only_reader(graph, y.id, *act).ok())
      m.note += std::string(m.note.empty() ? "" : "; ") + "dst: tensor " + std::to_string(y.id) +
                " written as a side output";
  }
  if (m.ops.size() == 1)
    return unimplemented("dst is not read by one Add, ReLU or LeakyReLU alone" +
                         (m.note.empty() ? std::string() : " (" + m.note + ")"));
  return m;
}

StatusOr<PatternOps> match_bn_forward_side_output(const Graph& graph, const Op& bn) {
  NG_ASSIGN_OR_RETURN(PatternOps m, match_bn_forward_epilogue(graph, bn, /*side_output=*/true));
  const Op* act = nullptr;
  for (const BoundOp& b : m.ops) {
    if (b.role == FusionRole::kActivation) act = graph.op(b.op_id);
  }
  if (act != nullptr && !only_reader(graph, act->inputs()[0].id, *act).ok()) return m;
  return unimplemented("no side output: the activation's input has no other reader");
}

StatusOr<PatternOps> match_bn_forward_siblings(const Graph& graph, const Op& bn) {
  if (bn.kind() != OpKind::kBatchNormForwardTraining)
    return unimplemented(bn.label() + " is not BatchNormForwardTraining");
  NG_ASSIGN_OR_RETURN(PatternOps m, match_bn_forward_epilogue(graph, bn, /*side_output=*/false));
  const Op* add = nullptr;
  for (const BoundOp& b : m.ops) {
    if (b.role == FusionRole::kResidualAdd) add = graph.op(b.op_id);
  }
  if (add == nullptr) return unimplemented("dst is not read by a residual Add alone");
  // The residual: the dst of another training forward, read by this Add alone.
  const int64_t y = BatchNormForwardTrainingPorts(bn).dst().id;
  const AddPorts ports(*add);
  const LogicalTensor& r = ports.src_0().id == y ? ports.src_1() : ports.src_0();
  const Op* sib = graph.producer(r.id);
  if (sib == nullptr || sib->kind() != OpKind::kBatchNormForwardTraining ||
      BatchNormForwardTrainingPorts(*sib).dst().id != r.id)
    return unimplemented("the residual is not a BatchNormForwardTraining's dst");
  NG_RETURN_IF_ERROR(graph.unknown_shape_error(*sib));
  NG_RETURN_IF_ERROR(only_reader(graph, r.id, *add));
  if (!same_walk(bn, *sib))
    return unimplemented(sib->label() + " differs in src shape, dtype or data_format");
  m.ops.push_back({sib->id(), FusionRole::kSibling});
  m.note = "the residual: " + sib->label() + "'s dst";
  return m;
}

}  // namespace normgrad
