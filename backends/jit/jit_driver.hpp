// The JIT batch-norm backward driver: statistics in, kernels over the data on
// oneTBB, coefficients, diff_gamma and diff_beta out.
#pragma once

#include <memory>
#include <vector>

#include <normgrad/backends/jit/jit_kernels.hpp>

namespace normgrad {
namespace jit {

// Runs one batch-norm backward with `kernels` built for `conf`; buffers in the
// canonical op's port order.
Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out);

}  // namespace jit
}  // namespace normgrad
