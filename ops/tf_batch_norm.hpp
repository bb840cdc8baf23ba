// Helpers for TensorFlow's FusedBatchNormGrad family, shared by the schema and
// the canonicalisation pass.
#pragma once

#include <string>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

bool is_tf_batch_norm_grad(OpKind kind);

struct TfBatchNormFormat {
  std::string name;           // NHWC, NCHW, NDHWC or NCDHW
  int spatial_rank = 2;       // 2, or 3 for the 3-D formats
  bool channels_last = true;  // NHWC/NDHWC
};

StatusOr<TfBatchNormFormat> tf_batch_norm_format(const Op& op);

}  // namespace normgrad
