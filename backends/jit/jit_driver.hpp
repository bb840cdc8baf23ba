// The JIT batch-norm backward driver: statistics in, kernels over the data on
// oneTBB, coefficients, diff_gamma and diff_beta out.
#pragma once

#include <memory>
#include <vector>

#include <normgrad/backends/backend.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>

namespace normgrad {
namespace jit {

// The calling thread's scratch of type S, kept between calls (per-call
// allocations of per-channel arrays were page-faulted back in on every call),
// or a fresh one when that is in use: a oneTBB thread waiting inside one
// execute may run a task that starts another.
template <typename S>
class ScratchLeaseOf {
 public:
  ScratchLeaseOf() {
    thread_local S cached;
    thread_local bool busy = false;
    if (!busy) {
      busy = true;
      busy_ = &busy;
      scratch_ = &cached;
    } else {
      owned_ = std::make_unique<S>();
      scratch_ = owned_.get();
    }
  }
  ~ScratchLeaseOf() {
    if (busy_) *busy_ = false;
  }
  ScratchLeaseOf(const ScratchLeaseOf&) = delete;
  ScratchLeaseOf& operator=(const ScratchLeaseOf&) = delete;
  S& get() { return *scratch_; }

 private:
  bool* busy_ = nullptr;
  S* scratch_ = nullptr;
  std::unique_ptr<S> owned_;
};

// The parallelism the last multi-threaded JIT run had available (its arena's
// max_concurrency; 0 before any): lets tests see set_num_threads take effect.
int last_max_concurrency();

// Runs one batch-norm backward with `kernels` built for `conf`; buffers in the
// canonical op's port order. Strided tensors (conf's strides set) run staged,
// through `staged`: kernels built for staged_conf(conf).
Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out,
                               const KernelSet* staged = nullptr);
// Two sibling backwards (the JIT's bn_bwd_siblings partitions) in one walk:
// `first` and `second` walk alike over dense tensors (make_sibling_confs),
// each with its own kernels; buffers in the partition's order, which both
// confs' ports index (the second's diff_dst: one more input, the buffer of
// its diff_src, where the first's reduce writes the shared gradient).
Status run_batch_norm_siblings(const BnConf& first, const KernelSet& first_kernels,
                               const BnConf& second, const KernelSet& second_kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out);
// The conf of the kernels that run on per-thread staging buffers.
BnConf staged_conf(const BnConf& conf);

// Strided src/diff_dst/diff_src are staged per task: the rows of one channel
// (rows walk) or one chunk of pixels (pixels walk) are gathered into
// per-thread dense buffers that stay in L2, the kernels built for that
// buffer layout run on them, and diff_src is scattered back. DRAM traffic is
// the dense kernels' (full-line strided reads aside), unlike a whole-tensor copy.
struct Staging {
  const KernelSet* kernels = nullptr;      // built for the staged buffers
  Dims x_strides, dy_strides, dx_strides;  // effective strides of the three tensors
};

// One backward over dense buffers, or staged ones when `stage` is given
// (jit_dense.cpp); the batch is not empty.
Status run_dense(const BnConf& conf, const KernelSet& kernels, const std::vector<const void*>& in,
                 const std::vector<void*>& out, const Staging* stage = nullptr);
// run_batch_norm_siblings over a batch that is not empty (jit_dense.cpp);
// `second_in`: the second's inputs.
Status run_dense_siblings(const BnConf& first, const KernelSet& first_kernels, const BnConf& second,
                          const KernelSet& second_kernels, const std::vector<const void*>& in,
                          const std::vector<const void*>& second_in, const std::vector<void*>& out);

}  // namespace jit
}  // namespace normgrad
