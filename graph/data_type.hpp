// DataType: the element types normgrad computes with, and exact conversions.
//
// f32, bf16 and f16 are what the batch-norm family computes with; s8 and u8
// are quantized data (Quantize/Dequantize). Every other dtype oneDNN's JSON can
// carry (s32, s64, boolean, f64, f8, s4, u4) is known to the IR so that graphs
// holding them load and partition; the op schemas say which dtypes each op
// accepts. Conversions to the narrow floats round to nearest even and keep NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include <normgrad/graph/status.hpp>

namespace normgrad {

enum class DataType : uint8_t {
  kUndef = 0,
  kF32,
  kBF16,
  kF16,
  kS8,
  kU8,
  kS32,
  kS64,
  kBoolean,
  kF64,
  kF8E5M2,
  kF8E4M3,
  kS4,
  kU4,
};

// oneDNN's spelling: "f32", "bf16", "f16", "s8", ..., "undef".
const char* dtype_name(DataType dt);
// Parses a oneDNN dtype name; anything else is "unknown dtype".
StatusOr<DataType> parse_dtype(const std::string& name);
// Bytes per element; 0 for kUndef; 1 for the 4-bit types (a byte each is an
// upper bound, which is all sizing needs: no kernel of ours reads them).
int64_t dtype_size(DataType dt);
// f32, bf16, f16: the types the batch-norm family and the elementwise ops compute in.
bool is_float_compute_dtype(DataType dt);
// Types load_as_double / store_from_double handle: the compute floats, s8, u8,
// s32, s64 and f64 (the last two for the synchronized backward's counts and sums).
bool is_loadable_dtype(DataType dt);

// Bit-exact conversions.
uint16_t f32_to_bf16_bits(float f);
// Inline: the drivers widen bf16 element by element (a call each cost as much
// as the kernels on a forward's per-channel set-up).
inline float bf16_bits_to_f32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t bits);

// Rounds a double to the nearest value representable in `dt` (ties to even),
// in one rounding step: used by the reference backend so that its outputs are
// the correctly rounded value of the float64 result.
double round_to_dtype(double v, DataType dt);

// Element access on raw buffers, for the backends and the tools. f32, the
// common case, is inline: per-channel loops over thousands of channels
// measured the out-of-line call (git log -S load_any_as_double has the runs).
double load_any_as_double(const void* base, int64_t index, DataType dt);
void store_any_from_double(void* base, int64_t index, DataType dt, double v);
inline double load_as_double(const void* base, int64_t index, DataType dt) {
  if (dt == DataType::kF32) return static_cast<const float*>(base)[index];
  return load_any_as_double(base, index, dt);
}
inline void store_from_double(void* base, int64_t index, DataType dt, double v) {
  if (dt == DataType::kF32) {
    static_cast<float*>(base)[index] = static_cast<float>(v);
  } else {
    store_any_from_double(base, index, dt, v);
  }
}

}  // namespace normgrad
