// Schemas of the ops that sit around batch norm in training graphs: ReLU,
// ReLUBackward, Add, TypeCast, StaticTranspose and End, as oneDNN Graph spells them.
//
// Add follows oneDNN Graph: numpy broadcasting and mixed float dtypes; the
// fast backends take the equal-shape, one-dtype case and ref the rest.
#include <algorithm>
#include <cmath>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace {

// Every input and output has the dtype of input 0.
Status same_dtype_everywhere(const Op& op, const OpSchema& names_of) {
  const DataType t = op.inputs()[0].dtype;
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    if (op.inputs()[i].dtype != t) {
      return invalid_argument(port_label(op, true, i, names_of.input_name(i)) + ": dtype " +
                              dtype_name(op.inputs()[i].dtype) + " differs from input 0's " +
                              dtype_name(t));
    }
  }
  for (size_t i = 0; i < op.outputs().size(); ++i) {
    if (op.outputs()[i].dtype != t) {
      return invalid_argument(port_label(op, false, i, names_of.output_name(i)) + ": dtype " +
                              dtype_name(op.outputs()[i].dtype) + " differs from input 0's " +
                              dtype_name(t));
    }
  }
  return ok_status();
}

// Output 0 takes input 0's dims; every other input must have the same dims.
Status same_shape_rule(Op& op, const std::vector<std::string>& in_names,
                       const std::string& out_name, const char* why) {
  const Dims& d = op.inputs()[0].dims;
  for (size_t i = 1; i < op.inputs().size(); ++i) {
    if (op.inputs()[i].dims != d) {
      return invalid_argument(port_label(op, true, i, in_names.at(i)) + ": shape " +
                              dims_to_string(op.inputs()[i].dims) + " differs from input 0's " +
                              dims_to_string(d) + why);
    }
  }
  if (op.outputs().empty()) return ok_status();
  return set_or_check_dims(op, 0, out_name, d);
}

// Registers `s` with the rule that all dtypes agree, after copying the port names it needs.
void add_uniform(OpRegistry& registry, OpSchema s) {
  auto names = std::make_shared<OpSchema>(s);
  s.rule([names](const Op& op) { return same_dtype_everywhere(op, *names); });
  std::vector<std::string> in_names;
  for (const PortSpec& p : s.inputs()) in_names.push_back(p.name);
  const std::string out_name = s.outputs().empty() ? "" : s.outputs()[0].name;
  const bool is_add = s.kind() == OpKind::kAdd;
  s.shape_rule([in_names, out_name, is_add](Op& op) {
    return same_shape_rule(op, in_names, out_name,
                           is_add ? " (broadcasting is not supported: give equal shapes)" : "");
  });
  registry.add(std::move(s));
}

// numpy broadcasting (auto_broadcast = numpy, the default): shapes align on
// the right, and each pair of dims is equal or one of them is 1.
Status broadcast_shape_rule(Op& op) {
  const Dims& a = op.inputs()[0].dims;
  const Dims& b = op.inputs()[1].dims;
  std::string mode = "numpy";
  if (op.has_attr("auto_broadcast")) {
    NG_ASSIGN_OR_RETURN(mode, op.attr_string("auto_broadcast"));
  }
  if (mode == "none") {
    if (a != b) {
      return invalid_argument(port_label(op, true, 1, "src_1") + ": shape " + dims_to_string(b) +
                              " differs from src_0's " + dims_to_string(a) +
                              " and auto_broadcast is 'none'");
    }
    return set_or_check_dims(op, 0, "dst", a);
  }
  const size_t rank = std::max(a.size(), b.size());
  Dims out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return invalid_argument(port_label(op, true, 1, "src_1") + ": shape " + dims_to_string(b) +
                              " does not broadcast against src_0's " + dims_to_string(a) +
                              " (numpy rules: dims equal or 1, aligned on the right)");
    }
    out[i] = da == 1 ? db : da;
  }
  return set_or_check_dims(op, 0, "dst", out);
}

// Quantize / Dequantize: scales (and zero points) per tensor, or per channel
// along `axis` with one entry per element of that dim.
Status quant_rule(const Op& op) {
  const bool quantize = op.kind() == OpKind::kQuantize;
  const LogicalTensor& data = quantize ? op.inputs()[0] : op.outputs()[0];
  const LogicalTensor& q = quantize ? op.outputs()[0] : op.inputs()[0];
  if (!is_float_compute_dtype(data.dtype)) {
    return invalid_argument(op.label() + ": the real-valued side is " + dtype_name(data.dtype) +
                            ", expected f32, bf16 or f16");
  }
  const DataType qt = q.dtype;
  if (is_float_compute_dtype(qt)) {
    return invalid_argument(op.label() + ": the quantized side is " + dtype_name(qt) +
                            ", expected s8, u8, f8_e5m2 or f8_e4m3");
  }
  const auto& scales = std::get<std::vector<float>>(op.attrs().at("scales"));  // kind checked
  std::vector<int64_t> zps;
  if (op.has_attr("zps")) {
    NG_ASSIGN_OR_RETURN(zps, op.attr_s64s("zps"));
  }
  for (float sc : scales) {
    if (!(sc != 0.0f) || !std::isfinite(sc)) {
      return invalid_argument(op.label() + ": attribute 'scales' has " + std::to_string(sc) +
                              ", expected finite non-zero values");
    }
  }
  if (!zps.empty() && zps.size() != scales.size()) {
    return invalid_argument(op.label() + ": attribute 'zps' has " + std::to_string(zps.size()) +
                            " entries, 'scales' has " + std::to_string(scales.size()));
  }
  std::string qtype = "per_tensor";
  if (op.has_attr("qtype")) {
    NG_ASSIGN_OR_RETURN(qtype, op.attr_string("qtype"));
  }
  if (qtype == "per_tensor" && scales.size() != 1) {
    return invalid_argument(op.label() + ": per_tensor takes one scale, got " +
                            std::to_string(scales.size()));
  }
  return ok_status();
}

Status quant_shape_rule(Op& op) {
  const Dims& d = op.inputs()[0].dims;
  std::string qtype = "per_tensor";
  if (op.has_attr("qtype")) {
    NG_ASSIGN_OR_RETURN(qtype, op.attr_string("qtype"));
  }
  if (qtype == "per_channel") {
    int64_t axis = 1;
    if (op.has_attr("axis")) {
      NG_ASSIGN_OR_RETURN(axis, op.attr_s64("axis"));
    }
    const auto rank = static_cast<int64_t>(d.size());
    if (axis < -rank || axis >= rank) {
      return invalid_argument(op.label() + ": attribute 'axis' is " + std::to_string(axis) +
                              ", out of range for rank " + std::to_string(rank));
    }
    // The scale count is not checked against dims[axis] here: oneDNN's own
    // graphs dequantize grouped convolution weights per output channel with
    // more scales than that dim holds. Backends decline what they cannot map.
  }
  return set_or_check_dims(op, 0, "dst", d);
}

}  // namespace

void register_elementwise_schemas(OpRegistry& registry) {
  const std::vector<DataType> kAllDtypes = {
      DataType::kF32,    DataType::kBF16, DataType::kF16,     DataType::kS8,  DataType::kU8,
      DataType::kS32,    DataType::kS64,  DataType::kBoolean, DataType::kF64, DataType::kF8E5M2,
      DataType::kF8E4M3, DataType::kS4,   DataType::kU4};
  {
    OpSchema s(OpKind::kReLU);
    add_declared_ports(s);
    s.inplace(ReLUPorts::src_port(), ReLUPorts::dst_port());
    add_uniform(registry, std::move(s));
  }
  {
    // oneDNN Graph's LeakyReLU: dst = src >= 0 ? src : alpha src.
    OpSchema s(OpKind::kLeakyReLU);
    add_declared_ports(s);
    s.inplace(LeakyReLUPorts::src_port(), LeakyReLUPorts::dst_port());
    s.attr("alpha", AttrKind::kF32, true);
    s.rule([](const Op& op) -> Status {
      NG_ASSIGN_OR_RETURN(float alpha, op.attr_f32("alpha"));
      if (!std::isfinite(alpha))
        return invalid_argument(op.label() + ": attribute 'alpha' must be finite, got " +
                                std::to_string(alpha));
      return ok_status();
    });
    add_uniform(registry, std::move(s));
  }
  {
    // oneDNN Graph's Sigmoid: dst = 1 / (1 + exp(-src)).
    OpSchema s(OpKind::kSigmoid);
    add_declared_ports(s);
    s.inplace(SigmoidPorts::src_port(), SigmoidPorts::dst_port());
    add_uniform(registry, std::move(s));
  }
  {
    // use_dst = true: input 0 is ReLU's dst; false: it is ReLU's src. Both mask by x > 0.
    OpSchema s(OpKind::kReLUBackward);
    add_declared_ports(s);
    s.inplace(ReLUBackwardPorts::diff_dst_port(), ReLUBackwardPorts::diff_src_port());
    s.attr("use_dst", AttrKind::kBool, false, true);
    add_uniform(registry, std::move(s));
  }
  {
    // oneDNN Graph's Add: numpy broadcasting by default, and the two sources and
    // the destination may differ in dtype (f32 + bf16 -> f32 is common in
    // mixed-precision graphs). The sum is computed in f32 or wider. s32 as
    // oneDNN's spec allows it (attention masks in newer oneDNN graphs), run by
    // ref (oneDNN 2.6's binary primitive is not asked for integers).
    OpSchema s(OpKind::kAdd);
    add_declared_ports(s);
    s.inplace(AddPorts::src_0_port(), AddPorts::dst_port());  // where their metadata agree
    s.dtypes({DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kS32});
    s.attr("auto_broadcast", AttrKind::kString, false, std::string("numpy"), {"none", "numpy"});
    s.shape_rule(broadcast_shape_rule);
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kTypeCast);
    add_declared_ports(s);
    s.shape_rule([](Op& op) {
      return set_or_check_dims(op, TypeCastPorts::dst_port(), "dst", TypeCastPorts(op).src().dims);
    });
    registry.add(std::move(s));
  }
  {
    // Moves data of any dtype (int8 attention graphs transpose u8/s8 tensors);
    // ref runs the dtypes it can load, other partitions are handed back.
    OpSchema s(OpKind::kStaticTranspose);
    add_declared_ports(s);
    s.dtypes(kAllDtypes);
    s.attr("order", AttrKind::kS64s, true);
    auto names = std::make_shared<OpSchema>(s);
    s.rule([names](const Op& op) { return same_dtype_everywhere(op, *names); });
    s.shape_rule([](Op& op) -> Status {
      const Dims& d = StaticTransposePorts(op).src().dims;
      NG_ASSIGN_OR_RETURN(std::vector<int64_t> order, op.attr_s64s("order"));
      const auto rank = static_cast<int64_t>(d.size());
      if (static_cast<int64_t>(order.size()) != rank) {
        return invalid_argument(op.label() + ": attribute 'order' has " +
                                std::to_string(order.size()) + " entries, expected the rank " +
                                std::to_string(rank));
      }
      std::vector<bool> seen(d.size(), false);
      Dims out(d.size());
      for (size_t i = 0; i < order.size(); ++i) {
        int64_t axis = order[i] < 0 ? order[i] + rank : order[i];
        if (axis < 0 || axis >= rank || seen[axis]) {
          return invalid_argument(op.label() + ": attribute 'order' is not a permutation of 0.." +
                                  std::to_string(rank - 1) + " (entry " + std::to_string(i) +
                                  " is " + std::to_string(order[i]) + ")");
        }
        seen[axis] = true;
        out[i] = d[axis];
      }
      return set_or_check_dims(op, 0, "dst", out);
    });
    registry.add(std::move(s));
  }
  for (OpKind kind : {OpKind::kQuantize, OpKind::kDequantize}) {
    // oneDNN Graph's static quantization: Quantize dst = saturate(round(src /
    // scale + zp)); Dequantize dst = (src - zp) * scale.
    OpSchema s(kind);
    add_declared_ports(s);
    s.attr("qtype", AttrKind::kString, false, std::string("per_tensor"),
           {"per_tensor", "per_channel"});
    s.attr("axis", AttrKind::kS64, false, int64_t{1});
    s.attr("scales", AttrKind::kF32s, true);
    s.attr("zps", AttrKind::kS64s, false);
    s.dtypes({DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kS8, DataType::kU8,
              DataType::kF8E5M2, DataType::kF8E4M3});
    s.rule(quant_rule);
    s.shape_rule(quant_shape_rule);
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kEnd);
    add_declared_ports(s);
    s.dtypes(kAllDtypes);
    registry.add(std::move(s));
  }
}

}  // namespace normgrad
