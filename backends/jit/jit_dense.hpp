// The JIT backward's dense driver, shared by its walk files (private to the
// JIT backend).
//
// DenseRun holds what every walk of one backward call shares (jit_dense.cpp
// has the whole design): the rows walks and run() are in jit_dense.cpp, the
// pixels walks in jit_dense_pixels.cpp.
#pragma once

#include <cassert>
#include <cstdint>
#include <vector>

#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_parallel.hpp>
#include <normgrad/backends/jit/jit_staging.hpp>

namespace normgrad {
namespace jit {

// A channel's statistics in f64: the mean, the inverse std and gamma.
struct Channel {
  double mean = 0.0, s = 0.0, gamma = 1.0;
};

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
        pairs_(pixel_pairs(conf)),
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
  // Channels per task of the pixels walk's merge and coefficients.
  static constexpr int64_t kMergeChannels = 128;
  int64_t merge_blocks() const { return (nc_ + kMergeChannels - 1) / kMergeChannels; }
  // Channel c's place in the pixels walk's per-channel rows (pair order
  // under pixel_pairs).
  int64_t at(int64_t c) const { return pairs_ ? pair_position(c) : c; }
  // The pixels walks' coefficient rows a, b, c and the means, cp_ apart.
  LineVector<float>& coef_with_means() {
    LineVector<float>& coef = scratch_.coef;
    coef.assign(static_cast<size_t>(4 * cp_), 0.f);
    for (int64_t c = 0; c < nc_; ++c) coef[3 * cp_ + c] = kernel_float(scratch_.ch[c].mean);
    if (pairs_) pair_order_row(coef.data() + 3 * cp_, 0, nc_);
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
  const bool pairs_;        // pixel_pairs: the per-channel rows in pair order
  double m_ = 0.0;          // elements per channel the sums cover
  const char* x_;
  const char* x2_;
  const char* dy_;
  const char* dy2_;
  const char* dy3_;  // Fuse::kAddReluBackward's second gradient, or null
  char* dx_;
  char* dy_out_;  // the fused diff_dst's side output (BnConf::dy_side_out), or null
};

}  // namespace jit
}  // namespace normgrad
