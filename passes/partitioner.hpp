// Partitioner: splits a finalized graph into the partitions backends compile.
//
// The ops of one fusion group (set by FuseElementwisePass) form one partition;
// every other op other than End is a partition of its own. A partition's
// inputs and outputs are the tensors that cross its boundary, in order of first
// use; tensors produced and consumed only inside stay internal. End ops only
// mark graph outputs and never become partitions. An opaque op (a oneDNN
// Graph kind we carry but do not run) is an unsupported partition of its own,
// as is a partition touching an opaque layout: every other op is covered.
#pragma once

#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/partition.hpp>

namespace normgrad {

StatusOr<std::vector<Partition>> partition_graph(const Graph& graph);

}  // namespace normgrad
