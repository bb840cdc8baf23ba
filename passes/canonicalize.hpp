// CanonicalizePass: one batch-norm-backward form for every backend.
//
// TensorFlow's FusedBatchNormGrad / V2 / V3 become BatchNormTrainingBackward:
//
//   before:  FusedBatchNormGradV3(y_backprop, x, scale, rs1, rs2, rs3)
//              -> x_backprop, scale_backprop, offset_backprop, rs4[0], rs5[0]
//   after:   BatchNormTrainingBackward(src=x, diff_dst=y_backprop, mean=rs1,
//              variance=rs2, gamma=scale) {is_training, variance_is_inv_std,
//              data_format = NXC for NHWC/NDHWC, NCX for NCHW/NCDHW, epsilon}
//              -> diff_src, diff_gamma, diff_beta
//
// The reserve outputs are empty tensors: nothing computes them, so they are
// dropped here and the executor serves them as zero-byte buffers; V3's
// reserve_space_3 input is ignored, as in TensorFlow.
//
// oneDNN's BatchNormTrainingBackward gets an explicit `is_training`: true with
// 3 outputs, false with 1 output (and its ignored gamma input removed), so that
// later passes can drop outputs without changing the meaning.
//
// Preconditions: a finalized graph. Postconditions: no TensorFlow op remains;
// every BatchNormTrainingBackward carries `is_training`.
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class CanonicalizePass final : public Pass {
 public:
  const char* name() const override { return "canonicalize"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
