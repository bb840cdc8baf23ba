// DataType conversions: rounding to nearest even, NaN, Inf, subnormals, single rounding.
#include <normgrad/graph/data_type.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

namespace normgrad {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DataType, NamesParseAndRefuse) {
  EXPECT_EQ(*parse_dtype("bf16"), DataType::kBF16);
  EXPECT_EQ(dtype_size(DataType::kF16), 2);
  // Every dtype oneDNN writes is known (the op schemas decide what each op takes).
  for (const char* name :
       {"s8", "u8", "s32", "s64", "boolean", "f64", "f8_e5m2", "f8_e4m3", "s4", "u4"}) {
    auto dt = parse_dtype(name);
    ASSERT_TRUE(dt.ok()) << name;
    EXPECT_STREQ(dtype_name(*dt), name);
  }
  EXPECT_EQ(dtype_size(*parse_dtype("s32")), 4);
  EXPECT_NE(parse_dtype("f33").status().message().find("unknown dtype 'f33'"), std::string::npos);
}

TEST(DataType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to Inf
  EXPECT_EQ(bf16_bits_to_f32(0x3fc0), 1.5f);
}

TEST(DataType, NanStaysNan) {
  const float nan_payload = from_bits(0x7f800001);  // signalling NaN whose payload is in low bits
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(nan_payload))));
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(nan_payload))));
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(DataType, F16RoundTripAndEdges) {
  EXPECT_EQ(f32_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);  // halfway to 2^16 rounds to Inf
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000);  // exactly half: ties to even (0)
  EXPECT_EQ(f32_to_f16_bits(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1p-11f), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Every f16 value survives f16 -> f32 -> f16.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16_bits(f), b) << b;
  }
}

TEST(DataType, RoundToDtypeRoundsOnce) {
  // 1 + 2^-8 + 2^-40 is just above the bf16 halfway point. Rounding first to
  // f32 would lose 2^-40 and then tie to even (1.0); one rounding gives 1.0078125.
  const double v = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(round_to_dtype(v, DataType::kBF16), 1.0078125);
  const double w = 1.0 + 0x1p-11 + 0x1p-40;  // same for f16
  EXPECT_EQ(round_to_dtype(w, DataType::kF16), 1.0 + 0x1p-10);
  EXPECT_EQ(round_to_dtype(0.1, DataType::kF32), static_cast<double>(0.1f));
}

}  // namespace
}  // namespace normgrad
