// JIT driver: the two walks on oneTBB with a thread-independent reduction.
//
// Reductions are partitioned by the data alone: per channel (rows walk) or per
// fixed chunk of pixels (pixels walk), each partial computed by one task in a
// fixed order, and partials combined in f64 in index order. Any thread count
// therefore gives the same bits. In the rows walk a channel's reduction and its
// diff_src pass run back to back in one task, so its src and diff_dst are read
// from cache the second time when the channel fits (1 to 4 channels of a
// 112x112 batch-32 layer fit the L3).
#include <algorithm>
#include <cmath>
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
  const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
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

struct Channel {
  double mean = 0.0, s = 0.0, gamma = 1.0;
};

// Per-channel coefficients of dx = a dy + b (x - mean) + c, and the reductions.
void coefficients(const BnConf& conf, const Channel& ch, double sum_dy, double sum_dyxm, float* a,
                  float* b, float* c, double* diff_gamma, double* diff_beta) {
  const double m = static_cast<double>(conf.d.reduce_size);
  const double g = ch.gamma, s = ch.s;
  *diff_beta = sum_dy;
  *diff_gamma = s * sum_dyxm;
  *a = static_cast<float>(g * s);
  if (conf.d.mode == BackwardMode::kTraining) {
    *b = static_cast<float>(-g * s * s * (*diff_gamma) / m);
    *c = static_cast<float>(-g * s * sum_dy / m);
  } else {
    *b = 0.f;
    *c = 0.f;
  }
}

}  // namespace

namespace {

Status run_dense(const BnConf& conf, const KernelSet& kernels, const std::vector<const void*>& in,
                 const std::vector<void*>& out) {
  const BatchNormDesc& d = conf.d;
  const int64_t nc = d.channels, cp = padded_channels(nc);
  const int64_t es = dtype_size(d.data_dt);
  const DataType sdt = d.stats_dt;
  const PortMap& pm = conf.ports;
  auto input = [&](int index) { return index < 0 ? nullptr : static_cast<const char*>(in[index]); };
  // Statistics in f64 (bf16 statistics and the inverse-std convention handled here).
  std::vector<Channel> ch(static_cast<size_t>(nc));
  for (int64_t c = 0; c < nc; ++c) {
    ch[c].mean = load_as_double(in[pm.mean], c, sdt);
    const double v = load_as_double(in[pm.variance], c, sdt);
    ch[c].s = d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + static_cast<double>(d.epsilon));
    ch[c].gamma = d.use_gamma ? load_as_double(in[pm.gamma], c, sdt) : 1.0;
  }
  std::vector<double> diff_gamma(static_cast<size_t>(nc)), diff_beta(static_cast<size_t>(nc));
  const char* x = input(pm.x);
  const char* x2 = input(pm.x_second);
  const char* dy = input(pm.dy);
  const char* dy2 = input(pm.dy_second);
  char* dx = static_cast<char*>(out[0]);
  // Kernel arguments for the data at byte offset `off`.
  auto args = [&](int64_t off, bool with_dx, const float* coef, void* acc, int64_t rows) {
    return KernelArgs{x + off, dy + off, with_dx ? dx + off : nullptr, coef,
                      acc,     rows,     x2 ? x2 + off : nullptr,      dy2 ? dy2 + off : nullptr};
  };

  if (conf.walk == Walk::kRows) {
    for_range(conf.single_thread, nc, [&](int64_t c) {
      const int64_t base = c * conf.channel_stride * es;
      float coef[4] = {0.f, 0.f, 0.f, static_cast<float>(ch[c].mean)};
      double sums[2] = {0.0, 0.0};
      if (conf.needs_reduction) kernels.reduce(args(base, false, coef, sums, conf.rows));
      coefficients(conf, ch[c], sums[0], sums[1], &coef[0], &coef[1], &coef[2], &diff_gamma[c],
                   &diff_beta[c]);
      kernels.apply(args(base, true, coef, nullptr, conf.rows));
    });
  } else {
    std::vector<float> coef(static_cast<size_t>(4 * cp), 0.f);
    for (int64_t c = 0; c < nc; ++c) coef[3 * cp + c] = static_cast<float>(ch[c].mean);
    const int64_t chunk = conf.chunk_rows;
    const int64_t nchunks = (conf.rows + chunk - 1) / chunk;
    const int64_t row_bytes = conf.row_stride * es;
    std::vector<double> s0(static_cast<size_t>(nc), 0.0), s1(static_cast<size_t>(nc), 0.0);
    if (conf.needs_reduction) {
      std::vector<float> partial(static_cast<size_t>(nchunks * 2 * cp), 0.f);
      for_range(conf.single_thread, nchunks, [&](int64_t k) {
        const int64_t r0 = k * chunk;
        kernels.reduce(args(r0 * row_bytes, false, coef.data() + 3 * cp,
                            partial.data() + k * 2 * cp, std::min(chunk, conf.rows - r0)));
      });
      // Chunks in index order for every channel: sequential in memory, fixed in order.
      for (int64_t k = 0; k < nchunks; ++k) {
        const float* p = partial.data() + k * 2 * cp;
        for (int64_t c = 0; c < nc; ++c) {
          s0[c] += p[c];
          s1[c] += p[cp + c];
        }
      }
    }
    for (int64_t c = 0; c < nc; ++c) {
      coefficients(conf, ch[c], s0[c], s1[c], &coef[c], &coef[cp + c], &coef[2 * cp + c],
                   &diff_gamma[c], &diff_beta[c]);
    }
    // Last chunks first: the reduction just read them, so they are still in cache.
    for_range(conf.single_thread, nchunks, [&](int64_t k_rev) {
      const int64_t r0 = (nchunks - 1 - k_rev) * chunk;
      kernels.apply(
          args(r0 * row_bytes, true, coef.data(), nullptr, std::min(chunk, conf.rows - r0)));
    });
  }
  if (d.diff_scale_shift) {
    for (int64_t c = 0; c < nc; ++c) {
      store_from_double(out[1], c, sdt, diff_gamma[c]);
      store_from_double(out[2], c, sdt, diff_beta[c]);
    }
  }
  return ok_status();
}

// Copies a tensor of `dims` between two stride sets, rows of the last dim at a
// time, spread over threads by the outer dims.
void copy_strided(const char* src, const Dims& src_strides, char* dst, const Dims& dst_strides,
                  const Dims& dims, int64_t es, bool serial) {
  const size_t rank = dims.size();
  const int64_t inner = dims[rank - 1];
  int64_t outer = 1;
  for (size_t k = 0; k + 1 < rank; ++k) outer *= dims[k];
  const int64_t ss = src_strides[rank - 1], ds = dst_strides[rank - 1];
  for_range(serial, outer, [&](int64_t row) {
    int64_t so = 0, dof = 0, rest = row;
    for (size_t k = rank - 1; k-- > 0;) {
      const int64_t i = rest % dims[k];
      rest /= dims[k];
      so += i * src_strides[k];
      dof += i * dst_strides[k];
    }
    const char* s = src + so * es;
    char* d = dst + dof * es;
    if (ss == 1 && ds == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner * es));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * ds * es, s + j * ss * es, static_cast<size_t>(es));
    }
  });
}

}  // namespace

int last_max_concurrency() {
  return last_concurrency().load();
}

ScratchPool::Buffer ScratchPool::take(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first == bytes) {
        Buffer b = std::move(it->second);
        free_.erase(it);
        return b;
      }
    }
  }
  return Buffer(static_cast<char*>(std::aligned_alloc(64, bytes)), &std::free);
}

void ScratchPool::give(Buffer b, size_t bytes) {
  if (!b) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < 8) free_.emplace_back(bytes, std::move(b));  // a few calls' worth
}

Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out,
                               ScratchPool* pool) {
  if (conf.x_strides.empty() && conf.dy_strides.empty() && conf.dx_strides.empty())
    return run_dense(conf, kernels, in, out);
  // Padded or permuted strides: pack into 64-byte aligned dense scratch, run
  // the dense kernels, unpack diff_src. Same arithmetic, same bits.
  const Dims& dims = conf.d.dims;
  const Dims dense = dense_strides(dims);
  const int64_t es = dtype_size(conf.d.data_dt);
  const auto bytes = static_cast<size_t>((conf.total_elements * es + 63) / 64 * 64);
  std::vector<ScratchPool::Buffer> held;
  std::vector<ScratchBuffer> from_allocator;  // a user allocator bypasses the pool
  auto take = [&]() -> char* {
    if (current_allocator() != nullptr) {
      from_allocator.emplace_back(bytes);
      return from_allocator.back().data();
    }
    held.push_back(pool->take(bytes));
    return held.back().get();
  };
  std::vector<const void*> in2 = in;
  std::vector<void*> out2 = out;
  const bool serial = conf.single_thread;
  char* dx_dense = nullptr;
  for (auto [strides, port] : {std::pair<const Dims*, int>{&conf.x_strides, conf.ports.x},
                               std::pair<const Dims*, int>{&conf.dy_strides, conf.ports.dy}}) {
    if (strides->empty()) continue;
    char* buf = take();
    if (buf == nullptr) return out_of_range("JIT repack: cannot allocate " + std::to_string(bytes));
    copy_strided(static_cast<const char*>(in[port]), *strides, buf, dense, dims, es, serial);
    in2[port] = buf;
  }
  if (!conf.dx_strides.empty()) {
    dx_dense = take();
    if (dx_dense == nullptr)
      return out_of_range("JIT repack: cannot allocate " + std::to_string(bytes));
    out2[0] = dx_dense;
  }
  Status s = run_dense(conf, kernels, in2, out2);
  if (s.ok() && dx_dense)
    copy_strided(dx_dense, dense, static_cast<char*>(out[0]), conf.dx_strides, dims, es, serial);
  for (auto& b : held) pool->give(std::move(b), bytes);
  return s;
}

}  // namespace jit
}  // namespace normgrad
