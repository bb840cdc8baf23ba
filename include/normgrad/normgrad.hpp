// normgrad: the umbrella header of the public C++ API.
//
// Build a Graph (add_op, finalize) or load one from oneDNN's JSON, then either
// compile it whole with CompiledGraph::compile and execute it on your buffers,
// or split it with partition_graph and compile_partition each Partition.
// See docs/getting-started.md.
#pragma once

#include "backends/backend.hpp"
#include "backends/compiler.hpp"
#include "graph/data_type.hpp"
#include "graph/graph.hpp"
#include "graph/json_io.hpp"
#include "graph/logical_tensor.hpp"
#include "graph/npy.hpp"
#include "graph/op.hpp"
#include "graph/partition.hpp"
#include "graph/status.hpp"
#include "graph/version.hpp"
#include "passes/partitioner.hpp"
#include "passes/pass.hpp"
