// Schemas of TensorFlow's FusedBatchNormGrad, FusedBatchNormGradV2 and
// FusedBatchNormGradV3, with tf.raw_ops' names, port order and attributes.
//
// Validation covers at least what TensorFlow added after CVE-2021-41223 and
// CVE-2021-29583: x and y_backprop have one shape of rank 4 (5 for the 3-D
// formats), and scale, reserve_space_1 and reserve_space_2 are 1-D with
// exactly C elements. Messages follow TensorFlow's wording, prefixed with op
// and port. The canonicalisation pass rewrites these ops into
// BatchNormTrainingBackward; no backend sees them.
#include <cmath>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>
#include <normgrad/ops/tf_batch_norm.hpp>

namespace normgrad {
namespace {

constexpr size_t kYBackprop = 0, kX = 1, kScale = 2, kReserve1 = 3, kReserve2 = 4;

std::string shape_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// TensorFlow's and oneDNN's spellings of the three dtypes.
StatusOr<DataType> parse_tf_dtype(const std::string& s) {
  if (s == "float" || s == "DT_FLOAT" || s == "f32") return DataType::kF32;
  if (s == "half" || s == "DT_HALF" || s == "f16") return DataType::kF16;
  if (s == "bfloat16" || s == "DT_BFLOAT16" || s == "bf16") return DataType::kBF16;
  return invalid_argument("'" + s + "' is not one of float, half, bfloat16");
}

Status dtype_rule(const Op& op, const std::vector<std::string>& in_names,
                  const std::vector<std::string>& out_names) {
  const bool v1 = op.kind() == OpKind::kFusedBatchNormGrad;
  const DataType t = op.inputs()[kYBackprop].dtype;
  if (v1 ? t != DataType::kF32
         : (t != DataType::kF32 && t != DataType::kBF16 && t != DataType::kF16)) {
    return invalid_argument(
        port_label(op, true, kYBackprop, in_names[kYBackprop]) + ": T is " + dtype_name(t) +
        (v1 ? ", FusedBatchNormGrad takes float only" : ", expected one of f32, bf16, f16"));
  }
  auto check = [&](bool is_input, size_t i, DataType dt) -> Status {
    const bool data = is_input ? (i == kYBackprop || i == kX) : i == 0;
    const DataType want = data ? t : DataType::kF32;
    if (dt != want) {
      return invalid_argument(port_label(op, is_input, i, is_input ? in_names[i] : out_names[i]) +
                              ": dtype " + dtype_name(dt) + ", expected " + dtype_name(want) +
                              (data ? " (T)" : " (U = f32)"));
    }
    return ok_status();
  };
  for (size_t i = 0; i < op.inputs().size(); ++i)
    NG_RETURN_IF_ERROR(check(true, i, op.inputs()[i].dtype));
  for (size_t i = 0; i < op.outputs().size(); ++i)
    NG_RETURN_IF_ERROR(check(false, i, op.outputs()[i].dtype));
  for (const char* key : {"T", "U"}) {
    if (!op.has_attr(key)) continue;
    NG_ASSIGN_OR_RETURN(std::string name, op.attr_string(key));
    auto dt = parse_tf_dtype(name);
    if (!dt.ok()) return dt.status().with_context(op.label() + ": attribute '" + key + "'");
    const DataType want = key[0] == 'T' ? t : DataType::kF32;
    if (*dt != want) {
      return invalid_argument(op.label() + ": attribute '" + key + "' is " + name +
                              " but the tensors are " + dtype_name(want));
    }
  }
  return ok_status();
}

Status shape_rule(Op& op, const std::vector<std::string>& in_names,
                  const std::vector<std::string>& out_names) {
  NG_ASSIGN_OR_RETURN(TfBatchNormFormat f, tf_batch_norm_format(op));
  const Dims& x = op.inputs()[kX].dims;
  const Dims& dy = op.inputs()[kYBackprop].dims;
  const int rank = f.spatial_rank + 2;
  if (static_cast<int>(x.size()) != rank) {
    return invalid_argument(port_label(op, true, kX, in_names[kX]) + ": x must be a " +
                            std::to_string(rank) + "-dimensional tensor for data_format " + f.name +
                            ", got shape " + shape_str(x));
  }
  if (x != dy) {
    return invalid_argument(port_label(op, true, kYBackprop, in_names[kYBackprop]) +
                            ": x and y_backprop must have the same shape, but x has shape " +
                            shape_str(x) + " and y_backprop has shape " + shape_str(dy));
  }
  const int64_t c = x[f.channels_last ? rank - 1 : 1];
  for (size_t i : {kScale, kReserve1, kReserve2}) {
    const LogicalTensor& t = op.inputs()[i];
    const std::string where = port_label(op, true, i, in_names[i]);
    if (t.rank() != 1) {
      return invalid_argument(where + ": " + in_names[i] + " must be 1-dimensional, got shape " +
                              shape_str(t.dims));
    }
    if (t.dims[0] != c) {
      return invalid_argument(where + ": " + in_names[i] +
                              " must have the same number of elements as the channels of x: " +
                              std::to_string(t.dims[0]) + " vs " + std::to_string(c));
    }
  }
  // V3's reserve_space_3 (input 5) is accepted and ignored, as TensorFlow's CPU kernel does.
  for (size_t i = 0; i < op.outputs().size(); ++i) {
    const Dims want = i == 0 ? x : i < 3 ? Dims{c} : Dims{0};
    NG_RETURN_IF_ERROR(set_or_check_dims(op, i, out_names[i], want));
  }
  return ok_status();
}

OpSchema make_schema(OpKind kind) {
  OpSchema s(kind);
  add_declared_ports(s);
  s.not_on_ref("TensorFlow ops run after the canonicalize pass rewrites them");
  s.output_counts({3, 5});
  // scale, the statistics, their gradients and the (empty) reserve spaces:
  // U-typed, as TensorFlow types them.
  for (size_t i = 2; i < s.inputs().size(); ++i) s.per_channel(true, i);
  for (size_t i = 1; i < s.outputs().size(); ++i) s.per_channel(false, i);
  s.attr("epsilon", AttrKind::kF32, false, 0.0001f);
  std::vector<std::string> formats = {"NHWC", "NCHW"};
  if (kind == OpKind::kFusedBatchNormGradV3) formats = {"NHWC", "NCHW", "NDHWC", "NCDHW"};
  s.attr("data_format", AttrKind::kString, false, std::string("NHWC"), formats);
  s.attr("is_training", AttrKind::kBool, false, true);
  s.attr("T", AttrKind::kString, false);
  if (kind != OpKind::kFusedBatchNormGrad) s.attr("U", AttrKind::kString, false);
  s.attr("reserve_space_2_is_inv_std", AttrKind::kBool, false, false);
  s.attr("sync_group", AttrKind::kString,
         false);  // normgrad extension, as on BatchNormTrainingBackward
  std::vector<std::string> in_names, out_names;
  for (const PortSpec& p : s.inputs()) in_names.push_back(p.name);
  for (const PortSpec& p : s.outputs()) out_names.push_back(p.name);
  s.rule([](const Op& op) -> Status {
    if (!op.has_attr("epsilon")) return ok_status();
    NG_ASSIGN_OR_RETURN(float eps, op.attr_f32("epsilon"));
    if (!std::isfinite(eps) || eps < 0.f) {
      return invalid_argument(op.label() + ": attribute 'epsilon' must be finite and >= 0, got " +
                              std::to_string(eps));
    }
    return ok_status();
  });
  s.rule([in_names, out_names](const Op& op) { return dtype_rule(op, in_names, out_names); });
  s.shape_rule([in_names, out_names](Op& op) { return shape_rule(op, in_names, out_names); });
  return s;
}

}  // namespace

bool is_tf_batch_norm_grad(OpKind kind) {
  return kind == OpKind::kFusedBatchNormGrad || kind == OpKind::kFusedBatchNormGradV2 ||
         kind == OpKind::kFusedBatchNormGradV3;
}

StatusOr<TfBatchNormFormat> tf_batch_norm_format(const Op& op) {
  std::string name = "NHWC";
  if (op.has_attr("data_format")) {
    NG_ASSIGN_OR_RETURN(name, op.attr_string("data_format"));
  }
  TfBatchNormFormat f;
  f.name = name;
  if (name == "NHWC" || name == "NCHW") {
    f.spatial_rank = 2;
  } else if (name == "NDHWC" || name == "NCDHW") {
    f.spatial_rank = 3;
  } else {
    return invalid_argument(op.label() + ": unknown data_format '" + name + "'");
  }
  f.channels_last = name.back() == 'C';
  return f;
}

void register_tf_batch_norm_schemas(OpRegistry& registry) {
  for (OpKind k : {OpKind::kFusedBatchNormGrad, OpKind::kFusedBatchNormGradV2,
                   OpKind::kFusedBatchNormGradV3}) {
    registry.add(make_schema(k));
  }
}

}  // namespace normgrad
