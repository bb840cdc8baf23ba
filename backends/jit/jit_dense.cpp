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

#include <normgrad/backends/jit/jit_dense.hpp>

namespace normgrad {
namespace jit {
namespace {

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

}  // namespace

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
