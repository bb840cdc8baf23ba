// OpRegistry: the schema of every op kind, registered explicitly in one place.
//
// `op_registry()` builds the registry on first use by calling each family's
// registration function (batch norm, elementwise and layout ops); there are no
// static-initialiser registries. The IR reaches it only through the two hooks
// declared in graph/op_checks.hpp.
#pragma once

#include <array>
#include <memory>

#include <normgrad/ops/op_schema.hpp>

namespace normgrad {

class OpRegistry {
 public:
  void add(OpSchema schema);
  // nullptr when the kind has no schema.
  const OpSchema* find(OpKind kind) const;

 private:
  std::array<std::unique_ptr<OpSchema>, static_cast<size_t>(OpKind::kCount)> schemas_;
};

const OpRegistry& op_registry();

// Family registration functions, called from op_registry().
void register_batch_norm_schemas(OpRegistry& registry);
void register_elementwise_schemas(OpRegistry& registry);
void register_tf_batch_norm_schemas(OpRegistry& registry);
void register_collective_schemas(OpRegistry& registry);

}  // namespace normgrad
