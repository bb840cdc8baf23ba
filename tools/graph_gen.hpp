// Random valid graphs for `normgrad fuzz`: every op kind normgrad runs, over
// ranks, shapes (empty ones too), dtypes, layouts and strides.
//
// A graph grows op by op. Each step picks a kind and reads tensors the graph
// already has (so ops chain and fusion candidates appear) or fresh graph
// inputs, some with non-dense strides. A forward's batch_mean may feed an Add
// into its own epilogue, the multi-output shape that once fused into a plan
// that could not run. A backward's diff_dst is never computed from its src
// (a diff_dst affine in src per channel cancels the result to rounding
// noise, which no tolerance can judge); its statistics are graph inputs (the
// oracle makes them the true batch statistics) or the batch_mean and
// batch_variance of a forward over the same src.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {
namespace cli {

struct GraphGenOptions {
  int max_ops = 6;             // ops drawn per graph (epilogues and producers come on top)
  bool sync_ops = true;        // BatchNormTrainingBackward with sync_group
  double empty_chance = 0.04;  // a data shape with a zero dim
};

// The graph for `seed`: the same seed gives the same graph. Not finalized;
// an op its schema refuses is the error (the generator's bug, counted as an
// invalid graph, never silently dropped).
StatusOr<Graph> random_graph(uint64_t seed, const GraphGenOptions& options);

}  // namespace cli
}  // namespace normgrad
