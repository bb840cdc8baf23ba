// The JIT backward's pixels walks (NXC, and NCX with one pixel a row): the
// reduce over fixed chunks of pixels merged in chunk order, the apply, and
// the strips that take both for a strip of channels while it is in the
// cache. DenseRun and the design are in jit_dense.hpp and jit_dense.cpp.
#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include <normgrad/backends/jit/jit_dense.hpp>

namespace normgrad {
namespace jit {

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
  // Chunks in index order for every channel, the channels in blocks over
  // the threads: the same order, so the same bits, for any thread count.
  for_range(conf_.single_thread, merge_blocks(), [&](int64_t b) {
    const int64_t c0 = b * kMergeChannels, c1 = std::min(nc_, c0 + kMergeChannels);
    for (int m = 0; m < nm; ++m) {
      DenseRun& run = member(m);
      DriverScratch& s = run.scratch_;
      for (int64_t k = 0; k < nchunks && run.conf_.needs_reduction; ++k) {
        const float* p = s.partial.data() + k * 2 * cp_;
        for (int64_t c = c0; c < c1; ++c) {
          s.s0[c] += p[run.at(c)];
          s.s1[c] += p[cp_ + run.at(c)];
        }
      }
    }
  });
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
  // Phase 3: the coefficients (Reduce: the sums are the output), per channel.
  for_range(conf_.single_thread, merge_blocks(), [&](int64_t b) {
    const int64_t c0 = b * kMergeChannels, c1 = std::min(nc_, c0 + kMergeChannels);
    for (int m = 0; m < nm; ++m) {
      DenseRun& run = member(m);
      LineVector<float>& cf = *coef[m];
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t k = run.at(c);
        run.finish_channel(c, run.scratch_.s0[c], run.scratch_.s1[c], &cf[k], &cf[cp_ + k],
                           &cf[2 * cp_ + k]);
      }
    }
  });
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
          sums[m][j] += acc[run.at(j)];
          sums[m][w + j] += acc[cp_ + run.at(j)];
        }
      }
    }
    for (int m = 0; m < nm; ++m) {
      LineVector<float>& cf = *coef[m];
      for (int64_t j = 0; j < w; ++j) {
        const int64_t c = c0 + j, k = c0 + member(m).at(j);  // strips are whole 32s
        member(m).finish_channel(c, sums[m][j], sums[m][w + j], &cf[k], &cf[cp_ + k],
                                 &cf[2 * cp_ + k]);
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

}  // namespace jit
}  // namespace normgrad
