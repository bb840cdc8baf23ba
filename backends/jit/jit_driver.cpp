// JIT driver: the thread pool, the backward's entry and its empty-batch path.
//
// run_batch_norm_backward checks what every path needs (FromDst's gamma),
// answers an empty batch itself, and hands dense or staged buffers to
// run_dense (jit_dense.cpp, the walks). Work items are partitioned by the
// shape alone and run on oneTBB (or std::threads under ThreadSanitizer), so
// any thread count gives the same bits.
#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <mutex>

#include <normgrad/backends/backend.hpp>

#include <cstdlib>
#include <cstring>

#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>

namespace normgrad {
namespace jit {
namespace {

std::atomic<int>& last_concurrency() {
  static std::atomic<int> v{0};
  return v;
}
void note_concurrency(int c) {
  last_concurrency().store(c);
}

#ifndef NORMGRAD_STD_THREADS
// One arena per thread cap, shared by concurrent executions (an arena is
// thread-safe); replaced when the cap changes.
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

// Runs body(i) for i in [0, n): serially for small problems, else on oneTBB, or
// on plain std::threads in NORMGRAD_STD_THREADS builds (ThreadSanitizer runs:
// Debian's oneTBB is not instrumented). Work items are independent, so either
// gives the same bits.
template <typename Body>
void for_range(bool serial, int64_t n, const Body& body) {
  if (serial || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#ifdef NORMGRAD_STD_THREADS
  const int cap = num_threads();
  const int64_t cores = cap > 0 ? cap : std::max(1u, std::thread::hardware_concurrency());
  note_concurrency(static_cast<int>(cores));
  const int64_t workers = std::min<int64_t>(n, cores);
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t i = w * n / workers; i < (w + 1) * n / workers; ++i) body(i);
    });
  }
  for (std::thread& t : threads) t.join();
#else
  auto run = [&] {
    note_concurrency(tbb::this_task_arena::max_concurrency());
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i != r.end(); ++i) body(i);
    });
  };
  if (const int cap = num_threads(); cap > 0) {
    capped_arena(cap)->execute(run);  // normgrad::set_num_threads: our own arena
  } else {
    run();
  }
#endif
}

}  // namespace

void parallel_range(bool serial, int64_t n, const std::function<void(int64_t)>& body) {
  for_range(serial, n, body);
}

int last_max_concurrency() {
  return last_concurrency().load();
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
    if (d.phase == BackwardPhase::kApply) {
      // This process holds no data, but diff_gamma and diff_beta are the
      // global sums' (the other processes' data), as on every process.
      const PortMap& pm = conf.ports;
      const double m = load_as_double(in[pm.count], 0, DataType::kS64);
      NG_RETURN_IF_ERROR(check_global_count("BatchNormBackwardApply", d, m));
      for (int64_t c = 0; c < d.channels && d.diff_scale_shift; ++c) {
        const double v = load_as_double(in[pm.variance], c, d.stats_dt);
        const double s = d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + double(d.epsilon));
        store_from_double(out[1], c, d.stats_dt,
                          s * load_as_double(in[pm.sum_dy_xm], c, DataType::kF32));
        store_from_double(out[2], c, d.stats_dt, load_as_double(in[pm.sum_dy], c, DataType::kF32));
      }
      return ok_status();
    }
    for (int64_t c = 0; c < d.channels; ++c) {
      if (d.phase == BackwardPhase::kReduce) {
        store_from_double(out[0], c, DataType::kF32, 0.0);
        store_from_double(out[1], c, DataType::kF32, 0.0);
      } else if (d.diff_scale_shift) {
        store_from_double(out[1], c, d.stats_dt, 0.0);
        store_from_double(out[2], c, d.stats_dt, 0.0);
      }
    }
    if (d.phase == BackwardPhase::kReduce) store_from_double(out[2], 0, DataType::kS64, 0.0);
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
