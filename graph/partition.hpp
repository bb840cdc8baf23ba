// Partition and Tensor: the unit the backends compile, and user buffers.
//
// A partition is a connected group of ops that one backend runs as one kernel
// (one of the backend's patterns): its ops in topological order, and its input
// and output tensors (the edges that cross its boundary). A Tensor pairs a logical tensor with a
// user pointer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <normgrad/graph/op.hpp>

namespace normgrad {

struct Partition {
  int64_t id = 0;
  std::vector<Op> ops;
  std::vector<LogicalTensor> inputs;
  std::vector<LogicalTensor> outputs;
  // Set by the partitioner from the pattern that took the ops: the backend
  // that runs it, the pattern ("jit.bn_bwd_producers") and the op the pattern
  // is anchored at. Empty and -1 for a partition built by hand, which
  // compile_partition matches first.
  std::string backend;
  std::string pattern;
  int64_t anchor = -1;
  // False for ops no backend of ours runs (oneDNN Graph kinds we carry as
  // opaque ops, opaque layouts): the caller runs them itself, as with oneDNN
  // Graph's unsupported partitions. `reason` says why.
  bool supported = true;
  std::string reason;

  bool is_supported() const { return supported; }

  // "BatchNormTrainingBackward" or "ReLUBackward+BatchNormTrainingBackward".
  std::string ops_string() const;
};

struct Tensor {
  LogicalTensor desc;
  void* data = nullptr;
};

}  // namespace normgrad
