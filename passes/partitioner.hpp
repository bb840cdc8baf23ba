// Partitioner: splits a finalized graph into the partitions backends compile,
// by matching the backends' patterns (pattern.hpp).
//
// Patterns are tried in the order given (the backends' priority order, each
// backend's fused patterns before its single-op ones); each pattern is tried
// at every op it is anchored at, in topological order. A match whose ops are
// all still free becomes a candidate partition: its tensors must not have an
// opaque layout, and `accept` (the backend's supports()) must take it, unless
// an op's shapes are not known yet (then structure decides, and compiling the
// partition reports the unknown shape). The first accepted candidate wins and
// records its backend, pattern and anchor on the partition.
//
// An op no pattern takes becomes an unsupported partition of its own, with
// every pattern's answer as the reason (oneDNN Graph's unsupported
// partitions: the caller runs it). End ops only mark graph outputs and never
// become partitions. A partition's inputs and outputs are the tensors that
// cross its boundary, in order of first use; partitions come in a
// topological order: that of their last op, except for ops a convex
// candidate's outputs reach that the graph's order put among its ops, which
// come after it (UnitOrder in partitioner.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/partition.hpp>
#include <normgrad/passes/pattern.hpp>

namespace normgrad {

struct PartitionerOptions {
  // In priority order.
  std::vector<Pattern> patterns;
  // Off: fused patterns are skipped ("every op as the user wrote it").
  bool fuse = true;
  // Whose patterns these are, for messages: "backend 'jit'".
  std::string scope = "any backend";
  // The backend's verdict on a candidate (pattern, partition); OK when unset.
  std::function<Status(const Pattern&, const Partition&)> accept;
};

// One answer of one pattern at one op, for `partitions --explain`.
struct PatternTrial {
  int64_t op_id = 0;
  std::string pattern;  // Pattern::full_name()
  Status result;        // OK for the match that won
  std::string note;     // for a match: what it left out and why
};

// `trials`, when given, receives every pattern tried at every op, in order.
StatusOr<std::vector<Partition>> match_partitions(const Graph& graph,
                                                  const PartitionerOptions& options,
                                                  std::vector<PatternTrial>* trials = nullptr);

// For a partition built by hand (its ops as `graph`): the first pattern, in
// priority order, whose match at some op of `graph` is every op of it and
// that is accepted; otherwise why none was.
StatusOr<Partition> match_whole(const Graph& graph, const PartitionerOptions& options,
                                std::vector<PatternTrial>* trials = nullptr);

// Whether `parts` (in plan order) can run in that order: every input a
// partition reads from another partition comes from an earlier one, which
// holds exactly when the partition graph is acyclic and the plan order is a
// topological order of it. An internal error names the first tensor that
// would be read before it is written.
Status check_partition_order(const Graph& graph, const std::vector<Partition>& parts);

// The partition of `ops` (ids, in topological order) of `graph`: its tensors
// crossing the boundary, nothing assigned yet.
Partition make_partition(const Graph& graph, const std::vector<int64_t>& ops);

}  // namespace normgrad
