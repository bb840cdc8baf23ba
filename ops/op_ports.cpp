// add_declared_ports: a schema's port names from op_ports.def.
#include <normgrad/ops/op_ports.hpp>

#include <normgrad/ops/op_schema.hpp>

namespace normgrad {

void add_declared_ports(OpSchema& s) {
  switch (s.kind()) {
#define NG_IN(name, i) s.input(#name);
#define NG_IN_OPT(name, i) s.input(#name, true);
#define NG_OUT(name, i) s.output(#name);
#define NG_OUT_OPT(name, i) s.output(#name, true);
#define NG_OP_PORTS(Kind, inputs, outputs) \
  case OpKind::k##Kind:                    \
    inputs outputs break;
#include <normgrad/ops/op_ports.def>
    default:
      assert(false && "add_declared_ports: the kind has no entry in op_ports.def");
  }
}

}  // namespace normgrad
