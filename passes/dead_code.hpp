// DeadOutputEliminationPass and DeadOpEliminationPass: drop what nobody reads.
//
// Only what cannot be observed goes: with explicit output_ports, a tensor
// that no op reads and that is not a port is dead; without output_ports,
// every unread tensor is a graph output, so nothing is dead.
//
// Dead outputs:
//   before:  BatchNormTrainingBackward(...) {is_training=true} -> diff_src, diff_gamma(dead),
//   diff_beta(dead) after:   BatchNormTrainingBackward(...) {is_training=true} -> diff_src
// Both reductions go together (the op has 1 or 3 outputs). `is_training` is
// made explicit first, since the single-output oneDNN form would otherwise
// change meaning (frozen statistics). Precondition: canonicalized graph.
//
// Dead ops: an op (not End) whose outputs are all dead is removed, repeatedly.
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class DeadOutputEliminationPass final : public Pass {
 public:
  const char* name() const override { return "dead-output-elimination"; }
  StatusOr<bool> run(Graph& graph) const override;
};

class DeadOpEliminationPass final : public Pass {
 public:
  const char* name() const override { return "dead-op-elimination"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
