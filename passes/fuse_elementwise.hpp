// FuseElementwisePass: fold an elementwise producer into the batch-norm
// backward data input it feeds.
//
//   before:  ReLUBackward(relu_src, dy) -> t;  BatchNormTrainingBackward(x, t, ...)
//   after:   the same ops, grouped {ReLUBackward, BatchNormTrainingBackward}:
//            the partitioner makes them one partition and the JIT masks dy on
//            the fly while it loads it, so t is never written to memory.
//
// Producers: ReLUBackward (either use_dst: the mask is "forward value > 0")
// and Add (equal shapes). Ports: diff_dst (the training chain: forward BN ->
// ReLU, so ReLUBackward -> BN-bwd diff_dst) and src (how oneDNN's
// bn_bwd_relu_bwd_fusion.json wires it). One producer per port.
//
// The forward counterpart, oneDNN's fuse_norm_relu: BatchNormInference -> ReLU
// is grouped when the ReLU is the batch norm's only consumer, dst is not a
// graph output and the dtypes agree.
//
// Preconditions (each failing one leaves the ops apart): the producer's output
// has this batch norm as its only consumer and feeds only one of its ports, it
// is not a graph output, and its dtype is the batch norm's data dtype.
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class FuseElementwisePass final : public Pass {
 public:
  const char* name() const override { return "fuse-elementwise"; }
  StatusOr<bool> run(Graph& graph) const override;
};

// For `normgrad partitions --explain`: per data port of every batch-norm
// backward of `graph` (after the pass), the producer that was fused or the
// rule that kept it apart, from the same checks the pass makes.
std::vector<std::string> explain_fusion(const Graph& graph);

}  // namespace normgrad
