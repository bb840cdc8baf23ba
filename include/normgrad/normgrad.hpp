// normgrad: the umbrella header of the public C++ API.
//
// Build a Graph (add_op, finalize) or load one from oneDNN's JSON, then either
// compile it whole with CompiledGraph::compile and execute it on your buffers,
// or split it with partition_graph and compile_partition each Partition.
// See docs/getting-started.md.
#pragma once

#include <normgrad/backends/backend.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/data_type.hpp>
#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/logical_tensor.hpp>
#include <normgrad/graph/npy.hpp>
#include <normgrad/graph/op.hpp>
#include <normgrad/graph/partition.hpp>
#include <normgrad/graph/status.hpp>
#include <normgrad/graph/version.hpp>
#include <normgrad/passes/partitioner.hpp>
#include <normgrad/passes/pass.hpp>
