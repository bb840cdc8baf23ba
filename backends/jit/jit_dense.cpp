// JIT dense driver: one backward over dense (or per-task staged) buffers.
//
// DenseRun holds what every walk shares: the per-channel statistics in f64,
// the kernel arguments, and the outputs. run() loads the statistics, runs
// the walk the conf chose, and writes what is left. The rows walks reduce and
// apply a channel (or a group of adjacent channels) in one task, so a
// channel's data is read from cache the second time; the pixels walk runs
// its phases over every channel in turn: reduce per fixed chunk of pixels,
// merge the chunks in index order, coefficients, apply (WalkConf says in
// what order and how the threads share the chunks).
// The reductions are partitioned by the shape alone and the tasks run on the
// pool (jit_parallel.hpp), so any thread count gives the same bits.
// Sibling batch norms (run_batch_norm_siblings: two backwards that read one
// fused diff_dst, over the same walk) are two DenseRuns driven by one walk:
// each task runs the first's kernels, then the second's on the same rows.
// The first's reduce writes the shared gradient into the second's diff_src,
// where the second's reduce and both applies find it in the cache, and the
// second's apply, last, overwrites it element by element. Each member's
// calls and sums are those of its own run, so its bits are too.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_parallel.hpp>
#include <normgrad/backends/jit/jit_staging.hpp>

namespace normgrad {
namespace jit {
namespace {

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
  *a = kernel_float(g * s);
  if (conf.d.mode == BackwardMode::kTraining) {
    *b = kernel_float(-g * s * s * (*diff_gamma) / m);
    *c = kernel_float(-g * s * sum_dy / m);
  } else {
    *b = 0.f;
    *c = 0.f;
  }
}

// run_dense's per-channel arrays, kept per thread between calls. Allocated
// and freed on every call, their 100-200 KB at the heap's top were trimmed by
// glibc after each call and page-faulted back in on the next, which cost
// small cases more than their kernel (docs/performance.md, "Why the JIT
// chooses what it does"). assign() keeps the capacity.
struct DriverScratch {
  std::vector<Channel> ch;
  std::vector<double> red0, red1, diff_gamma, diff_beta, s0, s1;
  LineVector<float> coef, partial;  // vectors of channels: on lines
};

using ScratchLease = ScratchLeaseOf<DriverScratch>;
// Sibling runs' two scratches, leased as one.
struct SiblingScratch {
  DriverScratch run[2];
};
using SiblingScratchLease = ScratchLeaseOf<SiblingScratch>;

class DenseRun {
 public:
  DenseRun(const BnConf& conf, const KernelSet& dense_kernels, const std::vector<const void*>& in,
           const std::vector<void*>& out, const Staging* stage, DriverScratch& scratch)
      : conf_(conf),
        d_(conf.d),
        pm_(conf.ports),
        kernels_(stage ? *stage->kernels : dense_kernels),
        in_(in),
        out_(out),
        stage_(stage),
        scratch_(scratch),
        nc_(d_.channels),
        cp_(padded_channels(d_.channels)),
        es_(dtype_size(d_.data_dt)),
        reduce_only_(d_.phase == BackwardPhase::kReduce),
        given_sums_(d_.phase == BackwardPhase::kApply),
        x_(input(pm_.x)),
        x2_(input(pm_.x_second)),
        dy_(input(pm_.dy)),
        dy2_(input(pm_.dy_second)),
        dy3_(input(pm_.dy_third)),
        dx_(pm_.dx >= 0 ? static_cast<char*>(out[pm_.dx]) : nullptr),
        dy_out_(conf.dy_side_out ? static_cast<char*>(out[pm_.dy_out]) : nullptr) {}

  // A second run over the same walk (the same shape, dtype, layout and
  // walk; the whole backward over dense tensors), driven by this one's.
  void set_sibling(DenseRun* sibling) {
    assert(!stage_ && !sibling->stage_ && !reduce_only_ && !given_sums_ &&
           sibling->conf_.walk.kind == conf_.walk.kind && "siblings: the whole, dense backward");
    sib_ = sibling;
  }
  Status run();

 private:
  // The runs this walk drives: itself, then its sibling.
  int members() const { return sib_ != nullptr ? 2 : 1; }
  DenseRun& member(int m) { return m == 0 ? *this : *sib_; }
  // Whether any member reduces (a member in inference mode does not).
  bool any_reduces() const {
    return conf_.needs_reduction || (sib_ != nullptr && sib_->conf_.needs_reduction);
  }
  // run()'s per-run parts before and after the walk.
  Status prepare();
  void finish();

  const char* input(int index) const {
    return index < 0 ? nullptr : static_cast<const char*>(in_[index]);
  }
  // Channel c's statistics in f64 (bf16 statistics and the inverse-std
  // convention handled here). The rows walks load each channel's in the task
  // that owns it, so this scalar work (a square root and a division) runs in
  // parallel; the pixels walk needs every channel's at once. With thousands
  // of channels and few elements each (7x7, small batches) serial loops
  // would be a share of the time worth having back.
  void load_channel(int64_t c);
  double given(int port, int64_t c) const { return load_as_double(in_[port], c, DataType::kF32); }
  // Channel c's sums are final: Reduce keeps them (returns false); otherwise
  // the coefficients go to a, b, cc and diff_gamma/diff_beta are stored.
  bool finish_channel(int64_t c, double sum_dy, double sum_dyxm, float* a, float* b, float* cc);
  void store_diffs(int64_t c);
  // Kernel arguments for the inputs at byte offset `off` and diff_src at
  // `dx_off` (with_dx: an apply's). With a side output the reduce stores the
  // fused diff_dst at `off` and the apply reads it there.
  KernelArgs args(int64_t off, int64_t dx_off, bool with_dx, const float* coef, void* acc,
                  int64_t rows) const {
    KernelArgs a{
        x_ + off, dy_ + off, with_dx ? dx_ + dx_off : nullptr, coef,
        acc,      rows,      x2_ ? x2_ + off : nullptr,        dy2_ ? dy2_ + off : nullptr};
    if (dy3_ != nullptr) a.dy3 = dy3_ + off;
    if (dy_out_ != nullptr && with_dx) {
      a.dy = dy_out_ + off;  // the apply reads what the reduce stored
      a.dy2 = a.dy3 = nullptr;
    } else if (dy_out_ != nullptr) {
      a.dy_out = dy_out_ + off;
    }
    return a;
  }

  // call(r, n) over [0, len) in the kernel calls of one chunk: the whole
  // chunk, or pieces of sweep_rows pixels for the channel-swept kernels (the
  // reduce's calls add into the chunk's partial in order, so the bits still
  // depend on the shape alone).
  template <typename Call>
  void calls(int64_t len, const Call& call) const {
    const int64_t step = conf_.walk.sweep_rows > 0 ? conf_.walk.sweep_rows : len;
    for (int64_t r = 0; r < len; r += step) call(r, std::min(step, len - r));
  }

  // The walks.
  void rows_staged();
  void rows_grouped();
  void rows_per_channel();
  void pixels();
  void pixels_strips();
  // The pixels walks' coefficient rows a, b, c and the means, cp_ apart.
  LineVector<float>& coef_with_means() {
    LineVector<float>& coef = scratch_.coef;
    coef.assign(static_cast<size_t>(4 * cp_), 0.f);
    for (int64_t c = 0; c < nc_; ++c) coef[3 * cp_ + c] = kernel_float(scratch_.ch[c].mean);
    return coef;
  }
  // The pixels walk's phases.
  // coef: each member's rows (coef_with_means).
  void pixels_reduce(int64_t nchunks, LineVector<float>* const* coef);
  void pixels_apply(int64_t nchunks, LineVector<float>* const* coef);
  void pixels_stage(char* bx, char* bdy, int64_t r0, int64_t len) const;

  const BnConf& conf_;
  const BatchNormDesc& d_;
  const PortMap& pm_;
  const KernelSet& kernels_;
  const std::vector<const void*>& in_;
  const std::vector<void*>& out_;
  const Staging* stage_;
  DriverScratch& scratch_;
  DenseRun* sib_ = nullptr;
  const int64_t nc_, cp_, es_;
  const bool reduce_only_;  // Reduce: the per-channel sums out
  const bool given_sums_;   // Apply: the global sums and count in
  double m_ = 0.0;          // elements per channel the sums cover
  const char* x_;
  const char* x2_;
  const char* dy_;
  const char* dy2_;
  const char* dy3_;  // Fuse::kAddReluBackward's second gradient, or null
  char* dx_;
  char* dy_out_;  // the fused diff_dst's side output (BnConf::dy_side_out), or null
};

void DenseRun::load_channel(int64_t c) {
  Channel& h = scratch_.ch[c];
  h.mean = load_as_double(in_[pm_.mean], c, d_.stats_dt);
  if (pm_.variance < 0) return;  // Reduce: the sums need the mean only
  const double v = load_as_double(in_[pm_.variance], c, d_.stats_dt);
  h.s = d_.variance_is_inv_std ? v : 1.0 / std::sqrt(v + static_cast<double>(d_.epsilon));
  h.gamma = d_.use_gamma ? load_as_double(in_[pm_.gamma], c, d_.stats_dt) : 1.0;
  if (d_.from_dst) {
    // The kernels sum dy (y - beta) = gamma sum dy xhat (mean = beta), so
    // the coefficients take s' = 1/gamma in place of s and gamma' = gamma^2 s:
    // diff_gamma = s' sum, a = gamma' s' = gamma s, b = -gamma' s'^2 diff_gamma/M
    // = -s diff_gamma/M (times y - beta = gamma xhat), c = -gamma s diff_beta/M.
    const double gamma = h.gamma;
    h.gamma = gamma * gamma * h.s;
    h.s = 1.0 / gamma;
  }
}

void DenseRun::store_diffs(int64_t c) {
  if (!d_.diff_scale_shift) return;
  store_from_double(out_[pm_.diff_gamma], c, d_.stats_dt, scratch_.diff_gamma[c]);
  store_from_double(out_[pm_.diff_beta], c, d_.stats_dt, scratch_.diff_beta[c]);
}

bool DenseRun::finish_channel(int64_t c, double sum_dy, double sum_dyxm, float* a, float* b,
                              float* cc) {
  if (reduce_only_) {
    scratch_.red0[c] = sum_dy, scratch_.red1[c] = sum_dyxm;
    return false;
  }
  coefficients(conf_, m_, scratch_.ch[c], sum_dy, sum_dyxm, a, b, cc, &scratch_.diff_gamma[c],
               &scratch_.diff_beta[c]);
  return true;
}

Status DenseRun::prepare() {
  scratch_.ch.assign(static_cast<size_t>(nc_), Channel{});
  const bool per_task_stats = conf_.walk.kind == Walk::kRows;
  for (int64_t c = 0; c < nc_ && !per_task_stats; ++c) load_channel(c);
  m_ = static_cast<double>(d_.reduce_size);
  if (given_sums_) {
    m_ = load_as_double(in_[pm_.count], 0, DataType::kS64);
    NG_RETURN_IF_ERROR(check_global_count("BatchNormBackwardApply", d_, m_));
  }
  scratch_.red0.assign(reduce_only_ ? static_cast<size_t>(nc_) : 0, 0.0);
  scratch_.red1.assign(reduce_only_ ? static_cast<size_t>(nc_) : 0, 0.0);
  scratch_.diff_gamma.assign(static_cast<size_t>(nc_), 0.0);
  scratch_.diff_beta.assign(static_cast<size_t>(nc_), 0.0);
  return ok_status();
}

void DenseRun::finish() {
  if (reduce_only_) {
    for (int64_t c = 0; c < nc_; ++c) {
      store_from_double(out_[pm_.sum_dy_out], c, DataType::kF32, scratch_.red0[c]);
      store_from_double(out_[pm_.sum_dy_xm_out], c, DataType::kF32, scratch_.red1[c]);
    }
    store_from_double(out_[pm_.count_out], 0, DataType::kS64, static_cast<double>(d_.reduce_size));
    return;
  }
  for (int64_t c = 0; c < nc_ && conf_.walk.kind != Walk::kRows; ++c) store_diffs(c);
}

Status DenseRun::run() {
  for (int m = 0; m < members(); ++m) NG_RETURN_IF_ERROR(member(m).prepare());
  if (conf_.walk.kind == Walk::kRows && stage_) {
    rows_staged();
  } else if (conf_.walk.kind == Walk::kRows && conf_.walk.channel_group > 0) {
    rows_grouped();
  } else if (conf_.walk.kind == Walk::kRows) {
    rows_per_channel();
  } else if (conf_.walk.strips) {
    pixels_strips();
  } else {
    pixels();
  }
  for (int m = 0; m < members(); ++m) member(m).finish();
  return ok_status();
}

// Strided rows: each channel's data gathered into per-thread buffers.
void DenseRun::rows_staged() {
  Dims sub_dims, xs_sub, dys_sub, dxs_sub;
  const int axis = d_.channel_axis;
  channel_view(d_.dims, stage_->x_strides, axis, &sub_dims, &xs_sub);
  channel_view(d_.dims, stage_->dy_strides, axis, &sub_dims, &dys_sub);
  channel_view(d_.dims, stage_->dx_strides, axis, &sub_dims, &dxs_sub);
  const size_t bytes = static_cast<size_t>(d_.reduce_size * es_);
  for_range(conf_.single_thread, nc_, [&](int64_t c) {
    char* bx = stage_buffer(0, bytes);
    char* bdy = stage_buffer(1, bytes);
    char* bdx = stage_buffer(2, bytes);
    gather_dense(x_ + c * stage_->x_strides[axis] * es_, xs_sub, sub_dims, es_, bx);
    gather_dense(dy_ + c * stage_->dy_strides[axis] * es_, dys_sub, sub_dims, es_, bdy);
    load_channel(c);
    float coef[4] = {0.f, 0.f, 0.f, kernel_float(scratch_.ch[c].mean)};
    double sums[2] = {0.0, 0.0};
    if (given_sums_) {
      sums[0] = given(pm_.sum_dy, c), sums[1] = given(pm_.sum_dy_xm, c);
    } else if (conf_.needs_reduction) {
      kernels_.reduce(KernelArgs{bx, bdy, nullptr, coef, sums, conf_.walk.rows, nullptr, nullptr});
    }
    if (!finish_channel(c, sums[0], sums[1], &coef[0], &coef[1], &coef[2])) return;
    store_diffs(c);
    kernels_.apply(KernelArgs{bx, bdy, bdx, coef, nullptr, conf_.walk.rows, nullptr, nullptr});
    scatter_dense(bdx, dx_ + c * stage_->dx_strides[axis] * es_, dxs_sub, sub_dims, es_);
  });
}

// Short rows: one task per group of adjacent channels, the kernels walking
// the group image by image. Each channel's sums are in a fixed order (its
// rows in order, the reduce calls in blocks of images fixed by the shape),
// whichever group or thread computes them.
void DenseRun::rows_grouped() {
  const int64_t group = conf_.walk.channel_group;
  const auto bounce_bytes = static_cast<size_t>(bounce_block_bytes(conf_));
  const int64_t ngroups = (nc_ + group - 1) / group;
  const int nm = members();
  for_range(conf_.single_thread, ngroups, [&](int64_t gi) {
    const int64_t c0 = gi * group, cnt = std::min(group, nc_ - c0);
    const int64_t base = c0 * conf_.walk.channel_stride * es_;
    const int64_t dx_base = c0 * conf_.walk.dx_channel_stride * es_;
    float coef[2][4 * kRowGroupAvx512] = {};
    double sums[2][2 * kRowGroupAvx512] = {};
    for (int m = 0; m < nm; ++m) {
      DenseRun& run = member(m);
      for (int64_t g = 0; g < cnt; ++g) {
        run.load_channel(c0 + g);
        coef[m][4 * g + 3] = kernel_float(run.scratch_.ch[c0 + g].mean);
        if (given_sums_)
          sums[m][2 * g] = given(pm_.sum_dy, c0 + g),
                      sums[m][2 * g + 1] = given(pm_.sum_dy_xm, c0 + g);
      }
    }
    for (int64_t r0 = 0; r0 < conf_.walk.rows && any_reduces(); r0 += kRowsPerGroupedReduce) {
      const int64_t off = base + r0 * conf_.walk.row_stride * es_;
      for (int m = 0; m < nm; ++m) {
        DenseRun& run = member(m);
        if (!run.conf_.needs_reduction) continue;
        KernelArgs a = run.args(off, off, false, coef[m], sums[m],
                                std::min(kRowsPerGroupedReduce, conf_.walk.rows - r0));
        a.channels = cnt;
        run.kernels_.reduce(a);
      }
    }
    for (int m = 0; m < nm; ++m) {
      for (int64_t g = 0; g < cnt; ++g) {
        if (!member(m).finish_channel(c0 + g, sums[m][2 * g], sums[m][2 * g + 1], &coef[m][4 * g],
                                      &coef[m][4 * g + 1], &coef[m][4 * g + 2]))
          continue;
        member(m).store_diffs(c0 + g);
      }
    }
    if (reduce_only_) return;
    void* bounce = bounce_bytes > 0 ? stage_buffer(0, bounce_bytes) : nullptr;
    for (int m = 0; m < nm; ++m) {
      KernelArgs a = member(m).args(base, dx_base, true, coef[m], bounce, conf_.walk.rows);
      a.channels = cnt;
      member(m).kernels_.apply(a);
    }
  });
}

// One call per channel, or per (channel, image) over padded rows; the reduce
// kernel adds each row's sums into `sums` in order, so the calls split
// nothing that the bits depend on beyond the shape.
void DenseRun::rows_per_channel() {
  const int64_t calls = conf_.walk.batch_calls > 0 ? conf_.walk.batch_calls : 1;
  const int nm = members();
  for_range(conf_.single_thread, nc_, [&](int64_t c) {
    const int64_t base = c * conf_.walk.channel_stride * es_;
    const int64_t dx_base = c * conf_.walk.dx_channel_stride * es_;
    float coef[2][4] = {};
    double sums[2][2] = {};
    for (int m = 0; m < nm; ++m) {
      member(m).load_channel(c);
      coef[m][3] = kernel_float(member(m).scratch_.ch[c].mean);
    }
    if (given_sums_) sums[0][0] = given(pm_.sum_dy, c), sums[0][1] = given(pm_.sum_dy_xm, c);
    for (int64_t b = 0; b < calls && any_reduces(); ++b) {
      const int64_t off = base + b * conf_.walk.batch_stride * es_;
      for (int m = 0; m < nm; ++m) {
        if (member(m).conf_.needs_reduction)
          member(m).kernels_.reduce(
              member(m).args(off, off, false, coef[m], sums[m], conf_.walk.rows));
      }
    }
    for (int m = 0; m < nm; ++m) {
      if (!member(m).finish_channel(c, sums[m][0], sums[m][1], &coef[m][0], &coef[m][1],
                                    &coef[m][2]))
        return;
      member(m).store_diffs(c);
    }
    for (int m = 0; m < nm; ++m) {
      DenseRun& run = member(m);
      if (conf_.stream.reverse_rows > 0) {  // last rows first (StreamConf::reverse_rows)
        const int64_t step = conf_.stream.reverse_rows;
        for (int64_t r0 = (conf_.walk.rows - 1) / step * step; r0 >= 0; r0 -= step) {
          KernelArgs a = run.args(base + r0 * conf_.walk.row_stride * es_,
                                  dx_base + r0 * conf_.walk.dx_row_stride * es_, true, coef[m],
                                  nullptr, std::min(step, conf_.walk.rows - r0));
          a.prefetch_next = r0 == 0 && c + 1 < nc_ ? 1 : 0;
          run.kernels_.apply(a);
        }
        continue;
      }
      for (int64_t b = 0; b < calls; ++b) {
        KernelArgs a = run.args(base + b * conf_.walk.batch_stride * es_,
                                dx_base + b * conf_.walk.dx_batch_stride * es_, true, coef[m],
                                nullptr, conf_.walk.rows);
        a.prefetch_next = c + 1 < nc_ ? 1 : 0;
        run.kernels_.apply(a);
      }
    }
  });
}

// Pixels [r0, r0 + len) of strided src and diff_dst into the staging buffers.
void DenseRun::pixels_stage(char* bx, char* bdy, int64_t r0, int64_t len) const {
  gather_pixels(bx, x_, stage_->x_strides, d_.dims, d_.channel_axis, es_, r0, len);
  gather_pixels(bdy, dy_, stage_->dy_strides, d_.dims, d_.channel_axis, es_, r0, len);
}

// Phase 1: each fixed chunk of pixels sums into its own partial (the means
// are coef's fourth row); phase 2 merges the partials in chunk order.
void DenseRun::pixels_reduce(int64_t nchunks, LineVector<float>* const* coef) {
  const int64_t chunk = conf_.walk.chunk_rows, row_bytes = conf_.walk.row_stride * es_;
  const int nm = members();
  for (int m = 0; m < nm; ++m) {
    DriverScratch& s = member(m).scratch_;
    s.s0.assign(static_cast<size_t>(nc_), 0.0);
    s.s1.assign(static_cast<size_t>(nc_), 0.0);
  }
  for (int64_t c = 0; c < nc_ && given_sums_; ++c)
    scratch_.s0[c] = given(pm_.sum_dy, c), scratch_.s1[c] = given(pm_.sum_dy_xm, c);
  if (!any_reduces()) return;
  for (int m = 0; m < nm; ++m)
    member(m).scratch_.partial.assign(
        member(m).conf_.needs_reduction ? static_cast<size_t>(nchunks * 2 * cp_) : 0, 0.f);
  for_range(
      conf_.single_thread, nchunks,
      [&](int64_t k) {
        const int64_t r0 = k * chunk, len = std::min(chunk, conf_.walk.rows - r0);
        if (stage_) {
          float* out = scratch_.partial.data() + k * 2 * cp_;
          const float* means = coef[0]->data() + 3 * cp_;
          char* bx = stage_buffer(0, static_cast<size_t>(len * row_bytes));
          char* bdy = stage_buffer(1, static_cast<size_t>(len * row_bytes));
          pixels_stage(bx, bdy, r0, len);
          calls(len, [&](int64_t r, int64_t n) {
            kernels_.reduce(KernelArgs{bx + r * row_bytes, bdy + r * row_bytes, nullptr, means, out,
                                       n, nullptr, nullptr});
          });
          return;
        }
        for (int m = 0; m < nm; ++m) {
          DenseRun& run = member(m);
          if (!run.conf_.needs_reduction) continue;
          float* out = run.scratch_.partial.data() + k * 2 * cp_;
          const float* means = coef[m]->data() + 3 * cp_;
          calls(len, [&](int64_t r, int64_t n) {
            run.kernels_.reduce(run.args((r0 + r) * row_bytes, 0, false, means, out, n));
          });
        }
      },
      conf_.walk.contiguous_split ? Split::kContiguous : Split::kAdaptive);
  // Chunks in index order for every channel: sequential in memory, fixed in order.
  for (int m = 0; m < nm; ++m) {
    DriverScratch& s = member(m).scratch_;
    for (int64_t k = 0; k < nchunks && member(m).conf_.needs_reduction; ++k) {
      const float* p = s.partial.data() + k * 2 * cp_;
      for (int64_t c = 0; c < nc_; ++c) {
        s.s0[c] += p[c];
        s.s1[c] += p[cp_ + c];
      }
    }
  }
}

// Phase 4: diff_src. Last chunks first (WalkConf::apply_last_first): each
// thread starts on the chunks the reduce just read, which may still be in its
// caches. With the adaptive split that is the whole range reversed, so a
// thread may start on the other thread's last chunks.
void DenseRun::pixels_apply(int64_t nchunks, LineVector<float>* const* coef) {
  const int64_t chunk = conf_.walk.chunk_rows, row_bytes = conf_.walk.row_stride * es_;
  const bool contiguous = conf_.walk.contiguous_split, last_first = conf_.walk.apply_last_first;
  const bool whole_range_reversed = last_first && !contiguous;
  const Split split = !contiguous  ? Split::kAdaptive
                      : last_first ? Split::kContiguousLastFirst
                                   : Split::kContiguous;
  const int nm = members();
  for_range(
      conf_.single_thread, nchunks,
      [&](int64_t i) {
        const int64_t k = whole_range_reversed ? nchunks - 1 - i : i;
        const int64_t r0 = k * chunk;
        const int64_t len = std::min(chunk, conf_.walk.rows - r0);
        if (stage_) {
          const auto bytes = static_cast<size_t>(len * row_bytes);
          char* bx = stage_buffer(0, bytes);
          char* bdy = stage_buffer(1, bytes);
          char* bdx = stage_buffer(2, bytes);
          pixels_stage(bx, bdy, r0, len);
          calls(len, [&](int64_t r, int64_t n) {
            kernels_.apply(KernelArgs{bx + r * row_bytes, bdy + r * row_bytes, bdx + r * row_bytes,
                                      coef[0]->data(), nullptr, n, nullptr, nullptr});
          });
          scatter_pixels(bdx, dx_, stage_->dx_strides, d_.dims, d_.channel_axis, es_, r0, len);
          return;
        }
        for (int m = 0; m < nm; ++m) {
          DenseRun& run = member(m);
          calls(len, [&](int64_t r, int64_t n) {
            run.kernels_.apply(run.args((r0 + r) * row_bytes,
                                        (r0 + r) * conf_.walk.dx_row_stride * es_, true,
                                        coef[m]->data(), nullptr, n));
          });
        }
      },
      split);
}

void DenseRun::pixels() {
  const int nm = members();
  LineVector<float>* coef[2] = {nullptr, nullptr};
  for (int m = 0; m < nm; ++m) coef[m] = &member(m).coef_with_means();
  const int64_t nchunks = (conf_.walk.rows + conf_.walk.chunk_rows - 1) / conf_.walk.chunk_rows;
  pixels_reduce(nchunks, coef);
  // Phase 3: the coefficients (Reduce: the sums are the output).
  for (int m = 0; m < nm; ++m) {
    DenseRun& run = member(m);
    LineVector<float>& cf = *coef[m];
    for (int64_t c = 0; c < nc_; ++c)
      run.finish_channel(c, run.scratch_.s0[c], run.scratch_.s1[c], &cf[c], &cf[cp_ + c],
                         &cf[2 * cp_ + c]);
  }
  if (!reduce_only_) pixels_apply(nchunks, coef);
}

// WalkConf::strips: a task per strip of `cols` channels, its reduce over
// every chunk (each chunk's partial from zero, merged in chunk order as
// pixels_reduce merges them), its coefficients, then its apply, while the
// strip's src and diff_dst are in the cache. The whole backward only.
void DenseRun::pixels_strips() {
  const int64_t w = conf_.walk.cols, chunk = conf_.walk.chunk_rows;
  const int64_t row_bytes = conf_.walk.row_stride * es_,
                dx_row_bytes = conf_.walk.dx_row_stride * es_;
  const int64_t nchunks = (conf_.walk.rows + chunk - 1) / chunk;
  assert(nc_ % w == 0 && !given_sums_ && !reduce_only_ && !stage_ &&
         "strips: the whole, dense backward");
  const int nm = members();
  LineVector<float>* coef[2] = {nullptr, nullptr};
  for (int m = 0; m < nm; ++m) coef[m] = &member(m).coef_with_means();
  for_range(conf_.single_thread, nc_ / w, [&](int64_t strip) {
    const int64_t c0 = strip * w;
    // The kernels' partial rows are cp_ apart; this strip's lanes of them.
    thread_local LineVector<float> partial[2];
    thread_local std::vector<double> sums[2];
    for (int m = 0; m < nm; ++m) {
      partial[m].assign(static_cast<size_t>(2 * cp_), 0.f);
      sums[m].assign(static_cast<size_t>(2 * w), 0.0);
    }
    for (int64_t k = 0; k < nchunks && any_reduces(); ++k) {
      const int64_t r0 = k * chunk, len = std::min(chunk, conf_.walk.rows - r0);
      for (int m = 0; m < nm; ++m) {
        DenseRun& run = member(m);
        if (!run.conf_.needs_reduction) continue;
        float* acc = partial[m].data() + c0;
        std::fill(acc, acc + w, 0.f);
        std::fill(acc + cp_, acc + cp_ + w, 0.f);
        calls(len, [&](int64_t r, int64_t n) {
          run.kernels_.reduce(run.args((r0 + r) * row_bytes + c0 * es_, 0, false,
                                       coef[m]->data() + 3 * cp_ + c0, acc, n));
        });
        for (int64_t j = 0; j < w; ++j) {
          sums[m][j] += acc[j];
          sums[m][w + j] += acc[cp_ + j];
        }
      }
    }
    for (int m = 0; m < nm; ++m) {
      LineVector<float>& cf = *coef[m];
      for (int64_t j = 0; j < w; ++j) {
        const int64_t c = c0 + j;
        member(m).finish_channel(c, sums[m][j], sums[m][w + j], &cf[c], &cf[cp_ + c],
                                 &cf[2 * cp_ + c]);
      }
    }
    for (int64_t k = 0; k < nchunks; ++k) {
      const int64_t r0 = k * chunk, len = std::min(chunk, conf_.walk.rows - r0);
      for (int m = 0; m < nm; ++m) {
        DenseRun& run = member(m);
        calls(len, [&](int64_t r, int64_t n) {
          run.kernels_.apply(run.args((r0 + r) * row_bytes + c0 * es_,
                                      (r0 + r) * dx_row_bytes + c0 * es_, true,
                                      coef[m]->data() + c0, nullptr, n));
        });
      }
    }
  });
}

}  // namespace

Status run_dense(const BnConf& conf, const KernelSet& kernels, const std::vector<const void*>& in,
                 const std::vector<void*>& out, const Staging* stage) {
  ScratchLease lease;
  return DenseRun(conf, kernels, in, out, stage, lease.get()).run();
}

Status run_dense_siblings(const BnConf& first, const KernelSet& first_kernels, const BnConf& second,
                          const KernelSet& second_kernels, const std::vector<const void*>& in,
                          const std::vector<const void*>& second_in,
                          const std::vector<void*>& out) {
  SiblingScratchLease lease;
  DenseRun a(first, first_kernels, in, out, nullptr, lease.get().run[0]);
  DenseRun b(second, second_kernels, second_in, out, nullptr, lease.get().run[1]);
  a.set_sibling(&b);
  return a.run();
}

}  // namespace jit
}  // namespace normgrad
