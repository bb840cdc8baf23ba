// The portable C++ path of the backward's and the forward's kernels: for CPUs
// without AVX2 and for NORMGRAD_JIT=0. Same contracts and the same arithmetic
// as the generated code.
#include <algorithm>
#include <cmath>
#include <vector>

#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>

namespace normgrad {
namespace jit {
namespace {

class PortableKernels final : public KernelSet {
 public:
  explicit PortableKernels(const BnConf& c) : c_(c), cp_(padded_channels(c.d.channels)) {}

  // src (port 0) or diff_dst (port 1) at element e, with a fused producer
  // applied; with a side output, the reduce stores diff_dst to a.dy_out and
  // the apply reads it back through a.dy as it is.
  float value(const KernelArgs& a, int port, int64_t e) const {
    if (port == 1 && c_.dy_side_out) {
      if (a.dx != nullptr) return load_element(a.dy, e, c_.d.data_dt);
      const float v = fused_value(a, port, e);
      store_element(a.dy_out, e, c_.d.data_dt, v);  // exact: v is a value of the dtype
      return v;
    }
    return fused_value(a, port, e);
  }

  float fused_value(const KernelArgs& a, int port, int64_t e) const {
    const DataType dt = c_.d.data_dt;
    const Fuse f = port == 0 ? c_.x_fuse : c_.dy_fuse;
    const void* first = port == 0 ? a.x : a.dy;
    const void* second = port == 0 ? a.x2 : a.dy2;
    // An Add's sum rounded to the data dtype, as the unfused graph stores it.
    const auto sum = [&](const void* p, const void* q) {
      const float s = load_element(p, e, dt) + load_element(q, e, dt);
      if (dt == DataType::kBF16) return bf16_bits_to_f32(f32_to_bf16_bits(s));
      if (dt == DataType::kF16) return f16_bits_to_f32(f32_to_f16_bits(s));
      return s;
    };
    if (f == Fuse::kAdd) return sum(first, second);
    if (f == Fuse::kReluBackward)
      return load_element(first, e, dt) > 0.f ? load_element(second, e, dt) : 0.f;
    if (f == Fuse::kAddReluBackward)
      return load_element(first, e, dt) > 0.f ? sum(second, a.dy3) : 0.f;
    if (f == Fuse::kLeakyInverse || f == Fuse::kLeakyInverseSub) {
      const float v = load_element(first, e, dt);
      const float y = v < 0.f ? v * (1.f / c_.alpha) : v;
      return f == Fuse::kLeakyInverse ? y : y - load_element(second, e, dt);
    }
    if (f == Fuse::kLeakyBackwardAtSrc) {  // port 0 (kLeakyInverse) reads dst through a.x
      const float g = load_element(first, e, dt);
      return load_element(a.x, e, dt) < 0.f ? g * c_.alpha : g;
    }
    if (f == Fuse::kLeakyBackward) {
      const float g = load_element(second, e, dt);
      return load_element(first, e, dt) < 0.f ? g * c_.alpha : g;
    }
    return load_element(first, e, dt);
  }

  void reduce(const KernelArgs& a) const override {
    if (c_.walk.kind == Walk::kRows) {
      for (int64_t g = 0; g < a.channels; ++g) {
        const float mean = a.coef[4 * g + 3];  // coef = {a, b, c, mean} per channel
        double* out = static_cast<double*>(a.acc) + 2 * g;
        const int64_t base = g * c_.walk.channel_stride;
        for (int64_t r = 0; r < a.rows; ++r) {
          // Eight partial sums per row, as a vector unit would keep them.
          float s0[8] = {}, s1[8] = {};
          for (int64_t i = 0; i < c_.walk.cols; ++i) {
            const float dy = value(a, 1, base + r * c_.walk.row_stride + i);
            const float xm = value(a, 0, base + r * c_.walk.row_stride + i) - mean;
            s0[i % 8] += dy;
            s1[i % 8] += dy * xm;
          }
          float t0 = 0.f, t1 = 0.f;
          for (int k = 0; k < 8; ++k) t0 += s0[k], t1 += s1[k];
          out[0] += t0;
          out[1] += t1;
        }
      }
      return;
    }
    float* acc = static_cast<float*>(a.acc);
    for (int64_t r = 0; r < a.rows; ++r) {
      for (int64_t ch = 0; ch < c_.walk.cols; ++ch) {
        const float dy = value(a, 1, r * c_.walk.row_stride + ch);
        acc[ch] += dy;
        acc[cp_ + ch] += dy * (value(a, 0, r * c_.walk.row_stride + ch) - a.coef[ch]);
      }
    }
  }

  void apply(const KernelArgs& a) const override {
    const DataType dt = c_.d.data_dt;
    if (c_.walk.kind == Walk::kRows) {
      for (int64_t g = 0; g < a.channels; ++g) {
        const float* k = a.coef + 4 * g;  // {a, b, c, mean}
        for (int64_t r = 0; r < a.rows; ++r) {
          for (int64_t i = 0; i < c_.walk.cols; ++i) {
            const int64_t e = g * c_.walk.channel_stride + r * c_.walk.row_stride + i;
            store_element(a.dx, g * c_.walk.dx_channel_stride + r * c_.walk.dx_row_stride + i, dt,
                          k[0] * value(a, 1, e) + (k[1] * (value(a, 0, e) - k[3]) + k[2]));
          }
        }
      }
      return;
    }
    for (int64_t r = 0; r < a.rows; ++r) {
      for (int64_t i = 0; i < c_.walk.cols; ++i) {
        const int64_t e = r * c_.walk.row_stride + i;
        store_element(
            a.dx, r * c_.walk.dx_row_stride + i, dt,
            a.coef[i] * value(a, 1, e) +
                (a.coef[cp_ + i] * (value(a, 0, e) - a.coef[3 * cp_ + i]) + a.coef[2 * cp_ + i]));
      }
    }
  }

 private:
  BnConf c_;
  int64_t cp_;
};

// Scalar loops with the kernels' contracts (FwdArgs in jit_forward.hpp).
class PortableFwd final : public FwdKernels {
 public:
  explicit PortableFwd(const FwdConf& c) : c_(c) {}

  void stats(const FwdArgs& a) const override {
    if (c_.ncx_rows) {
      // 64 chains, as the generated code keeps (4 vectors of 16): one chain's
      // rounding grows with its length.
      const float k = a.coef[0];
      float s1[64] = {}, s2[64] = {};
      const int64_t stride = c_.c * c_.spatial;
      for (int64_t r = 0; r < a.rows; ++r) {
        for (int64_t i = 0; i < a.len; ++i) {
          const float t = load_element(a.x, r * stride + i, c_.dt) - k;
          s1[i % 64] += t;
          s2[i % 64] += t * t;
        }
      }
      for (int w = 32; w >= 1; w /= 2) {
        for (int i = 0; i < w; ++i) {
          s1[i] += s1[i + w];
          s2[i] += s2[i + w];
        }
      }
      a.s1[0] = s1[0];
      a.s2[0] = s2[0];
      return;
    }
    for (int64_t ch = 0; ch < c_.c; ++ch) a.s1[ch] = a.s2[ch] = 0.f;
    for (int64_t p = 0; p < a.len; ++p) {
      for (int64_t ch = 0; ch < c_.c; ++ch) {
        const float t = load_element(a.x, p * c_.c + ch, c_.dt) - a.coef[ch];
        a.s1[ch] += t;
        a.s2[ch] += t * t;
      }
    }
  }

  void apply(const FwdArgs& a) const override {
    const int64_t cp = padded_channels(c_.c);
    auto one = [&](int64_t i, float hi, float scale, float shift) {  // Finish folds lo into shift
      float v = std::fma(load_element(a.x, i, c_.dt) - hi, scale, shift);
      if (c_.residual) {
        // The Add's output is rounded to the data type before the ReLU reads it,
        // as the unfused graph does (the generated code matches).
        v = load_element(a.residual, i, c_.dt) + round_to_dt(v);
      }
      if (c_.relu && c_.leaky) {
        v = round_to_dt(v);  // the unfused LeakyReLU reads dst in its dtype
        if (v < 0.f) v *= c_.alpha;
      } else if (c_.relu) {
        v = std::max(round_to_dt(v), 0.f);
      }
      store_element(a.y, i, c_.dt, v);
    };
    if (c_.ncx_rows) {
      for (int64_t r = 0; r < a.rows; ++r) {
        for (int64_t i = 0; i < a.len; ++i)
          one(r * c_.c * c_.spatial + i, a.coef[0], a.coef[2], a.coef[3]);
      }
      return;
    }
    for (int64_t p = 0; p < a.len; ++p) {
      for (int64_t ch = 0; ch < c_.c; ++ch)
        one(p * c_.c + ch, a.coef[ch], a.coef[2 * cp + ch], a.coef[3 * cp + ch]);
    }
  }

 private:
  float round_to_dt(float v) const {
    if (c_.dt == DataType::kBF16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
    if (c_.dt == DataType::kF16) return f16_bits_to_f32(f32_to_f16_bits(v));
    return v;
  }
  FwdConf c_;
};

}  // namespace

std::shared_ptr<const KernelSet> portable_kernels(const BnConf& conf) {
  return std::make_shared<PortableKernels>(conf);
}

std::shared_ptr<const FwdKernels> portable_fwd_kernels(const FwdConf& conf) {
  return std::make_shared<PortableFwd>(conf);
}

}  // namespace jit
}  // namespace normgrad
