// The oneDNN backend's kernels: one builder per op family. Each returns a
// Kernel or the reason oneDNN cannot run the op exactly.
#pragma once

#include <memory>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/op.hpp>

namespace normgrad {
namespace dnnl_impl {

// BatchNormTrainingBackward (canonical form) -> batch_normalization_backward.
StatusOr<std::shared_ptr<const Kernel>> make_batch_norm_backward(const Op& op);
// BatchNormInference (alone or with a fused ReLU) and BatchNormForwardTraining
// -> batch_normalization_forward; takes the partition to map its ports.
StatusOr<std::shared_ptr<const Kernel>> make_batch_norm_forward(const Partition& partition);
// ReLU / ReLUBackward -> eltwise, Add -> binary, TypeCast / StaticTranspose -> reorder.
StatusOr<std::shared_ptr<const Kernel>> make_neighbour(const Op& op);

}  // namespace dnnl_impl
}  // namespace normgrad
