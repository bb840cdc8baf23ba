// CsePass: common-subexpression elimination.
//
//   before:  a = ReLU(x) -> t1;  b = ReLU(x) -> t2;  ... reads t1 and t2
//   after:   a = ReLU(x) -> t1;  ... reads t1 twice
//
// Two ops are the same when kind, attributes and input tensor ids match and
// their outputs have the same dtypes and shapes. The later op goes and its
// readers read the earlier op's outputs. Precondition: none of the later op's
// outputs is a graph output (removing it would change the graph's interface).
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class CsePass final : public Pass {
 public:
  const char* name() const override { return "cse"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
