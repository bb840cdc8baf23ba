// JIT batch-norm forward driver: shifted statistics over fixed chunks, merged
// in f64 in chunk order, then the normalisation, on oneTBB; and the portable
// C++ kernels for CPUs (or dtypes) the generator does not cover.
//
// Determinism: every chunk's f32 sums come from one kernel call over bounds
// fixed by the shape, and each channel's f64 totals add them in chunk order,
// whichever thread ran which chunk. The apply is elementwise.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <optional>

#include <normgrad/backends/backend.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_forward_finish.hpp>
#include <normgrad/graph/data_type.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>

namespace normgrad {
namespace jit {
namespace {

// The pixels walk's per-channel arrays, kept per thread (ScratchLeaseOf).
struct FwdScratch {
  LineVector<float> shift, coef;  // vectors of channels: on lines
  std::vector<double> partial;
};
// A run's and its sibling's, leased as one.
struct FwdScratchPair {
  FwdScratch run[2];
};

// One forward call: the conf, the kernels and the call's buffers, unpacked
// once; run() takes the walk the conf chose (the backward's DenseRun is the
// same shape). The members c_, k_, x_, y_, r_ and es_ keep the walks' arithmetic
// readable; `apply_` is the apply_ kernel to call (the streaming one when dst
// starts on a line). Forward siblings are two FwdRuns driven by one walk
// (set_sibling): each task takes both runs' statistics, then the first's
// apply (the shortcut's dst, into the partition's dst), then the second's,
// which reads it there as its residual from the cache and overwrites it.
// A side output (set_side) is a second FwdRun whose apply runs on each
// block just before this one's, on this run's coefficients.
class FwdRun {
 public:
  FwdRun(const FwdConf& conf, const FwdKernels& kernels, const std::vector<const void*>& in,
         const std::vector<void*>& out)
      : c_(conf),
        k_(kernels),
        in_(in),
        out_(out),
        x_(static_cast<const char*>(in[static_cast<size_t>(conf.in_src)])),
        y_(conf.out_dst < 0 ? nullptr  // Reduce: no dst
                            : static_cast<char*>(out[static_cast<size_t>(conf.out_dst)])),
        r_(conf.residual ? static_cast<const char*>(in[static_cast<size_t>(conf.in_residual)])
                         : nullptr),
        es_(dtype_size(conf.dt)),
        apply_(apply_fn(conf, y_)) {}

  // The second run over the same walk (make_fwd_sibling_confs checked it).
  void set_sibling(FwdRun* second) {
    assert(c_.phase == FwdPhase::kWhole && second->c_.phase == FwdPhase::kWhole &&
           side_ == nullptr && "forward siblings: whole forwards, no side output");
    sib_ = second;
  }
  // The side output's run (make_fwd_side_conf): its apply kernel and dst
  // only; it takes this run's coefficients (check_fwd_side_walks).
  void set_side(const FwdRun* side) {
    assert(sib_ == nullptr && "a side output is not taken with siblings");
    side_ = side;
  }

  void run() {
    if (c_.ncx_rows && c_.channel_group > 0) {
      rows_grouped();
    } else if (c_.strip_channels > 0) {
      pixel_strips();
    } else if (c_.ncx_rows) {
      rows();
    } else {
      pixels();
    }
  }

 private:
  int members() const { return sib_ != nullptr ? 2 : 1; }
  FwdRun& member(int k) { return k == 0 ? *this : *sib_; }
  Finish finish(double m) const { return Finish{c_, in_, out_, m}; }

  void apply_pair(const FwdArgs& a) const;
  void apply_images(const FwdArgs& a, int64_t image_bytes) const;
  void rows();
  void rows_sums(int64_t ch, float shift, double* s1, double* s2) const;
  void rows_apply(int64_t ch, const float* coef) const;
  void rows_grouped();
  void pixels();
  void pixel_strips();

  const FwdConf& c_;
  const FwdKernels& k_;
  const std::vector<const void*>& in_;
  const std::vector<void*>& out_;
  const char* const x_;
  char* const y_;
  const char* const r_;
  const int64_t es_;
  void (FwdKernels::*const apply_)(const FwdArgs&) const;
  FwdRun* sib_ = nullptr;
  const FwdRun* side_ = nullptr;
};

// One apply call; with a side output, the side output's apply on the same
// block first (it reads src, and the residual, from memory; the forward's
// apply then reads them from the cache).
void FwdRun::apply_pair(const FwdArgs& a) const {
  if (side_ != nullptr) {
    FwdArgs s = a;
    s.y = side_->y_ + (static_cast<char*>(a.y) - y_);
    (side_->k_.*side_->apply_)(s);
  }
  (k_.*apply_)(a);
}

// A rows walk's apply over a.rows images, one image_bytes of src each; with
// a side output, in runs of images of up to kFwdApplyBytes, so each run's
// src is still in the L2 when the second apply reads it.
void FwdRun::apply_images(const FwdArgs& a, int64_t image_bytes) const {
  const int64_t run =
      side_ == nullptr ? a.rows
                       : std::max<int64_t>(1, kFwdApplyBytes / std::max<int64_t>(1, image_bytes));
  const int64_t stride = c_.c * c_.spatial * es_;  // an image
  for (int64_t n = 0; n < a.rows; n += run) {
    FwdArgs b = a;
    b.x = static_cast<const char*>(a.x) + n * stride;
    b.y = static_cast<char*>(a.y) + n * stride;
    if (a.residual != nullptr) b.residual = static_cast<const char*>(a.residual) + n * stride;
    b.rows = std::min(run, a.rows - n);
    apply_pair(b);
  }
}

// A channel's chunks: runs of whole rows up to kFwdRowPiece elements, or
// pieces of one row when a row is longer.
void FwdRun::rows_sums(int64_t ch, float shift, double* s1, double* s2) const {
  const int64_t pieces = (c_.spatial + kFwdRowPiece - 1) / kFwdRowPiece;
  auto row_offset = [&](int64_t n) { return (n * c_.c + ch) * c_.spatial; };
  *s1 = *s2 = 0.0;
  auto chunk = [&](int64_t off, int64_t len, int64_t rows) {
    FwdArgs a;
    float f1 = 0.f, f2 = 0.f;
    a.x = x_ + off * es_;
    a.coef = &shift;
    a.s1 = &f1;
    a.s2 = &f2;
    a.len = len;
    a.rows = rows;
    k_.stats(a);
    *s1 += f1;
    *s2 += f2;
  };
  if (c_.chunk_rows > 1) {
    for (int64_t n = 0; n < c_.n; n += c_.chunk_rows)
      chunk(row_offset(n), c_.spatial, std::min(c_.chunk_rows, c_.n - n));
    return;
  }
  for (int64_t n = 0; n < c_.n; ++n) {
    for (int64_t p = 0; p < pieces; ++p)
      chunk(row_offset(n) + p * kFwdRowPiece, std::min(kFwdRowPiece, c_.spatial - p * kFwdRowPiece),
            1);
  }
}

void FwdRun::rows_apply(int64_t ch, const float* coef) const {
  const int64_t off = ch * c_.spatial;
  FwdArgs a;
  a.x = x_ + off * es_;
  a.y = y_ + off * es_;
  a.residual = r_ == nullptr ? nullptr : r_ + off * es_;
  a.coef = coef;
  a.len = c_.spatial;
  a.rows = c_.n;
  apply_images(a, c_.spatial * es_);
}

void FwdRun::rows() {
  const double m = static_cast<double>(c_.n * c_.spatial);
  // Each channel on one task: its rows are summed and then normalised while
  // they are still in the cache.
  parallel_range(c_.single_thread, c_.c, [&](int64_t ch) {
    float coef[2][4];
    for (int k = 0; k < members(); ++k) {
      FwdRun& r = member(k);
      const Finish fin = r.finish(m);
      if (fwd_given_statistics(c_.phase)) {
        fin.global(ch, &coef[k][0], &coef[k][1], &coef[k][2], &coef[k][3]);
        continue;
      }
      const float shift = ncx_shift(r.c_, r.x_, ch);
      double s1, s2;
      r.rows_sums(ch, shift, &s1, &s2);
      if (c_.phase == FwdPhase::kReduce) {
        fin.reduce(ch, shift, s1, s2);
        continue;
      }
      fin.channel(ch, shift, s1, s2, &coef[k][0], &coef[k][1], &coef[k][2], &coef[k][3]);
    }
    if (c_.phase == FwdPhase::kReduce) return;
    for (int k = 0; k < members(); ++k) member(k).rows_apply(ch, coef[k]);
  });
}

// FwdConf::channel_group: a task per group of adjacent channels, its
// statistics in chunks of chunk_rows images (each chunk's f32 sums into the
// f64 totals in image order), then its apply_ over every image while the
// group's rows are still in the cache.
void FwdRun::rows_grouped() {
  const int64_t group = c_.channel_group;
  assert(group > 0 && group <= kRowGroupAvx512 && "a grouped walk takes 1 to 8 channels a call");
  const double m = static_cast<double>(c_.n * c_.spatial);
  parallel_range(c_.single_thread, (c_.c + group - 1) / group, [&](int64_t task) {
    const int64_t ch0 = task * group, count = std::min(group, c_.c - ch0);
    float coef[2][4 * kRowGroupAvx512] = {};
    // Bytes to the group's first row in `image`.
    auto at = [&](int64_t image) { return ((image * c_.c + ch0) * c_.spatial) * es_; };
    for (int k = 0; k < members(); ++k) {
      FwdRun& r = member(k);
      const Finish fin = r.finish(m);
      float* cf = coef[k];
      if (fwd_given_statistics(c_.phase)) {
        for (int64_t g = 0; g < count; ++g)
          fin.global(ch0 + g, &cf[4 * g], &cf[4 * g + 1], &cf[4 * g + 2], &cf[4 * g + 3]);
        continue;
      }
      float shift[kRowGroupAvx512] = {};
      double s1[kRowGroupAvx512] = {}, s2[kRowGroupAvx512] = {};
      for (int64_t g = 0; g < count; ++g) shift[g] = ncx_shift(r.c_, r.x_, ch0 + g);
      for (int64_t n = 0; n < c_.n; n += c_.chunk_rows) {
        float f1[kRowGroupAvx512], f2[kRowGroupAvx512];
        FwdArgs a;
        a.x = r.x_ + at(n);
        a.coef = shift;
        a.s1 = f1;
        a.s2 = f2;
        a.len = c_.spatial;
        a.rows = std::min(c_.chunk_rows, c_.n - n);
        a.channels = count;
        r.k_.stats(a);
        for (int64_t g = 0; g < count; ++g) {
          s1[g] += f1[g];
          s2[g] += f2[g];
        }
      }
      for (int64_t g = 0; g < count; ++g) {
        if (c_.phase == FwdPhase::kReduce) {
          fin.reduce(ch0 + g, shift[g], s1[g], s2[g]);
        } else {
          fin.channel(ch0 + g, shift[g], s1[g], s2[g], &cf[4 * g], &cf[4 * g + 1], &cf[4 * g + 2],
                      &cf[4 * g + 3]);
        }
      }
    }
    if (c_.phase == FwdPhase::kReduce) return;
    // The bounce buffer: this thread's, as the call is (no call inside waits).
    alignas(64) thread_local unsigned char bounce[kFwdBounceBytes];
    for (int k = 0; k < members(); ++k) {
      const FwdRun& r = member(k);
      FwdArgs a;
      a.bounce = bounce;
      a.x = r.x_ + at(0);
      a.y = r.y_ + at(0);
      a.residual = r.r_ == nullptr ? nullptr : r.r_ + at(0);
      a.coef = coef[k];
      a.len = c_.spatial;
      a.rows = c_.n;
      a.channels = count;
      r.apply_images(a, count * c_.spatial * es_);
    }
  });
}

void FwdRun::pixels() {
  const int64_t cp = padded_channels(c_.c);
  const int64_t chunks = (c_.pixels + c_.chunk_pixels - 1) / c_.chunk_pixels;
  // Chunks are added in groups fixed by the shape (about 64 groups), each into
  // its own f64 partials; the groups are then added in order.
  const int64_t per_group = (chunks + 63) / 64;
  const int64_t groups = (chunks + per_group - 1) / per_group;
  // Per-channel arrays from the thread's kept scratch: at C = 2048 the
  // partials alone are 2 MB, which a fresh allocation would fault in per call.
  ScratchLeaseOf<FwdScratchPair> lease;
  FwdScratch* scratch = lease.get().run;
  const bool stats = !fwd_given_statistics(c_.phase);  // Apply is given the global statistics
  for (int k = 0; k < members(); ++k) {
    if (stats) pixel_shifts(member(k).c_, member(k).x_, &scratch[k].shift);
    // Each group's first chunk writes its partials, the rest add: no zeroing pass.
    scratch[k].partial.resize(static_cast<size_t>(groups * 2 * cp));
  }
  parallel_range(c_.single_thread || !stats, stats ? groups : 0, [&](int64_t g) {
    // The chunk's f32 sums: the task's thread keeps them (no call inside waits).
    thread_local LineVector<float> f;
    f.resize(static_cast<size_t>(2 * cp));
    const int64_t last = std::min(chunks, (g + 1) * per_group);
    for (int k = 0; k < members(); ++k) {
      const FwdRun& r = member(k);
      double* d1 = &scratch[k].partial[static_cast<size_t>(g * 2 * cp)];
      double* d2 = d1 + cp;
      for (int64_t ck = g * per_group; ck < last; ++ck) {
        const int64_t p0 = ck * c_.chunk_pixels;
        FwdArgs a;
        a.x = r.x_ + p0 * c_.c * es_;
        a.coef = scratch[k].shift.data();
        a.s1 = f.data();
        a.s2 = f.data() + cp;
        a.len = std::min(c_.chunk_pixels, c_.pixels - p0);
        r.k_.stats(a);
        if (ck == g * per_group) {
          std::copy(a.s1, a.s1 + c_.c, d1);
          std::copy(a.s2, a.s2 + c_.c, d2);
          continue;
        }
        for (int64_t ch = 0; ch < c_.c; ++ch) {
          d1[ch] += a.s1[ch];
          d2[ch] += a.s2[ch];
        }
      }
    }
  });
  // The groups in order for every channel, the channels in blocks over the
  // threads (at C = 2048 with 64 groups, 262k additions a thread alone would
  // make wait); the statistics outputs and the coefficients are per channel.
  const int64_t blocks = (c_.c + kFwdMergeChannels - 1) / kFwdMergeChannels;
  for (int k = 0; k < members(); ++k) {
    const FwdRun& r = member(k);
    LineVector<float>& coef = scratch[k].coef;
    const std::vector<double>& partial = scratch[k].partial;
    coef.assign(static_cast<size_t>(4 * cp), 0.f);
    const Finish fin = r.finish(static_cast<double>(c_.pixels));
    parallel_range(c_.single_thread, blocks, [&](int64_t blk) {
      const int64_t ch0 = blk * kFwdMergeChannels;
      const int64_t ch_end = std::min(c_.c, ch0 + kFwdMergeChannels);
      // The block's totals, the groups added in order for every channel. The
      // groups' rows are 2 * cp doubles (16 KiB at C = 1024) apart: walked a
      // row at a time, not a channel down every row, which would touch a
      // page per group per channel and wait on the TLB.
      double t1[kFwdMergeChannels] = {}, t2[kFwdMergeChannels] = {};
      for (int64_t g = 0; stats && g < groups; ++g) {  // Apply: given statistics, no groups
        const double* p1 = &partial[static_cast<size_t>(g * 2 * cp)];
        const double* p2 = p1 + cp;
        for (int64_t ch = ch0; ch < ch_end; ++ch) {
          t1[ch - ch0] += p1[ch];
          t2[ch - ch0] += p2[ch];
        }
      }
      for (int64_t ch = ch0; ch < ch_end; ++ch) {
        float* hi = &coef[static_cast<size_t>(ch)];
        float* lo = hi + cp;
        float* a = hi + 2 * cp;
        float* b = hi + 3 * cp;
        if (!stats) {
          fin.global(ch, hi, lo, a, b);
          continue;
        }
        const float shift = scratch[k].shift[static_cast<size_t>(ch)];
        if (c_.phase == FwdPhase::kReduce) {
          fin.reduce(ch, shift, t1[ch - ch0], t2[ch - ch0]);
        } else {
          fin.channel(ch, shift, t1[ch - ch0], t2[ch - ch0], hi, lo, a, b);
        }
      }
    });
    if (r.c_.line_walk && r.c_.pair_vectors) pair_order(cp, coef.data(), 0, cp);
  }
  if (c_.phase == FwdPhase::kReduce) return;
  const int64_t block = c_.apply_pixels;
  parallel_range(c_.single_thread, (c_.pixels + block - 1) / block, [&](int64_t blk) {
    const int64_t p0 = blk * block;
    const int64_t off = p0 * c_.c;
    // Siblings: the first's dst for this block goes to a block of the
    // thread's own, which the second reads as its residual from the L2:
    // neither DRAM nor dst's lines see it.
    thread_local LineVector<float> between;
    if (sib_ != nullptr) between.resize(static_cast<size_t>((block * c_.c * es_ + 3) / 4));
    for (int k = 0; k < members(); ++k) {
      const FwdRun& r = member(k);
      FwdArgs a;
      a.x = r.x_ + off * es_;
      a.y = sib_ != nullptr && k == 0 ? static_cast<void*>(between.data()) : r.y_ + off * es_;
      a.residual = sib_ != nullptr && k == 1 ? static_cast<const void*>(between.data())
                   : r.r_ == nullptr         ? nullptr
                                             : r.r_ + off * es_;
      a.coef = scratch[k].coef.data();
      a.len = std::min(block, c_.pixels - p0);
      r.apply_pair(a);
    }
  });
}

// FwdConf::strip_channels: one task per strip of adjacent channels, its
// statistics over every pixel, then its apply_ over every pixel while the
// strip's src is still in the cache. The chunks, their groups and the order of
// every f64 addition are run_pixels': the same bits.
void FwdRun::pixel_strips() {
  const int64_t cp = padded_channels(c_.c);
  const int64_t w = c_.strip_channels;
  assert(w > 0 && c_.c % w == 0 && "strips are whole and divide C");
  const int64_t chunks = (c_.pixels + c_.chunk_pixels - 1) / c_.chunk_pixels;
  const int64_t per_group = (chunks + 63) / 64;
  ScratchLeaseOf<FwdScratchPair> lease;
  FwdScratch* scratch = lease.get().run;
  for (int k = 0; k < members(); ++k) {
    pixel_shifts(member(k).c_, member(k).x_, &scratch[k].shift);
    scratch[k].coef.assign(static_cast<size_t>(4 * cp), 0.f);
  }
  parallel_range(c_.single_thread, c_.c / w, [&](int64_t strip) {
    const int64_t c0 = strip * w;
    thread_local LineVector<float> f;
    thread_local std::vector<double> sums;
    f.resize(static_cast<size_t>(2 * w));
    for (int k = 0; k < members(); ++k) {
      const FwdRun& r = member(k);
      const LineVector<float>& shift = scratch[k].shift;
      LineVector<float>& coef = scratch[k].coef;
      sums.assign(static_cast<size_t>(4 * w), 0.0);  // totals S1, S2; a group's S1, S2
      double* t1 = sums.data();
      double* t2 = t1 + w;
      double* g1 = t2 + w;
      double* g2 = g1 + w;
      FwdArgs a;
      a.coef = shift.data() + c0;
      a.s1 = f.data();
      a.s2 = f.data() + w;
      for (int64_t first = 0; first < chunks; first += per_group) {
        std::fill(g1, g1 + 2 * w, 0.0);
        for (int64_t ck = first; ck < std::min(chunks, first + per_group); ++ck) {
          const int64_t p0 = ck * c_.chunk_pixels;
          a.x = r.x_ + (p0 * c_.c + c0) * es_;
          a.len = std::min(c_.chunk_pixels, c_.pixels - p0);
          r.k_.stats(a);
          for (int64_t j = 0; j < w; ++j) {
            g1[j] += a.s1[j];
            g2[j] += a.s2[j];
          }
        }
        for (int64_t j = 0; j < w; ++j) {
          t1[j] += g1[j];
          t2[j] += g2[j];
        }
      }
      const Finish fin = r.finish(static_cast<double>(c_.pixels));
      for (int64_t j = 0; j < w; ++j) {
        const int64_t ch = c0 + j;
        float* hi = &coef[static_cast<size_t>(ch)];
        fin.channel(ch, shift[static_cast<size_t>(ch)], t1[j], t2[j], hi, hi + cp, hi + 2 * cp,
                    hi + 3 * cp);
      }
      // The strip is whole lines: whole 16s of 16-bit channels.
      if (r.c_.line_walk && r.c_.pair_vectors) pair_order(cp, coef.data(), c0, c0 + w);
    }
    // The strip's apply in one call; with a side output, in blocks of
    // kFwdApplyBytes of the strip's src (apply_pixels counts whole pixels:
    // at 14x14x1024 f32 it would make calls of 8 KiB), its apply then the
    // forward's on each.
    const int64_t block = c_.apply_pixels;
    if (sib_ == nullptr) {
      const int64_t step =
          side_ == nullptr ? c_.pixels : std::max<int64_t>(block, kFwdApplyBytes / (w * es_));
      for (int64_t p0 = 0; p0 < c_.pixels; p0 += step) {
        const int64_t off = (p0 * c_.c + c0) * es_;
        FwdArgs b;
        b.x = x_ + off;
        b.y = y_ + off;
        b.residual = r_ == nullptr ? nullptr : r_ + off;
        b.coef = scratch[0].coef.data() + c0;
        b.len = std::min(step, c_.pixels - p0);
        apply_pair(b);
      }
      return;
    }
    // Siblings: in blocks of pixels, the first's dst into a block of the
    // thread's own (pixels C apart, as in dst), the second's residual there.
    thread_local LineVector<float> between;
    between.resize(static_cast<size_t>((block * c_.c * es_ + 3) / 4));
    char* const mid = reinterpret_cast<char*>(between.data()) + c0 * es_;
    for (int64_t p0 = 0; p0 < c_.pixels; p0 += block) {
      const int64_t off = (p0 * c_.c + c0) * es_;
      for (int k = 0; k < 2; ++k) {
        const FwdRun& r = member(k);
        FwdArgs b;
        b.x = r.x_ + off;
        b.y = k == 0 ? mid : r.y_ + off;
        b.residual = k == 1 ? mid : nullptr;
        b.coef = scratch[k].coef.data() + c0;
        b.len = std::min(block, c_.pixels - p0);
        (r.k_.*r.apply_)(b);
      }
    }
  });
}

}  // namespace

namespace {

// The forward, with the side output's run when `side` is given.
Status run_forward(const FwdConf& conf, const FwdKernels& kernels, const FwdConf* side,
                   const FwdKernels* side_kernels, const std::vector<const void*>& in,
                   const std::vector<void*>& out) {
  const Finish fin{conf, in, out, conf.empty ? 0.0 : static_cast<double>(conf.pixels)};
  if (conf.phase == FwdPhase::kApply) {
    // The global count covers this process's elements, and some: with every
    // process's batch empty there are no statistics to normalise with.
    NG_RETURN_IF_ERROR(
        check_forward_count("BatchNormForwardApply", conf.pixels, fin.global_count()));
  }
  if (conf.phase == FwdPhase::kReduce && conf.out_count >= 0)
    *static_cast<int64_t*>(out[static_cast<size_t>(conf.out_count)]) = conf.pixels;
  if (conf.empty) {
    float unused[4];
    for (int64_t ch = 0; ch < conf.c; ++ch) {
      if (conf.phase == FwdPhase::kReduce) {
        fin.reduce(ch, 0.0, 0.0, 0.0);
      } else if (fwd_given_statistics(conf.phase)) {
        fin.global(ch, &unused[0], &unused[1], &unused[2], &unused[3]);
      } else {
        fin.channel(ch, 0.0, 0.0, 0.0, &unused[0], &unused[1], &unused[2], &unused[3]);
      }
    }
    return ok_status();
  }
  FwdRun run(conf, kernels, in, out);
  std::optional<FwdRun> side_run;
  if (side != nullptr) {
    side_run.emplace(*side, *side_kernels, in, out);
    run.set_side(&*side_run);
  }
  run.run();
  return ok_status();
}

}  // namespace

Status run_batch_norm_forward(const FwdConf& conf, const FwdKernels& kernels,
                              const std::vector<const void*>& in, const std::vector<void*>& out) {
  return run_forward(conf, kernels, nullptr, nullptr, in, out);
}

Status run_batch_norm_forward_side(const FwdConf& conf, const FwdKernels& kernels,
                                   const FwdConf& side, const FwdKernels& side_kernels,
                                   const std::vector<const void*>& in,
                                   const std::vector<void*>& out) {
  return run_forward(conf, kernels, &side, &side_kernels, in, out);
}

Status run_batch_norm_forward_siblings(const FwdConf& first, const FwdKernels& first_kernels,
                                       const FwdConf& second, const FwdKernels& second_kernels,
                                       const std::vector<const void*>& in,
                                       const std::vector<void*>& out) {
  // The first writes its dst into the second's (make_fwd_sibling_confs); the
  // second reads it there as its residual, an input past the partition's.
  std::vector<const void*> second_in = in;
  second_in.push_back(out[static_cast<size_t>(second.out_dst)]);
  if (first.empty || second.empty) {  // both are: the same shape
    NG_RETURN_IF_ERROR(run_batch_norm_forward(first, first_kernels, in, out));
    return run_batch_norm_forward(second, second_kernels, second_in, out);
  }
  FwdRun a(first, first_kernels, in, out);
  FwdRun b(second, second_kernels, second_in, out);
  a.set_sibling(&b);
  a.run();
  return ok_status();
}

}  // namespace jit
}  // namespace normgrad
