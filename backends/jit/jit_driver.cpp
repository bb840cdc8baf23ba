// JIT driver: the backward's entry, its empty-batch path, and the pool's state.
//
// run_batch_norm_backward checks what every path needs (FromDst's gamma),
// answers an empty batch itself, and hands dense or staged buffers to
// run_dense (jit_dense.cpp, the walks, on the pool of jit_parallel.hpp).
#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_parallel.hpp>

namespace normgrad {
namespace jit {

namespace {

std::atomic<int>& last_concurrency() {
  static std::atomic<int> v{0};
  return v;
}

}  // namespace

void note_concurrency(int c) {
  last_concurrency().store(c);
}

int last_max_concurrency() {
  return last_concurrency().load();
}

#ifndef NORMGRAD_STD_THREADS
std::shared_ptr<tbb::task_arena> capped_arena(int cap) {
  static std::mutex mu;
  static std::shared_ptr<tbb::task_arena> arena;
  static int arena_cap = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (!arena || arena_cap != cap) {
    arena = std::make_shared<tbb::task_arena>(cap);
    arena_cap = cap;
  }
  return arena;
}
#endif

void parallel_range(bool serial, int64_t n, const std::function<void(int64_t)>& body) {
  for_range(serial, n, body);
}

Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out,
                               const KernelSet* staged) {
  // FromDst divides by gamma: every channel is checked before anything is
  // written, on every path (empty, dense, staged).
  for (int64_t c = 0; c < conf.d.channels && conf.d.from_dst; ++c) {
    NG_RETURN_IF_ERROR(
        check_from_dst_gamma("BatchNormTrainingBackwardFromDst", c,
                             load_as_double(in[conf.ports.gamma], c, conf.d.stats_dt)));
  }
  if (conf.empty) {
    // An empty batch: sums over no elements are 0; diff_src has no element.
    const BatchNormDesc& d = conf.d;
    const PortMap& pm = conf.ports;
    if (d.phase == BackwardPhase::kApply) {
      // This process holds no data, but diff_gamma and diff_beta are the
      // global sums' (the other processes' data), as on every process.
      const double m = load_as_double(in[pm.count], 0, DataType::kS64);
      NG_RETURN_IF_ERROR(check_global_count("BatchNormBackwardApply", d, m));
      for (int64_t c = 0; c < d.channels && d.diff_scale_shift; ++c) {
        const double v = load_as_double(in[pm.variance], c, d.stats_dt);
        const double s = d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + double(d.epsilon));
        store_from_double(out[pm.diff_gamma], c, d.stats_dt,
                          s * load_as_double(in[pm.sum_dy_xm], c, DataType::kF32));
        store_from_double(out[pm.diff_beta], c, d.stats_dt,
                          load_as_double(in[pm.sum_dy], c, DataType::kF32));
      }
      return ok_status();
    }
    for (int64_t c = 0; c < d.channels; ++c) {
      if (d.phase == BackwardPhase::kReduce) {
        store_from_double(out[pm.sum_dy_out], c, DataType::kF32, 0.0);
        store_from_double(out[pm.sum_dy_xm_out], c, DataType::kF32, 0.0);
      } else if (d.diff_scale_shift) {
        store_from_double(out[pm.diff_gamma], c, d.stats_dt, 0.0);
        store_from_double(out[pm.diff_beta], c, d.stats_dt, 0.0);
      }
    }
    if (d.phase == BackwardPhase::kReduce)
      store_from_double(out[pm.count_out], 0, DataType::kS64, 0.0);
    return ok_status();
  }
  if (conf.x_strides.empty() && conf.dy_strides.empty() && conf.dx_strides.empty())
    return run_dense(conf, kernels, in, out);
  if (staged == nullptr) return internal_error("JIT: strided tensors need the staged kernels");
  const Dims dense = dense_strides(conf.d.dims);
  Staging st;
  st.kernels = staged;
  st.x_strides = conf.x_strides.empty() ? dense : conf.x_strides;
  st.dy_strides = conf.dy_strides.empty() ? dense : conf.dy_strides;
  st.dx_strides = conf.dx_strides.empty() ? dense : conf.dx_strides;
  return run_dense(conf, kernels, in, out, &st);
}

Status run_batch_norm_siblings(const BnConf& first, const KernelSet& first_kernels,
                               const BnConf& second, const KernelSet& second_kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out) {
  // The second reads the shared gradient where the first's reduce writes it:
  // in the second's diff_src (make_sibling_confs), its input after the partition's.
  std::vector<const void*> second_in = in;
  second_in.push_back(out[first.ports.dy_out]);
  if (first.empty || second.empty) {  // both are: the same shape
    NG_RETURN_IF_ERROR(run_batch_norm_backward(first, first_kernels, in, out));
    return run_batch_norm_backward(second, second_kernels, second_in, out);
  }
  return run_dense_siblings(first, first_kernels, second, second_kernels, in, second_in, out);
}

BnConf staged_conf(const BnConf& conf) {
  BnConf s = conf;
  s.stream.nt_stores = false;       // diff_src goes to a cached staging buffer
  s.prefetch.next_channel = false;  // each channel is packed on its own
  s.stream.reverse_rows = 0;
  if (s.walk.kind == Walk::kRows) s.walk.row_stride = s.walk.cols;  // one channel's [N][S] rows
  s.walk.dx_row_stride = s.walk.row_stride;
  s.x_strides.clear();
  s.dy_strides.clear();
  s.dx_strides.clear();
  return s;
}

}  // namespace jit
}  // namespace normgrad
