// Schemas of the ops that sit around batch norm in training graphs: ReLU,
// ReLUBackward, Add, TypeCast, StaticTranspose and End, as oneDNN Graph spells them.
//
// Add takes equal shapes only: broadcasting is refused with a clear message
// rather than computed wrongly.
#include "ops/op_registry.hpp"

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

}  // namespace

void register_elementwise_schemas(OpRegistry& registry) {
  {
    OpSchema s(OpKind::kReLU);
    s.input("src").output("dst");
    add_uniform(registry, std::move(s));
  }
  {
    // use_dst = true: input 0 is ReLU's dst; false: it is ReLU's src. Both mask by x > 0.
    OpSchema s(OpKind::kReLUBackward);
    s.input("src/dst").input("diff_dst").output("diff_src");
    s.attr("use_dst", AttrKind::kBool, false, true);
    add_uniform(registry, std::move(s));
  }
  {
    OpSchema s(OpKind::kAdd);
    s.input("src_0").input("src_1").output("dst");
    s.attr("auto_broadcast", AttrKind::kString, false, std::string("numpy"), {"none", "numpy"});
    add_uniform(registry, std::move(s));
  }
  {
    OpSchema s(OpKind::kTypeCast);
    s.input("src").output("dst");
    s.shape_rule([](Op& op) { return set_or_check_dims(op, 0, "dst", op.inputs()[0].dims); });
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kStaticTranspose);
    s.input("src").output("dst");
    s.attr("order", AttrKind::kS64s, true);
    auto names = std::make_shared<OpSchema>(s);
    s.rule([names](const Op& op) { return same_dtype_everywhere(op, *names); });
    s.shape_rule([](Op& op) -> Status {
      const Dims& d = op.inputs()[0].dims;
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
  {
    OpSchema s(OpKind::kEnd);
    s.input("src");
    registry.add(std::move(s));
  }
}

}  // namespace normgrad
