// JIT driver: the two walks on oneTBB with a thread-independent reduction.
//
// Reductions are partitioned by the data alone: per channel (rows walk; short
// rows a group of adjacent channels per task) or per fixed chunk of pixels
// (pixels walk), each partial computed by one task in a fixed order, and
// partials combined in f64 in index order. Any thread count therefore gives
// the same bits. In the rows walk a channel's reduction and its diff_src pass
// run back to back in one task, so its src and diff_dst are read from cache the second time when
// the channel fits (1 to 4 channels of a 112x112 batch-32 layer fit the L3).
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

struct Channel {
  double mean = 0.0, s = 0.0, gamma = 1.0;
};

// Per-channel coefficients of dx = a dy + b (x - mean) + c, and the reductions.
// `m` is the element count per channel the sums cover (all processes' for Apply).
void coefficients(const BnConf& conf, double m, const Channel& ch, double sum_dy, double sum_dyxm,
                  float* a, float* b, float* c, double* diff_gamma, double* diff_beta) {
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

void parallel_range(bool serial, int64_t n, const std::function<void(int64_t)>& body) {
  for_range(serial, n, body);
}

namespace {

// Strided src/diff_dst/diff_src are staged per task: the rows of one channel
// (rows walk) or one chunk of pixels (pixels walk) are gathered into
// per-thread dense buffers that stay in L2, the kernels built for that
// buffer layout run on them, and diff_src is scattered back. DRAM traffic is
// the dense kernels' (full-line strided reads aside), unlike a whole-tensor copy.
struct Staging {
  const KernelSet* kernels = nullptr;      // built for the staged buffers
  Dims x_strides, dy_strides, dx_strides;  // effective strides of the three tensors
};

// run_dense's per-channel arrays, kept per thread between calls. Allocated
// and freed on every call, their 100-200 KB at the heap's top were trimmed by
// glibc after each call and page-faulted back in on the next: 16-44 faults
// per call, 1x7x7x2048 NXC f32 0.116 ms against 0.036 ms without the trim
// (measured). assign() keeps the capacity.
struct DriverScratch {
  std::vector<Channel> ch;
  std::vector<double> red0, red1, diff_gamma, diff_beta, s0, s1;
  std::vector<float> coef, partial;
};

using ScratchLease = ScratchLeaseOf<DriverScratch>;

// Per-thread staging buffers, grown on demand and kept: fresh pages would
// fault on every task.
char* stage_buffer(int which, size_t bytes) {
  thread_local std::vector<char> buffers[3];
  std::vector<char>& b = buffers[which];
  if (b.size() < bytes + 64) b.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((64 - p % 64) % 64);
}

// Walks the rows of `dims` (all but the last dim, row-major order), calling
// fn(row, offset of the row in elements under `strides`); offsets advance
// like an odometer, with no division per row.
template <typename Fn>
void for_each_row(const Dims& dims, const Dims& strides, const Fn& fn) {
  const size_t rank = dims.size();
  if (rank == 0) return;
  int64_t outer = 1;
  for (size_t k = 0; k + 1 < rank; ++k) outer *= dims[k];
  std::vector<int64_t> idx(rank, 0);
  int64_t off = 0;
  for (int64_t row = 0; row < outer; ++row) {
    fn(row, off);
    for (size_t k = rank - 1; k-- > 0;) {  // next row: carry through the outer dims
      off += strides[k];
      if (++idx[k] < dims[k]) break;
      off -= strides[k] * dims[k];
      idx[k] = 0;
    }
  }
}

// Copies the elements of `dims` (row-major order) from strided `src` into dense `dst`.
void gather_dense(const char* src, const Dims& strides, const Dims& dims, int64_t es, char* dst) {
  if (dims.empty()) return;
  const int64_t inner = dims.back(), is = strides.back();
  for_each_row(dims, strides, [&](int64_t row, int64_t off) {
    const char* s = src + off * es;
    char* d = dst + row * inner * es;
    if (is == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner * es));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * es, s + j * is * es, static_cast<size_t>(es));
    }
  });
}

// The reverse: dense `src` into strided `dst`.
void scatter_dense(const char* src, char* dst, const Dims& strides, const Dims& dims, int64_t es) {
  if (dims.empty()) return;
  const int64_t inner = dims.back(), is = strides.back();
  for_each_row(dims, strides, [&](int64_t row, int64_t off) {
    const char* s = src + row * inner * es;
    char* d = dst + off * es;
    if (is == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner * es));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * is * es, s + j * es, static_cast<size_t>(es));
    }
  });
}

// Pixels [r0, r0 + len) of a tensor (every index but the channel's, in
// row-major order), each pixel's C values, between strided memory and a dense
// [len][C] buffer.
template <bool kGather>
void move_pixels(char* dense, char* strided, const Dims& strides, const Dims& dims, int axis,
                 int64_t es, int64_t r0, int64_t len) {
  const auto rank = static_cast<int>(dims.size());
  const int64_t c = dims[axis], cs = strides[axis];
  for (int64_t p = r0; p < r0 + len; ++p) {
    int64_t off = 0, rest = p;
    for (int k = rank - 1; k >= 0; --k) {
      if (k == axis) continue;
      off += (rest % dims[k]) * strides[k];
      rest /= dims[k];
    }
    char* row = dense + (p - r0) * c * es;
    char* mem = strided + off * es;
    if (cs == 1) {
      if (kGather) {
        std::memcpy(row, mem, static_cast<size_t>(c * es));
      } else {
        std::memcpy(mem, row, static_cast<size_t>(c * es));
      }
      continue;
    }
    for (int64_t j = 0; j < c; ++j) {
      if (kGather) {
        std::memcpy(row + j * es, mem + j * cs * es, static_cast<size_t>(es));
      } else {
        std::memcpy(mem + j * cs * es, row + j * es, static_cast<size_t>(es));
      }
    }
  }
}

// The sub-tensor of one channel (dims without the channel axis, and their strides).
void channel_view(const Dims& dims, const Dims& strides, int axis, Dims* sub_dims,
                  Dims* sub_strides) {
  sub_dims->clear();
  sub_strides->clear();
  for (size_t k = 0; k < dims.size(); ++k) {
    if (static_cast<int>(k) == axis) continue;
    sub_dims->push_back(dims[k]);
    sub_strides->push_back(strides[k]);
  }
}

Status run_dense(const BnConf& conf, const KernelSet& dense_kernels,
                 const std::vector<const void*>& in, const std::vector<void*>& out,
                 const Staging* stage = nullptr) {
  const KernelSet& kernels = stage ? *stage->kernels : dense_kernels;
  const BatchNormDesc& d = conf.d;
  const int64_t nc = d.channels, cp = padded_channels(nc);
  const int64_t es = dtype_size(d.data_dt);
  const DataType sdt = d.stats_dt;
  const PortMap& pm = conf.ports;
  auto input = [&](int index) { return index < 0 ? nullptr : static_cast<const char*>(in[index]); };
  // Statistics in f64 (bf16 statistics and the inverse-std convention handled
  // here). The rows walks load each channel's in the task that owns the
  // channel, so this per-channel scalar work (a square root and a division)
  // runs in parallel, and store its diff_gamma/diff_beta there too; the
  // pixels walk needs every channel's at once. With thousands of channels
  // and few elements each (7x7, small batches) the serial loops were a
  // measured share of the time.
  ScratchLease lease;
  DriverScratch& scratch = lease.get();
  std::vector<Channel>& ch = scratch.ch;
  ch.assign(static_cast<size_t>(nc), Channel{});
  auto load_channel = [&](int64_t c) {
    Channel& h = ch[c];
    h.mean = load_as_double(in[pm.mean], c, sdt);
    if (pm.variance < 0) return;  // Reduce: the sums need the mean only
    const double v = load_as_double(in[pm.variance], c, sdt);
    h.s = d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + static_cast<double>(d.epsilon));
    h.gamma = d.use_gamma ? load_as_double(in[pm.gamma], c, sdt) : 1.0;
    if (d.from_dst) {
      // The kernels sum dy (y - beta) = gamma sum dy xhat (mean = beta), so
      // the coefficients take s' = 1/gamma in place of s and gamma' = gamma^2 s:
      // diff_gamma = s' sum, a = gamma' s' = gamma s, b = -gamma' s'^2 diff_gamma/M
      // = -s diff_gamma/M (times y - beta = gamma xhat), c = -gamma s diff_beta/M.
      const double gamma = h.gamma;
      h.gamma = gamma * gamma * h.s;
      h.s = 1.0 / gamma;
    }
  };
  const bool per_task_stats = conf.walk == Walk::kRows;
  for (int64_t c = 0; c < nc && !per_task_stats; ++c) load_channel(c);
  // Reduce: the per-channel sums out; Apply: the global sums and count in.
  const bool reduce_only = d.phase == BackwardPhase::kReduce;
  const bool given_sums = d.phase == BackwardPhase::kApply;
  double m = static_cast<double>(d.reduce_size);
  if (given_sums) {
    m = load_as_double(in[pm.count], 0, DataType::kS64);
    NG_RETURN_IF_ERROR(check_global_count("BatchNormBackwardApply", d, m));
  }
  auto given = [&](int port, int64_t c) { return load_as_double(in[port], c, DataType::kF32); };
  std::vector<double>& red0 = scratch.red0;
  std::vector<double>& red1 = scratch.red1;
  red0.assign(reduce_only ? static_cast<size_t>(nc) : 0, 0.0);
  red1.assign(reduce_only ? static_cast<size_t>(nc) : 0, 0.0);
  std::vector<double>& diff_gamma = scratch.diff_gamma;
  std::vector<double>& diff_beta = scratch.diff_beta;
  diff_gamma.assign(static_cast<size_t>(nc), 0.0);
  diff_beta.assign(static_cast<size_t>(nc), 0.0);
  auto store_diffs = [&](int64_t c) {
    if (!d.diff_scale_shift) return;
    store_from_double(out[1], c, sdt, diff_gamma[c]);
    store_from_double(out[2], c, sdt, diff_beta[c]);
  };
  const char* x = input(pm.x);
  const char* x2 = input(pm.x_second);
  const char* dy = input(pm.dy);
  const char* dy2 = input(pm.dy_second);
  char* dx = static_cast<char*>(out[0]);
  // Kernel arguments for the data at byte offset `off`.
  // Kernel arguments for the inputs at byte offset `off` and diff_src at `dx_off`.
  auto args2 = [&](int64_t off, int64_t dx_off, bool with_dx, const float* coef, void* acc,
                   int64_t rows) {
    return KernelArgs{
        x + off, dy + off, with_dx ? dx + dx_off : nullptr, coef,
        acc,     rows,     x2 ? x2 + off : nullptr,         dy2 ? dy2 + off : nullptr};
  };
  auto args = [&](int64_t off, bool with_dx, const float* coef, void* acc, int64_t rows) {
    return args2(off, off, with_dx, coef, acc, rows);
  };

  // Staged: the channel's (or chunk's) data, gathered into per-thread buffers.
  Dims sub_dims, xs_sub, dys_sub, dxs_sub;
  if (stage && conf.walk == Walk::kRows) {
    channel_view(d.dims, stage->x_strides, d.channel_axis, &sub_dims, &xs_sub);
    channel_view(d.dims, stage->dy_strides, d.channel_axis, &sub_dims, &dys_sub);
    channel_view(d.dims, stage->dx_strides, d.channel_axis, &sub_dims, &dxs_sub);
  }
  if (conf.walk == Walk::kRows && stage) {
    const size_t bytes = static_cast<size_t>(d.reduce_size * es);
    for_range(conf.single_thread, nc, [&](int64_t c) {
      char* bx = stage_buffer(0, bytes);
      char* bdy = stage_buffer(1, bytes);
      char* bdx = stage_buffer(2, bytes);
      const int axis = d.channel_axis;
      gather_dense(x + c * stage->x_strides[axis] * es, xs_sub, sub_dims, es, bx);
      gather_dense(dy + c * stage->dy_strides[axis] * es, dys_sub, sub_dims, es, bdy);
      load_channel(c);
      float coef[4] = {0.f, 0.f, 0.f, static_cast<float>(ch[c].mean)};
      double sums[2] = {0.0, 0.0};
      if (given_sums) {
        sums[0] = given(pm.sum_dy, c), sums[1] = given(pm.sum_dy_xm, c);
      } else if (conf.needs_reduction) {
        kernels.reduce(KernelArgs{bx, bdy, nullptr, coef, sums, conf.rows, nullptr, nullptr});
      }
      if (reduce_only) {
        red0[c] = sums[0], red1[c] = sums[1];
        return;
      }
      coefficients(conf, m, ch[c], sums[0], sums[1], &coef[0], &coef[1], &coef[2], &diff_gamma[c],
                   &diff_beta[c]);
      store_diffs(c);
      kernels.apply(KernelArgs{bx, bdy, bdx, coef, nullptr, conf.rows, nullptr, nullptr});
      scatter_dense(bdx, dx + c * stage->dx_strides[axis] * es, dxs_sub, sub_dims, es);
    });
  } else if (conf.walk == Walk::kRows && conf.channel_group > 0) {
    // Short rows: one task per group of adjacent channels, the kernels walking
    // the group image by image. Each channel's sums are in a fixed order (its
    // rows in order, the reduce calls in blocks of images fixed by the shape),
    // whichever group or thread computes them.
    const int64_t group = conf.channel_group;
    const auto bounce_bytes = static_cast<size_t>(bounce_block_bytes(conf));
    const int64_t ngroups = (nc + group - 1) / group;
    for_range(conf.single_thread, ngroups, [&](int64_t gi) {
      const int64_t c0 = gi * group, cnt = std::min(group, nc - c0);
      const int64_t base = c0 * conf.channel_stride * es;
      const int64_t dx_base = c0 * conf.dx_channel_stride * es;
      float coef[4 * kRowGroupAvx512] = {};
      double sums[2 * kRowGroupAvx512] = {};
      for (int64_t g = 0; g < cnt; ++g) {
        load_channel(c0 + g);
        coef[4 * g + 3] = static_cast<float>(ch[c0 + g].mean);
        if (given_sums)
          sums[2 * g] = given(pm.sum_dy, c0 + g), sums[2 * g + 1] = given(pm.sum_dy_xm, c0 + g);
      }
      for (int64_t r0 = 0; r0 < conf.rows && conf.needs_reduction; r0 += kRowsPerGroupedReduce) {
        KernelArgs a = args(base + r0 * conf.row_stride * es, false, coef, sums,
                            std::min(kRowsPerGroupedReduce, conf.rows - r0));
        a.channels = cnt;
        kernels.reduce(a);
      }
      for (int64_t g = 0; g < cnt; ++g) {
        const int64_t cg = c0 + g;
        if (reduce_only) {
          red0[cg] = sums[2 * g], red1[cg] = sums[2 * g + 1];
          continue;
        }
        coefficients(conf, m, ch[cg], sums[2 * g], sums[2 * g + 1], &coef[4 * g], &coef[4 * g + 1],
                     &coef[4 * g + 2], &diff_gamma[cg], &diff_beta[cg]);
        store_diffs(cg);
      }
      if (reduce_only) return;
      void* bounce = bounce_bytes > 0 ? stage_buffer(0, bounce_bytes) : nullptr;
      KernelArgs a = args2(base, dx_base, true, coef, bounce, conf.rows);
      a.channels = cnt;
      kernels.apply(a);
    });
  } else if (conf.walk == Walk::kRows) {
    // One call per channel, or per (channel, image) over padded rows; the
    // reduce kernel adds each row's sums into `sums` in order, so the calls
    // split nothing that the bits depend on beyond the shape.
    const int64_t calls = conf.batch_calls > 0 ? conf.batch_calls : 1;
    for_range(conf.single_thread, nc, [&](int64_t c) {
      const int64_t base = c * conf.channel_stride * es;
      const int64_t dx_base = c * conf.dx_channel_stride * es;
      load_channel(c);
      float coef[4] = {0.f, 0.f, 0.f, static_cast<float>(ch[c].mean)};
      double sums[2] = {0.0, 0.0};
      if (given_sums) sums[0] = given(pm.sum_dy, c), sums[1] = given(pm.sum_dy_xm, c);
      for (int64_t b = 0; b < calls && conf.needs_reduction; ++b)
        kernels.reduce(args(base + b * conf.batch_stride * es, false, coef, sums, conf.rows));
      if (reduce_only) {
        red0[c] = sums[0], red1[c] = sums[1];
        return;
      }
      coefficients(conf, m, ch[c], sums[0], sums[1], &coef[0], &coef[1], &coef[2], &diff_gamma[c],
                   &diff_beta[c]);
      store_diffs(c);
      if (conf.apply_reverse_rows > 0) {  // last rows first (BnConf::apply_reverse_rows)
        const int64_t step = conf.apply_reverse_rows;
        for (int64_t r0 = (conf.rows - 1) / step * step; r0 >= 0; r0 -= step) {
          KernelArgs a =
              args2(base + r0 * conf.row_stride * es, dx_base + r0 * conf.dx_row_stride * es, true,
                    coef, nullptr, std::min(step, conf.rows - r0));
          a.prefetch_next = r0 == 0 && c + 1 < nc ? 1 : 0;
          kernels.apply(a);
        }
        return;
      }
      for (int64_t b = 0; b < calls; ++b) {
        KernelArgs a =
            args2(base + b * conf.batch_stride * es, dx_base + b * conf.dx_batch_stride * es, true,
                  coef, nullptr, conf.rows);
        a.prefetch_next = c + 1 < nc ? 1 : 0;
        kernels.apply(a);
      }
    });
  } else {
    std::vector<float>& coef = scratch.coef;
    coef.assign(static_cast<size_t>(4 * cp), 0.f);
    for (int64_t c = 0; c < nc; ++c) coef[3 * cp + c] = static_cast<float>(ch[c].mean);
    const int64_t chunk = conf.chunk_rows;
    const int64_t nchunks = (conf.rows + chunk - 1) / chunk;
    int64_t nchunks_apply = nchunks;
    const int64_t row_bytes = conf.row_stride * es;
    std::vector<double>& s0 = scratch.s0;
    std::vector<double>& s1 = scratch.s1;
    s0.assign(static_cast<size_t>(nc), 0.0);
    s1.assign(static_cast<size_t>(nc), 0.0);
    for (int64_t c = 0; c < nc && given_sums; ++c)
      s0[c] = given(pm.sum_dy, c), s1[c] = given(pm.sum_dy_xm, c);
    if (conf.needs_reduction) {
      std::vector<float>& partial = scratch.partial;
      partial.assign(static_cast<size_t>(nchunks * 2 * cp), 0.f);
      for_range(conf.single_thread, nchunks, [&](int64_t k) {
        const int64_t r0 = k * chunk;
        const int64_t len = std::min(chunk, conf.rows - r0);
        if (stage) {
          char* bx = stage_buffer(0, static_cast<size_t>(len * row_bytes));
          char* bdy = stage_buffer(1, static_cast<size_t>(len * row_bytes));
          move_pixels<true>(bx, const_cast<char*>(x), stage->x_strides, d.dims, d.channel_axis, es,
                            r0, len);
          move_pixels<true>(bdy, const_cast<char*>(dy), stage->dy_strides, d.dims, d.channel_axis,
                            es, r0, len);
          kernels.reduce(KernelArgs{bx, bdy, nullptr, coef.data() + 3 * cp,
                                    partial.data() + k * 2 * cp, len, nullptr, nullptr});
          return;
        }
        kernels.reduce(
            args(r0 * row_bytes, false, coef.data() + 3 * cp, partial.data() + k * 2 * cp, len));
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
    if (reduce_only) {
      red0.swap(s0);  // both stay in the scratch
      red1.swap(s1);
      nchunks_apply = 0;
    }
    for (int64_t c = 0; c < nc && !reduce_only; ++c) {
      coefficients(conf, m, ch[c], s0[c], s1[c], &coef[c], &coef[cp + c], &coef[2 * cp + c],
                   &diff_gamma[c], &diff_beta[c]);
    }
    // Last chunks first: the reduction just read them, so they are still in cache.
    for_range(conf.single_thread, nchunks_apply, [&](int64_t k_rev) {
      const int64_t r0 = (nchunks - 1 - k_rev) * chunk;
      const int64_t len = std::min(chunk, conf.rows - r0);
      if (stage) {
        const auto bytes = static_cast<size_t>(len * row_bytes);
        char* bx = stage_buffer(0, bytes);
        char* bdy = stage_buffer(1, bytes);
        char* bdx = stage_buffer(2, bytes);
        move_pixels<true>(bx, const_cast<char*>(x), stage->x_strides, d.dims, d.channel_axis, es,
                          r0, len);
        move_pixels<true>(bdy, const_cast<char*>(dy), stage->dy_strides, d.dims, d.channel_axis, es,
                          r0, len);
        kernels.apply(KernelArgs{bx, bdy, bdx, coef.data(), nullptr, len, nullptr, nullptr});
        move_pixels<false>(bdx, dx, stage->dx_strides, d.dims, d.channel_axis, es, r0, len);
        return;
      }
      kernels.apply(
          args2(r0 * row_bytes, r0 * conf.dx_row_stride * es, true, coef.data(), nullptr, len));
    });
  }
  if (reduce_only) {
    for (int64_t c = 0; c < nc; ++c) {
      store_from_double(out[0], c, DataType::kF32, red0[c]);
      store_from_double(out[1], c, DataType::kF32, red1[c]);
    }
    store_from_double(out[2], 0, DataType::kS64, static_cast<double>(d.reduce_size));
    return ok_status();
  }
  for (int64_t c = 0; c < nc && !per_task_stats; ++c) store_diffs(c);
  return ok_status();
}

}  // namespace

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
  s.streaming_stores = false;             // diff_src goes to a cached staging buffer
  s.apply_prefetch_next_channel = false;  // each channel is packed on its own
  s.apply_reverse_rows = 0;
  if (s.walk == Walk::kRows) s.row_stride = s.cols;  // one channel's [N][S] rows
  s.dx_row_stride = s.row_stride;
  s.x_strides.clear();
  s.dy_strides.clear();
  s.dx_strides.clear();
  return s;
}

}  // namespace jit
}  // namespace normgrad
