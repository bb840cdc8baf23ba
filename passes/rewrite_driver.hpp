// The greedy rewrite driver: patterns applied from a worklist until none fires.
//
// A RewritePattern looks at one op (anchored at some kinds) and may rewrite
// the graph around it through the rewriter API. apply_patterns_greedily
// starts with every op on the worklist in topological order and listens to
// the graph's edits (Graph::set_listener): an op that an edit inserts or
// replaces, the producers of its inputs and the readers of its outputs go
// back on the worklist, as do the producers of an erased op's inputs and the
// readers of a replaced tensor. So a rewrite that enables another is found
// without a new walk, and a pass costs the ops it visits and the edits it
// makes: near-linear, where a walk repeated to a fixed point is quadratic on
// a chain (MLIR's GreedyPatternRewriteDriver is the model).
//
//   RewritePattern erase_dead{"erase-dead", {}, [](Graph& g, const Op& op)
//                             -> StatusOr<bool> { ...; return g.erase_op(op.id()), true; }};
//   NG_ASSIGN_OR_RETURN(bool changed, apply_patterns_greedily(graph, {erase_dead}));
//
// The graph must be finalized. A pattern must report a change exactly when
// it made one, and must not keep rewriting an op back and forth: the driver
// stops with an internal error after max_rewrites rewrites (by default ten
// per op, plus a thousand) instead of hanging.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {

struct RewritePattern {
  std::string name;
  std::vector<OpKind> anchors;  // empty: every kind
  // Whether it changed the graph (through the rewriter API only). The op is
  // the graph's own (ops stay at their addresses, so comparing it with what
  // the graph's queries return works); an edit of that op replaces or frees
  // it, so copy what the pattern needs from it first.
  std::function<StatusOr<bool>(Graph&, const Op&)> rewrite;
};

struct RewriteStats {
  int64_t visits = 0;    // ops taken from the worklist
  int64_t rewrites = 0;  // patterns that changed the graph
};

StatusOr<bool> apply_patterns_greedily(Graph& graph, const std::vector<RewritePattern>& patterns,
                                       RewriteStats* stats = nullptr, int64_t max_rewrites = -1);

}  // namespace normgrad
