// add_declared_ports: a schema's port names from op_ports.def.
#include <normgrad/ops/op_ports.hpp>

#include <string>

#include <normgrad/ops/op_schema.hpp>

namespace normgrad {

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
