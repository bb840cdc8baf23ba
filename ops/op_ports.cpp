// add_declared_ports: a schema's port names from op_ports.def.
#include <normgrad/ops/op_ports.hpp>

#include <initializer_list>
#include <string>

#include <normgrad/ops/op_registry.hpp>
#include <normgrad/ops/op_schema.hpp>

namespace normgrad {

namespace {

// The first port of `op` whose schema name is one of `names`, or nullptr.
const LogicalTensor* named_port(const Op& op, bool input,
                                std::initializer_list<const char*> names) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema == nullptr) return nullptr;
  const auto& ports = input ? op.inputs() : op.outputs();
  for (size_t i = 0; i < ports.size(); ++i) {
    const std::string name = input ? schema->input_name(i) : schema->output_name(i);
    for (const char* n : names) {
      if (name == n) return &ports[i];
    }
  }
  return nullptr;
}

// By the schema's names, so a kind added with a schema needs no entry here.
const LogicalTensor* elementwise_src_or_null(const Op& op) {
  if (op.outputs().size() != 1) return nullptr;
  return named_port(op, true, {"src", "src_0", "src/dst"});
}
const LogicalTensor* elementwise_dst_or_null(const Op& op) {
  if (op.outputs().size() != 1) return nullptr;
  return named_port(op, false, {"dst", "diff_src"});
}

}  // namespace

bool is_elementwise_kind(const Op& op) {
  return elementwise_src_or_null(op) != nullptr && elementwise_dst_or_null(op) != nullptr;
}

const LogicalTensor& elementwise_src(const Op& op) {
  const LogicalTensor* t = elementwise_src_or_null(op);
  assert(t != nullptr && "elementwise_src of an op that is not one-output elementwise");
  return *t;
}

const LogicalTensor& elementwise_dst(const Op& op) {
  const LogicalTensor* t = elementwise_dst_or_null(op);
  assert(t != nullptr && "elementwise_dst of an op that is not one-output elementwise");
  return *t;
}

void add_declared_ports(OpSchema& s) {
  switch (s.kind()) {
#define NG_IN(name, i) s.input(#name);
#define NG_IN_OPT(name, i) s.input(#name, true);
#define NG_OUT(name, i) s.output(#name);
#define NG_OUT_OPT(name, i) s.output(#name, true);
#define NG_IN_AS(name, label, i) s.input(label);
#define NG_IN_LIST(name, max) \
  for (size_t k = 0; k < (max); ++k) s.input(#name "_" + std::to_string(k), k > 0);
#define NG_OUT_LIST(name, max) \
  for (size_t k = 0; k < (max); ++k) s.output(#name "_" + std::to_string(k), k > 0);
#define NG_OP_PORTS(Kind, inputs, outputs) \
  case OpKind::k##Kind:                    \
    inputs outputs break;
#include <normgrad/ops/op_ports.def>
    default:
      assert(false && "add_declared_ports: the kind has no entry in op_ports.def");
  }
}

}  // namespace normgrad
