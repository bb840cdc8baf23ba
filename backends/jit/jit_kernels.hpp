// The four inner kernels of the JIT batch-norm backward and their arguments.
//
// Both the Xbyak generator and the portable C++ path implement these, with the
// same contracts, so the driver does not care which one runs:
//   rows_reduce   out[2g] += sum dy, out[2g+1] += sum dy (x - mean) over `rows` rows
//                 of `cols` elements (row stride from the conf) for each of the
//                 `channels` channels g of the call (channel_stride apart); sums
//                 in f32 per row (the generated code: per call for short rows),
//                 added into the f64 totals
//   rows_apply    dx = a dy + b (x - mean) + c for each channel g of the call
//                 (coef[4g..4g+3] = {a, b, c, mean}); grouped calls get in acc a
//                 64-byte-aligned scratch block of bounce_block_bytes(conf)
//   pixels_reduce acc[0:C] += dy, acc[Cp:Cp+C] += dy (x - mean[c]) per channel, f32,
//                 over `rows` pixels (Cp = C rounded up to 16; arrays padded)
//   pixels_apply  dx = a[c] dy + b[c] (x - mean[c]) + c[c]; coef = a|b|c|mean, each Cp long
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/graph/data_type.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace jit {

struct KernelArgs {
  const void* x;
  const void* dy;
  void* dx;  // apply only
  // rows: {a, b, c, mean} per channel; pixels: mean (reduce) or a|b|c|mean (apply)
  const float* coef;
  // rows_reduce: double[2 * channels]; pixels_reduce: float[2 * Cp]; grouped
  // rows_apply: the bounce block (see above)
  void* acc;
  int64_t rows;
  const void* x2;   // fused src: the producer's second input (x is its first)
  const void* dy2;  // fused diff_dst: likewise
  // Rows walk: channels in this call, 1..conf.channel_group (1 when the conf
  // has no channel group).
  int64_t channels = 1;
  // rows_apply with conf.prefetch.next_channel: nonzero when channel
  // c + 1 (channel_stride on) exists, whose rows the call then prefetches.
  int64_t prefetch_next = 0;
  // Reduce with conf.dy_side_out: where the fused diff_dst is stored (same
  // layout as dy); the apply then reads it through dy, with no producer.
  void* dy_out = nullptr;
  const void* dy3 = nullptr;  // fused diff_dst: a third operand (Fuse::kAddReluBackward)
};

// One element of 16- or 32-bit float data as f32, and back with rounding to
// nearest even: the portable paths' loads and stores.
inline float load_element(const void* p, int64_t i, DataType dt) {
  switch (dt) {
    case DataType::kBF16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::kF16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

inline void store_element(void* p, int64_t i, DataType dt, float v) {
  switch (dt) {
    case DataType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
      return;
    case DataType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
      return;
    default:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

// A per-channel value the driver hands to a generated kernel (a coefficient,
// a mean), as f32 with any NaN made the one quiet NaN, 0x7fc00000. The
// integer bf16 rounding (x + 0x7fff + lsb, then the top 16 bits) keeps a NaN
// a NaN only when its low 16 bits are zero, and this keeps every NaN a kernel
// meets so: values loaded from bf16 have them zero, an arithmetic result that
// is NaN is the default NaN (0xffc00000) or a NaN operand's bits, and the
// constants are finite. Only an f32 from memory could carry a payload there
// (a NaN gamma read from the user's tensor), and every one passes through here.
inline float kernel_float(double v) {
  return v != v ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(v);
}

// Padded per-channel array length.
inline int64_t padded_channels(int64_t c) {
  return (c + 15) / 16 * 16;
}

// The kernels for one conf (generated code or the portable path); immutable,
// callable from many threads at once.
class KernelSet {
 public:
  virtual ~KernelSet() = default;
  virtual void reduce(const KernelArgs& args) const = 0;
  virtual void apply(const KernelArgs& args) const = 0;
  double generate_ms = 0.0;
};

// Xbyak code for conf.isa (kAvx2 or kAvx512); exceptions become a Status.
StatusOr<std::shared_ptr<const KernelSet>> generate_kernels(const BnConf& conf);
// How many kernel sets have been generated in this process (for tests of the cache).
int64_t generated_kernel_sets();
// The portable C++ path.
std::shared_ptr<const KernelSet> portable_kernels(const BnConf& conf);

}  // namespace jit
}  // namespace normgrad
