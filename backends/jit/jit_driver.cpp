// JIT driver: the two walks on oneTBB with a thread-independent reduction.
//
// Reductions are partitioned by the data alone: per channel (rows walk) or per
// fixed chunk of pixels (pixels walk), each partial computed by one task in a
// fixed order, and partials combined in f64 in index order. Any thread count
// therefore gives the same bits. In the rows walk a channel's reduction and its
// diff_src pass run back to back in one task, so its src and diff_dst are read
// from cache the second time when the channel fits (1 to 4 channels of a
// 112x112 batch-32 layer fit the L3).
#include <cmath>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "backends/jit/jit_driver.hpp"

namespace normgrad {
namespace jit {
namespace {

// Runs body(i) for i in [0, n): serially for small problems, else on oneTBB.
template <typename Body>
void for_range(bool serial, int64_t n, const Body& body) {
  if (serial || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i != r.end(); ++i) body(i);
  });
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

Status run_batch_norm_backward(const BnConf& conf, const KernelSet& kernels,
                               const std::vector<const void*>& in, const std::vector<void*>& out) {
  const BatchNormDesc& d = conf.d;
  const int64_t nc = d.channels, cp = padded_channels(nc);
  const int64_t es = dtype_size(d.data_dt);
  const DataType sdt = d.stats_dt;
  // Statistics in f64 (bf16 statistics and the inverse-std convention handled here).
  std::vector<Channel> ch(static_cast<size_t>(nc));
  for (int64_t c = 0; c < nc; ++c) {
    ch[c].mean = load_as_double(in[2], c, sdt);
    const double v = load_as_double(in[3], c, sdt);
    ch[c].s = d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + static_cast<double>(d.epsilon));
    ch[c].gamma = d.use_gamma ? load_as_double(in[4], c, sdt) : 1.0;
  }
  std::vector<double> diff_gamma(static_cast<size_t>(nc)), diff_beta(static_cast<size_t>(nc));
  const char* x = static_cast<const char*>(in[0]);
  const char* dy = static_cast<const char*>(in[1]);
  char* dx = static_cast<char*>(out[0]);

  if (conf.walk == Walk::kRows) {
    for_range(conf.single_thread, nc, [&](int64_t c) {
      const int64_t base = c * conf.channel_stride * es;
      float coef[4] = {0.f, 0.f, 0.f, static_cast<float>(ch[c].mean)};
      double sums[2] = {0.0, 0.0};
      if (conf.needs_reduction) {
        KernelArgs r{x + base, dy + base, nullptr, coef, sums, conf.rows};
        kernels.reduce(r);
      }
      coefficients(conf, ch[c], sums[0], sums[1], &coef[0], &coef[1], &coef[2], &diff_gamma[c],
                   &diff_beta[c]);
      KernelArgs a{x + base, dy + base, dx + base, coef, nullptr, conf.rows};
      kernels.apply(a);
    });
  } else {
    std::vector<float> coef(static_cast<size_t>(4 * cp), 0.f);
    for (int64_t c = 0; c < nc; ++c) coef[3 * cp + c] = static_cast<float>(ch[c].mean);
    const int64_t chunk = conf.chunk_rows;
    const int64_t nchunks = (conf.rows + chunk - 1) / chunk;
    const int64_t row_bytes = conf.row_stride * es;
    if (conf.needs_reduction) {
      std::vector<float> partial(static_cast<size_t>(nchunks * 2 * cp), 0.f);
      for_range(conf.single_thread, nchunks, [&](int64_t k) {
        const int64_t r0 = k * chunk;
        KernelArgs r{
            x + r0 * row_bytes,   dy + r0 * row_bytes,         nullptr,
            coef.data() + 3 * cp, partial.data() + k * 2 * cp, std::min(chunk, conf.rows - r0)};
        kernels.reduce(r);
      });
      for (int64_t c = 0; c < nc; ++c) {
        double s0 = 0.0, s1 = 0.0;
        for (int64_t k = 0; k < nchunks; ++k) {
          s0 += partial[k * 2 * cp + c];
          s1 += partial[k * 2 * cp + cp + c];
        }
        coefficients(conf, ch[c], s0, s1, &coef[c], &coef[cp + c], &coef[2 * cp + c],
                     &diff_gamma[c], &diff_beta[c]);
      }
    } else {
      for (int64_t c = 0; c < nc; ++c) {
        coefficients(conf, ch[c], 0.0, 0.0, &coef[c], &coef[cp + c], &coef[2 * cp + c],
                     &diff_gamma[c], &diff_beta[c]);
      }
    }
    for_range(conf.single_thread, nchunks, [&](int64_t k) {
      const int64_t r0 = k * chunk;
      KernelArgs a{x + r0 * row_bytes,
                   dy + r0 * row_bytes,
                   dx + r0 * row_bytes,
                   coef.data(),
                   nullptr,
                   std::min(chunk, conf.rows - r0)};
      kernels.apply(a);
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

}  // namespace jit
}  // namespace normgrad
