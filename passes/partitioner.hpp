// Partitioner: splits a finalized graph into the partitions backends compile.
//
// Today every op other than End becomes its own partition; the fusion passes
// (issue #6) will group producers into their batch-norm consumer first. A
// partition's inputs and outputs are the tensors that cross its boundary, in
// port order; End ops only mark graph outputs and never become partitions.
#pragma once

#include <vector>

#include "graph/graph.hpp"
#include "graph/partition.hpp"

namespace normgrad {

StatusOr<std::vector<Partition>> partition_graph(const Graph& graph);

}  // namespace normgrad
