// Schema of AllReduce, the collective between the halves of a synchronized
// batch-norm backward (a normgrad extension; docs/ops/AllReduce.md).
//
// AllReduce sums each input element-wise over the processes of its `group`
// and writes the sum to the output of the same index. It takes up to eight
// tensors (AllReducePorts::src_max(), from op_ports.def) so a backend can sum
// them in one collective call; each output has its input's dtype and dims.
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {

void register_collective_schemas(OpRegistry& registry) {
  OpSchema s(OpKind::kAllReduce);
  add_declared_ports(s);
  std::set<size_t> counts;
  for (size_t i = 0; i < AllReducePorts::src_max(); ++i) counts.insert(i + 1);
  s.input_counts(counts).output_counts(counts);
  s.attr("group", AttrKind::kString, false, std::string("world"));
  s.attr("reduction", AttrKind::kString, false, std::string("sum"), {"sum"});
  // What every process must run alike (the split pass writes the synchronized
  // op's kind, dtype, layout, channels and epsilon): a backend agrees on it
  // before the data moves.
  s.attr("signature", AttrKind::kString, false, std::string(""));
  s.dtypes({DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kF64, DataType::kS64});
  s.rule([](const Op& op) -> Status {
    if (op.inputs().size() != op.outputs().size())
      return invalid_argument(op.label() + ": " + std::to_string(op.inputs().size()) +
                              " inputs but " + std::to_string(op.outputs().size()) +
                              " outputs (one output per input)");
    if (op.has_attr("group") && std::get<std::string>(op.attrs().at("group")).empty())
      return invalid_argument(op.label() + ": attribute 'group' is empty");
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      if (op.outputs()[i].dtype != op.inputs()[i].dtype)
        return invalid_argument(port_label(op, false, i, "dst_" + std::to_string(i)) + ": dtype " +
                                dtype_name(op.outputs()[i].dtype) + " differs from its input's " +
                                dtype_name(op.inputs()[i].dtype));
    }
    return ok_status();
  });
  s.shape_rule([](Op& op) -> Status {
    for (size_t i = 0; i < op.inputs().size(); ++i)
      NG_RETURN_IF_ERROR(set_or_check_dims(op, i, "dst_" + std::to_string(i), op.inputs()[i].dims));
    return ok_status();
  });
  registry.add(std::move(s));
}

}  // namespace normgrad
