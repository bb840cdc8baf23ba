// OpRegistry: construction and the IR's schema hooks.
#include "ops/op_registry.hpp"

#include "graph/op_checks.hpp"

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
    return r;
  }();
  return registry;
}

Status verify_op_structure(const Op& op) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema == nullptr) return unimplemented(op.label() + ": op kind has no schema");
  return schema->verify_structure(op);
}

Status infer_op_shapes(Op& op) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema == nullptr) return unimplemented(op.label() + ": op kind has no schema");
  return schema->infer_shapes(op);
}

}  // namespace normgrad
