// The two hooks through which the IR checks ops against their schemas.
//
// Declared here and defined in ops/op_registry.cpp, so that graph/ never
// includes ops/ headers while Graph::add_op can still verify ops at once.
#pragma once

#include <optional>
#include <string>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

// The kind a schema gives attribute `name` of op kind `kind`; nullopt when the
// kind is opaque or has no such attribute.
std::optional<AttrKind> schema_attr_kind(OpKind kind, const std::string& name);
// True for a oneDNN Graph kind with no schema of ours: carried, never run or rewritten.
bool op_kind_is_opaque(OpKind kind);
// Ports, attributes, dtypes and per-tensor sanity; shapes may still be unknown.
Status verify_op_structure(const Op& op);
// Shape rule: inputs must have known dims; sets or checks the output dims.
Status infer_op_shapes(Op& op);

}  // namespace normgrad
