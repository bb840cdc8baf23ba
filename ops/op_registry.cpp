// OpRegistry: construction and the IR's schema hooks.
#include <normgrad/ops/op_registry.hpp>

#include <normgrad/graph/op_checks.hpp>

namespace normgrad {

void OpRegistry::add(OpSchema schema) {
  const auto i = static_cast<size_t>(schema.kind());
  assert(i < schemas_.size() && !schemas_[i] && "op kind registered twice");
  schemas_[i] = std::make_unique<OpSchema>(std::move(schema));
}

const OpSchema* OpRegistry::find(OpKind kind) const {
  const auto i = static_cast<size_t>(kind);
  return i < schemas_.size() ? schemas_[i].get() : nullptr;
}

const OpRegistry& op_registry() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_batch_norm_schemas(r);
    register_elementwise_schemas(r);
    register_tf_batch_norm_schemas(r);
    register_collective_schemas(r);
    return r;
  }();
  return registry;
}

std::optional<AttrKind> schema_attr_kind(OpKind kind, const std::string& name) {
  const OpSchema* schema = op_registry().find(kind);
  const AttrSpec* spec = schema ? schema->find_attr(name) : nullptr;
  if (spec == nullptr) return std::nullopt;
  return spec->kind;
}

bool op_kind_is_opaque(OpKind kind) {
  return op_registry().find(kind) == nullptr;
}

// An opaque op (a oneDNN Graph kind we have no schema for) is checked only as
// far as the IR needs it: tensor ids and per-tensor sanity. Its attributes and
// shapes are the framework's business; we carry them unchanged.
Status verify_op_structure(const Op& op) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema != nullptr) return schema->verify_structure(op);
  for (size_t i = 0; i < op.inputs().size() + op.outputs().size(); ++i) {
    const bool in = i < op.inputs().size();
    const size_t k = in ? i : i - op.inputs().size();
    const LogicalTensor& lt = in ? op.inputs()[k] : op.outputs()[k];
    const std::string where = op.label() + ": " + (in ? "input " : "output ") + std::to_string(k);
    if (lt.id < 0)
      return invalid_argument(where + ": tensor id " + std::to_string(lt.id) + " is negative");
    NG_RETURN_IF_ERROR(lt.validate(where));
  }
  return ok_status();
}

Status infer_op_shapes(Op& op) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema == nullptr) return ok_status();  // opaque: outputs keep what the file declared
  return schema->infer_shapes(op);
}

}  // namespace normgrad
