// DataType: names, sizes and bit-exact conversions between f32, bf16 and f16.
#include <normgrad/graph/data_type.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace normgrad {
namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds to f32 with "round to odd": the result's last bit records whether any
// discarded bit was set. A second rounding to a format with at least two fewer
// significand bits (bf16: 8, f16: 11) then gives the correctly rounded result
// of the original double, avoiding double-rounding errors.
float double_to_f32_round_odd(double v) {
  if (!std::isfinite(v)) return static_cast<float>(v);
  const float truncated = [&] {
    // Round toward zero: take the nearest float, step back toward zero if it overshot.
    float f = static_cast<float>(v);
    if (std::isinf(f)) return std::copysign(std::numeric_limits<float>::max(), f);
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) {
      f = std::nextafter(f, 0.0f);
    }
    return f;
  }();
  if (static_cast<double>(truncated) == v) return truncated;
  uint32_t u = f32_bits(truncated);
  u |= 1u;  // inexact: make the last bit odd
  return bits_f32(u);
}

}  // namespace

namespace {

struct DtypeInfo {
  DataType dt;
  const char* name;
  int64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {DataType::kUndef, "undef", 0},     {DataType::kF32, "f32", 4},
    {DataType::kBF16, "bf16", 2},       {DataType::kF16, "f16", 2},
    {DataType::kS8, "s8", 1},           {DataType::kU8, "u8", 1},
    {DataType::kS32, "s32", 4},         {DataType::kS64, "s64", 8},
    {DataType::kBoolean, "boolean", 1}, {DataType::kF64, "f64", 8},
    {DataType::kF8E5M2, "f8_e5m2", 1},  {DataType::kF8E4M3, "f8_e4m3", 1},
    {DataType::kS4, "s4", 1},           {DataType::kU4, "u4", 1},
};

const DtypeInfo& info(DataType dt) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dt == dt) return d;
  }
  return kDtypes[0];
}

}  // namespace

const char* dtype_name(DataType dt) {
  return info(dt).name;
}

StatusOr<DataType> parse_dtype(const std::string& name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return d.dt;
  }
  std::string names;
  for (const DtypeInfo& d : kDtypes) {
    if (d.dt != DataType::kUndef) names += std::string(names.empty() ? "" : ", ") + d.name;
  }
  return invalid_argument("unknown dtype '" + name + "' (expected one of " + names + ")");
}

int64_t dtype_size(DataType dt) {
  return info(dt).size;
}

bool is_float_compute_dtype(DataType dt) {
  return dt == DataType::kF32 || dt == DataType::kBF16 || dt == DataType::kF16;
}

bool is_loadable_dtype(DataType dt) {
  return is_float_compute_dtype(dt) || dt == DataType::kS8 || dt == DataType::kU8 ||
         dt == DataType::kS32 || dt == DataType::kS64 || dt == DataType::kF64;
}

uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if (std::isnan(f)) {
    // Keep sign and the top payload bits, force the quiet bit so the payload never becomes Inf.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest, ties to even; overflow carries into Inf correctly
  return static_cast<uint16_t>(u >> 16);
}

uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t exp = (u >> 23) & 0xffu;
  uint32_t mant = u & 0x7fffffu;
  if (exp == 0xff) {
    if (mant == 0) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | (mant >> 13));  // quiet NaN, payload kept
  }
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;     // rebiased exponent
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to Inf
  if (e <= 0) {
    // Subnormal or zero in f16: shift the full significand (with the implicit 1).
    if (e < -10) return sign;  // below half the smallest subnormal: rounds to zero
    mant |= 0x800000u;
    const int shift = 14 - e;  // 13 for the normal shift plus 1 - e
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t res = mant >> shift;
    if (rest > half || (rest == half && (res & 1u))) ++res;
    return static_cast<uint16_t>(sign | res);
  }
  uint32_t res = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (res & 1u))) ++res;  // may carry into Inf: correct
  return static_cast<uint16_t>(sign | res);
}

float f16_bits_to_f32(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // Subnormal: value = mant * 2^-24, exact in f32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

namespace {

// Integer stores round half to even (as oneDNN's reorders do under the default
// rounding mode) and saturate; NaN becomes 0.
double saturate(double v, double lo, double hi) {
  if (std::isnan(v)) return 0.0;
  return std::min(hi, std::max(lo, std::nearbyint(v)));
}

}  // namespace

double round_to_dtype(double v, DataType dt) {
  switch (dt) {
    case DataType::kF32:
      return static_cast<double>(static_cast<float>(v));
    case DataType::kBF16:
      return static_cast<double>(bf16_bits_to_f32(f32_to_bf16_bits(double_to_f32_round_odd(v))));
    case DataType::kF16:
      return static_cast<double>(f16_bits_to_f32(f32_to_f16_bits(double_to_f32_round_odd(v))));
    case DataType::kS8:
      return saturate(v, -128.0, 127.0);
    case DataType::kU8:
      return saturate(v, 0.0, 255.0);
    case DataType::kS32:
      return saturate(v, -2147483648.0, 2147483647.0);
    default:
      return v;
  }
}

double load_any_as_double(const void* base, int64_t index, DataType dt) {
  switch (dt) {
    case DataType::kF32:
      return static_cast<const float*>(base)[index];
    case DataType::kBF16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[index]);
    case DataType::kF16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(base)[index]);
    case DataType::kS8:
      return static_cast<const int8_t*>(base)[index];
    case DataType::kU8:
      return static_cast<const uint8_t*>(base)[index];
    case DataType::kS32:
      return static_cast<const int32_t*>(base)[index];
    case DataType::kS64:
      return static_cast<double>(static_cast<const int64_t*>(base)[index]);
    case DataType::kF64:
      return static_cast<const double*>(base)[index];
    default:
      break;
  }
  assert(false && "load_as_double on an undef dtype");
  return 0.0;
}

void store_any_from_double(void* base, int64_t index, DataType dt, double v) {
  switch (dt) {
    case DataType::kF32:
      static_cast<float*>(base)[index] = static_cast<float>(v);
      return;
    case DataType::kBF16:
      static_cast<uint16_t*>(base)[index] = f32_to_bf16_bits(double_to_f32_round_odd(v));
      return;
    case DataType::kF16:
      static_cast<uint16_t*>(base)[index] = f32_to_f16_bits(double_to_f32_round_odd(v));
      return;
    case DataType::kS8:
      static_cast<int8_t*>(base)[index] = static_cast<int8_t>(saturate(v, -128.0, 127.0));
      return;
    case DataType::kU8:
      static_cast<uint8_t*>(base)[index] = static_cast<uint8_t>(saturate(v, 0.0, 255.0));
      return;
    case DataType::kS32:
      static_cast<int32_t*>(base)[index] =
          static_cast<int32_t>(saturate(v, -2147483648.0, 2147483647.0));
      return;
    case DataType::kS64:
      // 2^63 is the first double past INT64_MAX: clamp strictly below it.
      static_cast<int64_t*>(base)[index] =
          v >= 9223372036854775807.0
              ? INT64_MAX
              : static_cast<int64_t>(saturate(v, -9223372036854775808.0, 9223372036854775807.0));
      return;
    case DataType::kF64:
      static_cast<double*>(base)[index] = v;
      return;
    default:
      break;
  }
  assert(false && "store_from_double on an undef dtype");
}

}  // namespace normgrad
