// Reference implementations of every op, on strided buffers, in float64.
//
// Each function takes a verified, shape-inferred op and the buffers of its
// ports in port order. Arithmetic is double; results are rounded once to the
// output dtype. This is the oracle the other backends are measured against,
// so the code follows the formulas literally.
#pragma once

#include <vector>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace ref {

Status execute_op(const Op& op, const std::vector<const void*>& inputs,
                  const std::vector<void*>& outputs);

// Per family, called by execute_op.
Status batch_norm_backward(const Op& op, const std::vector<const void*>& in,
                           const std::vector<void*>& out);
// BatchNormTrainingBackwardFromDst (ref_batch_norm_from_dst.cpp).
Status batch_norm_backward_from_dst(const Op& op, const std::vector<const void*>& in,
                                    const std::vector<void*>& out);
Status batch_norm_backward_reduce(const Op& op, const std::vector<const void*>& in,
                                  const std::vector<void*>& out);
Status batch_norm_backward_apply(const Op& op, const std::vector<const void*>& in,
                                 const std::vector<void*>& out);
// AllReduce over a group of one (this process): each output is its input.
Status all_reduce_single(const Op& op, const std::vector<const void*>& in,
                         const std::vector<void*>& out);
Status batch_norm_forward_training(const Op& op, const std::vector<const void*>& in,
                                   const std::vector<void*>& out);
Status batch_norm_forward_reduce(const Op& op, const std::vector<const void*>& in,
                                 const std::vector<void*>& out);
Status batch_norm_forward_merge(const Op& op, const std::vector<const void*>& in,
                                const std::vector<void*>& out);
Status batch_norm_forward_apply(const Op& op, const std::vector<const void*>& in,
                                const std::vector<void*>& out);
Status batch_norm_inference(const Op& op, const std::vector<const void*>& in,
                            const std::vector<void*>& out);
Status elementwise(const Op& op, const std::vector<const void*>& in, const std::vector<void*>& out);

}  // namespace ref
}  // namespace normgrad
