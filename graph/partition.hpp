// Partition and Tensor: the unit the backends compile, and user buffers.
//
// A partition is a connected group of ops that one backend runs as one kernel:
// its ops in topological order, and its input and output tensors (the edges
// that cross its boundary). A Tensor pairs a logical tensor with a user pointer.
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
  // Assigned by the partitioner: the backend that will run it (or "" for auto).
  std::string backend;
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
