// Named port accessors for every op kind normgrad runs, from op_ports.def.
//
// Passes and backends read an op's tensors by the names its schema gives
// them instead of by index:
//   const BatchNormTrainingBackwardPorts bn(op);
//   if (bn.has_gamma()) use(bn.gamma());
//   producer_of(bn.diff_dst().id);
// Each class wraps a reference to an op of its kind (asserted) and has one
// accessor per port and its index, <name>_port() (port names are unique
// across an op's inputs and outputs); an optional port has has_<name>() too,
// and reading an absent one is an assertion, not an out-of-bounds read.
#pragma once

#include <cassert>
#include <cstddef>

#include <normgrad/graph/op.hpp>

namespace normgrad {

// One accessor (and its index) on the op's `list` of ports; the optional
// form asks has_<name>() first.
#define NG_PORT_(name, i, list)           \
  const LogicalTensor& name() const {     \
    return op_.list()[i];                 \
  }                                       \
  static constexpr size_t name##_port() { \
    return i;                             \
  }
#define NG_PORT_OPT_(name, i, list)                              \
  bool has_##name() const {                                      \
    return op_.list().size() > i;                                \
  }                                                              \
  const LogicalTensor& name() const {                            \
    assert(has_##name() && "optional port " #name " is absent"); \
    return op_.list()[i];                                        \
  }                                                              \
  static constexpr size_t name##_port() {                        \
    return i;                                                    \
  }
// A variadic kind's ports: name(k) for k < name_count().
#define NG_PORT_LIST_(name, max, list)                      \
  const LogicalTensor& name(size_t k) const {               \
    assert(k < op_.list().size() && "no port " #name "_k"); \
    return op_.list()[k];                                   \
  }                                                         \
  size_t name##_count() const {                             \
    return op_.list().size();                               \
  }                                                         \
  static constexpr size_t name##_port(size_t k) {           \
    return k;                                               \
  }                                                         \
  static constexpr size_t name##_max() {                    \
    return max;                                             \
  }
#define NG_IN(name, i) NG_PORT_(name, i, inputs)
#define NG_IN_AS(name, label, i) NG_PORT_(name, i, inputs)
#define NG_IN_LIST(name, max) NG_PORT_LIST_(name, max, inputs)
#define NG_OUT_LIST(name, max) NG_PORT_LIST_(name, max, outputs)
#define NG_IN_OPT(name, i) NG_PORT_OPT_(name, i, inputs)
#define NG_OUT(name, i) NG_PORT_(name, i, outputs)
#define NG_OUT_OPT(name, i) NG_PORT_OPT_(name, i, outputs)
#define NG_OP_PORTS(Kind, inputs, outputs)                                          \
  class Kind##Ports {                                                               \
   public:                                                                          \
    explicit Kind##Ports(const Op& op) : op_(op) {                                  \
      assert(op.kind() == OpKind::k##Kind && "a " #Kind "Ports over another kind"); \
    }                                                                               \
    const Op& op() const { return op_; }                                            \
    inputs outputs                                                                  \
                                                                                    \
        private : const Op& op_;                                                    \
  };
#include <normgrad/ops/op_ports.def>
#undef NG_PORT_
#undef NG_PORT_OPT_
#undef NG_PORT_LIST_

// The first data input and the output of a one-output elementwise or layout
// op, found by its schema's port names: src (Add's src_0, ReLUBackward's
// src/dst) and dst (a backward's diff_src). For code that treats these kinds
// alike, a kind added later included; the accessors assert what
// is_elementwise_kind checks.
bool is_elementwise_kind(const Op& op);
const LogicalTensor& elementwise_src(const Op& op);
const LogicalTensor& elementwise_dst(const Op& op);

// Adds the ports op_ports.def declares for `schema`'s kind, in order (the
// schemas of the kinds listed there call it instead of naming ports).
class OpSchema;
void add_declared_ports(OpSchema& schema);

}  // namespace normgrad
