// The JIT batch-norm backward driver: statistics in, kernels over the data on
// oneTBB, coefficients, diff_gamma and diff_beta out.
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <normgrad/backends/jit/jit_kernels.hpp>

namespace normgrad {
namespace jit {

// Dense scratch for repacking strided tensors, kept between executions: fresh
// pages would fault on every call and cost more than the copy. Thread-safe;
// each concurrent execution takes its own buffers.
class ScratchPool {
 public:
  using Buffer = std::unique_ptr<char, void (*)(void*)>;
  Buffer take(size_t bytes);
  void give(Buffer b, size_t bytes);

 private:
  std::mutex mu_;
  std::vector<std::pair<size_t, Buffer>> free_;
};

// The parallelism the last multi-threaded JIT run had available (its arena's
// max_concurrency; 0 before any): lets tests see set_num_threads take effect.
int last_max_concurrency();

// Runs one batch-norm backward with `kernels` built for `conf`; buffers in the
// canonical op's port order. `pool` serves the repack scratch (conf strides).
Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out,
                               ScratchPool* pool);

}  // namespace jit
}  // namespace normgrad
