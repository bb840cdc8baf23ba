// SplitSyncBatchNormPass: a batch-norm backward over a process group's whole
// batch becomes Reduce -> AllReduce -> Apply.
//
//   before:  BatchNormTrainingBackward{sync_group="world"}(x, dy, mean, var, gamma)
//   after:   BatchNormBackwardReduce(x, dy, mean)            -> sum_dy, sum_dy_xm, count
//            AllReduce{group="world"}(sum_dy, sum_dy_xm, count) -> the global three
//            BatchNormBackwardApply(x, dy, mean, var, global..., gamma)
//                                                             -> diff_src, diff_gamma, diff_beta
//
// Each process holds a slice of the batch; the mean and variance are already
// the whole batch's (the forward synchronized them), so only the two
// per-channel sums and the element count must be summed across processes.
// The training form is split, and the frozen one when it computes diff_gamma
// and diff_beta (whole-batch sums as well; Apply gets is_training = false). A
// frozen diff_src alone needs no sums and is left alone. A fusible producer (ReLUBackward, Add) of
// src or diff_dst that only the batch norm reads is cloned, one copy per
// half, so the backends' bn_bwd_producers patterns take one each (as the unsplit kernel
// recomputes it on both of its passes over the data).
//
// The forward with sync_group is split so its statistics cover the group's
// batch, merged without cancellation (Chan's parallel merge, in f64):
//
//   before:  BatchNormForwardTraining{sync_group}(x, mean, var, gamma, beta) -> y, stats...
//   after:   BatchNormForwardReduce(x)                    -> sum, m2, count (this process's)
//            AllReduce(sum, count)                        -> the global sum and count
//            BatchNormForwardMerge(sum, m2, count, global sum, global count)
//                                                         -> m2 + count (mean - global mean)^2
//            AllReduce(that)                              -> the global M2
//            BatchNormForwardApply(x, mean, var, global sum, M2, count, gamma, beta)
//                                                         -> y, stats... (the same tensors)
//
// Apply keeps the forward's id and outputs, so an Add/ReLU/LeakyReLU
// epilogue after it fuses into it as it did into the forward.
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class SplitSyncBatchNormPass final : public Pass {
 public:
  const char* name() const override { return "split-sync-batch-norm"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
