// The JIT forward driver's per-channel arithmetic (private to the JIT backend).
//
// What every forward walk shares once a channel's shifted sums are in: the
// batch mean and variance, the coefficients the apply kernels take (hi, lo,
// a, b) and the statistics outputs (Finish); the shifts the statistics are
// taken around; the pairs' coefficient order; and which apply to call. The
// walks themselves are in jit_forward_driver.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/graph/data_type.hpp>

namespace normgrad {
namespace jit {

inline const float* f32_in(const std::vector<const void*>& in, int i) {
  return i < 0 ? nullptr : static_cast<const float*>(in[static_cast<size_t>(i)]);
}
inline float* f32_out(const std::vector<void*>& out, int i) {
  return i < 0 ? nullptr : static_cast<float*>(out[static_cast<size_t>(i)]);
}

// Per-channel results of the statistics and what the apply needs.
struct Finish {
  const FwdConf& c;
  const std::vector<const void*>& in;
  const std::vector<void*>& out;
  double m;  // elements per channel

  // hi/lo/a/b for channel ch from the shift and the f64 shifted sums; writes
  // the statistics outputs.
  void channel(int64_t ch, double shift, double s1, double s2, float* hi, float* lo, float* a,
               float* b) const {
    // An empty batch has zero batch statistics (as ref defines them).
    const double d1 = m > 0 ? s1 / m : 0.0;
    const double bmean = m > 0 ? shift + d1 : 0.0;
    const double bvar = m > 0 ? std::max(s2 / m - d1 * d1, 0.0) : 0.0;
    moments(ch, bmean, bvar, hi, lo, a, b);
  }

  // Apply: the same from the global sum, M2 and count (inputs, f64 and s64);
  // Inference: from the mean and variance (f32 inputs), used as given.
  void global(int64_t ch, float* hi, float* lo, float* a, float* b) const {
    if (c.phase == FwdPhase::kInference) {
      moments(ch, f32_in(in, c.in_mean)[ch], f32_in(in, c.in_var)[ch], hi, lo, a, b);
      return;
    }
    const double total = global_count();
    const double bmean = f64_in(c.in_sum)[ch] / total;
    const double bvar = std::max(f64_in(c.in_m2)[ch] / total, 0.0);
    moments(ch, bmean, bvar, hi, lo, a, b);
  }
  double global_count() const {
    return static_cast<double>(*static_cast<const int64_t*>(in[static_cast<size_t>(c.in_count)]));
  }

  // Reduce: this process's sum, M2 about its own mean (f64) from the shifted
  // sums: sum = m K + S1, M2 = S2 - S1^2 / m, where K is near the mean, so
  // neither cancels.
  void reduce(int64_t ch, double shift, double s1, double s2) const {
    const double sum = m > 0 ? m * shift + s1 : 0.0;
    const double m2 = m > 0 ? std::max(s2 - s1 * s1 / m, 0.0) : 0.0;
    f64_out(c.out_sum)[ch] = sum;
    f64_out(c.out_m2)[ch] = m2;
  }

  const double* f64_in(int i) const {
    return static_cast<const double*>(in[static_cast<size_t>(i)]);
  }
  double* f64_out(int i) const { return static_cast<double*>(out[static_cast<size_t>(i)]); }

  // The batch mean and (biased) variance: the coefficients and the statistics outputs.
  void moments(int64_t ch, double bmean, double bvar, float* hi, float* lo, float* a,
               float* b) const {
    const double inv = 1.0 / std::sqrt(bvar + static_cast<double>(c.epsilon));
    const double gamma = c.affine ? f32_in(in, c.in_gamma)[ch] : 1.0;
    const double beta = c.affine ? f32_in(in, c.in_beta)[ch] : 0.0;
    // The mean as hi (its f32 rounding) plus a low part, which is folded into
    // b: dst = (x - hi) a + (beta - lo gamma inv). x - hi is exact near the
    // mean (data far from zero keeps every bit of its deviation) and the low
    // part costs no vector operation; lo stays 0 for the kernels' layout.
    *hi = kernel_float(bmean);
    const double low = bmean - static_cast<double>(*hi);
    *lo = 0.f;
    *a = kernel_float(gamma * inv);
    *b = kernel_float(beta - low * gamma * inv);
    const double mom = c.momentum;
    if (float* o = f32_out(out, c.out_running_mean))
      o[ch] = static_cast<float>(mom * f32_in(in, c.in_mean)[ch] + (1.0 - mom) * bmean);
    if (float* o = f32_out(out, c.out_running_var))
      o[ch] = static_cast<float>(mom * f32_in(in, c.in_var)[ch] + (1.0 - mom) * bvar);
    if (float* o = f32_out(out, c.out_batch_mean)) o[ch] = static_cast<float>(bmean);
    if (float* o = f32_out(out, c.out_batch_var)) o[ch] = static_cast<float>(bvar);
  }
};

// The shift of each channel: the mean of its first few elements (up to 16),
// close enough to the channel's mean that the shifted sums do not cancel.
inline float ncx_shift(const FwdConf& c, const void* x, int64_t ch) {
  const int64_t k = std::min<int64_t>(c.spatial, 16);
  double s = 0.0;
  for (int64_t i = 0; i < k; ++i) s += load_element(x, ch * c.spatial + i, c.dt);
  return static_cast<float>(s / static_cast<double>(k));
}

// The NXC walk's shifts: each channel's mean over the first pixels (up to
// 8), on vectors of channels padded with zeros. The pixels' rows are read in
// order (channel by channel down the rows cost as much as the kernels on a
// 512-channel 14x14 image), each channel's terms added in pixel order.
inline void pixel_shifts(const FwdConf& c, const void* x, LineVector<float>* shift) {
  shift->assign(static_cast<size_t>(padded_channels(c.c)), 0.f);
  const int64_t k0 = std::min<int64_t>(c.pixels, 8);
  thread_local std::vector<double> sum;
  sum.assign(static_cast<size_t>(c.c), 0.0);
  double* s = sum.data();
  for (int64_t p = 0; p < k0; ++p) {
    // One loop per dtype: a switch per element kept the loop from running as
    // fast as the row-order walk allows (measured level with the old walk).
    const int64_t row = p * c.c;
    if (c.dt == DataType::kBF16) {
      const uint16_t* r = static_cast<const uint16_t*>(x) + row;
      for (int64_t ch = 0; ch < c.c; ++ch) s[ch] += bf16_bits_to_f32(r[ch]);
    } else if (c.dt == DataType::kF32) {
      const float* r = static_cast<const float*>(x) + row;
      for (int64_t ch = 0; ch < c.c; ++ch) s[ch] += r[ch];
    } else {
      for (int64_t ch = 0; ch < c.c; ++ch) s[ch] += load_element(x, row + ch, c.dt);
    }
  }
  for (int64_t ch = 0; ch < c.c; ++ch)
    (*shift)[static_cast<size_t>(ch)] = static_cast<float>(s[ch] / static_cast<double>(k0));
}

// FwdConf::line_walk with pairs: each of the four coefficient rows (cp
// floats apart) laid out per 16 channels as the pairs load them, the even
// channels first, then the odd ones; channels [first, last), whole 16s.
inline void pair_order(int64_t cp, float* coef, int64_t first, int64_t last) {
  for (int64_t row = 0; row < 4; ++row) pair_order_row(coef + row * cp, first, last);
}

// The apply to call: the streaming variant when dst starts on a line (the
// conf made every row or pixel whole lines).
inline void (FwdKernels::*apply_fn(const FwdConf& c, const void* y))(const FwdArgs&) const {
  const bool aligned = reinterpret_cast<uintptr_t>(y) % 64 == 0;
  return c.streaming && aligned ? &FwdKernels::apply_streaming : &FwdKernels::apply;
}

}  // namespace jit
}  // namespace normgrad
