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
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class SplitSyncBatchNormPass final : public Pass {
 public:
  const char* name() const override { return "split-sync-batch-norm"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
