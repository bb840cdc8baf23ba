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

// The part an op plays in a partition, as the pattern that matched it bound
// it (passes/pattern.hpp): backends read these instead of re-deriving them
// from tensor ids.
enum class FusionRole {
  kAnchor,           // the op the pattern starts from
  kSrcProducer,      // writes a batch-norm backward's src (ReLUBackward or Add)
  kDiffDstProducer,  // writes its diff_dst
  kGradientAdd,      // adds the gradient that a diff_dst ReLUBackward masks
  kResidualAdd,      // adds a residual to a forward's dst
  kActivation,       // ReLU or LeakyReLU after it
  kSibling,          // a second batch-norm backward reading the anchor's fused diff_dst
  kDequantize,
  kQuantize,
  kMember,  // any other op a pattern takes
};
// "anchor", "src", "diff_dst", "residual", "activation", ...
const char* fusion_role_name(FusionRole role);
struct BoundOp {
  int64_t op_id = -1;
  FusionRole role = FusionRole::kMember;
};

struct Partition {
  int64_t id = 0;
  std::vector<Op> ops;
  std::vector<LogicalTensor> inputs;
  std::vector<LogicalTensor> outputs;
  // Set by the partitioner from the pattern that took the ops: the backend
  // that runs it, the pattern ("jit.bn_bwd_producers") and every op's role
  // in the match. Empty for a partition built by hand, which
  // compile_partition matches first.
  std::string backend;
  std::string pattern;
  std::vector<BoundOp> roles;
  // The op bound to `role`, or nullptr.
  const Op* bound(FusionRole role) const;
  // This partition without op `op_id` and its role, with the same inputs and
  // outputs (a backend's view of one member of a multi-op match).
  Partition without(int64_t op_id) const;
  // The id of the op the pattern is anchored at (its kAnchor role), or -1
  // for a partition not matched yet.
  int64_t anchor() const;
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
