// DataType: the element types normgrad computes with, and exact conversions.
//
// f32, bf16 and f16 are supported. Other names that oneDNN's JSON can carry
// (s8, u8, s32, boolean, f64) are recognised only to be refused with a clear
// message. Conversions to the narrow types round to nearest even and keep NaN.
#pragma once

#include <cstdint>
#include <string>

#include "graph/status.hpp"

namespace normgrad {

enum class DataType : uint8_t { kUndef = 0, kF32, kBF16, kF16 };

// "f32", "bf16", "f16", "undef".
const char* dtype_name(DataType dt);
// Parses a oneDNN dtype name; names oneDNN knows but normgrad does not compute
// with get an "is not supported" message, anything else "unknown dtype".
StatusOr<DataType> parse_dtype(const std::string& name);
// Bytes per element; 0 for kUndef.
int64_t dtype_size(DataType dt);

// Bit-exact conversions.
uint16_t f32_to_bf16_bits(float f);
float bf16_bits_to_f32(uint16_t bits);
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t bits);

// Rounds a double to the nearest value representable in `dt` (ties to even),
// in one rounding step: used by the reference backend so that its outputs are
// the correctly rounded value of the float64 result.
double round_to_dtype(double v, DataType dt);

// Element access on raw buffers, for the reference backend and the tools.
double load_as_double(const void* base, int64_t index, DataType dt);
void store_from_double(void* base, int64_t index, DataType dt, double v);

}  // namespace normgrad
