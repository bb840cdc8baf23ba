// .npy reading and writing: round trips per dtype and lying or truncated files.
#include <normgrad/graph/npy.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "tests/test_util.hpp"

namespace normgrad {
namespace {

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/ng_npy_" + name;
}

std::string header(const std::string& dict) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string s("\x93NUMPY\x01\x00", 8);
  s += static_cast<char>(h.size() & 0xff);
  s += static_cast<char>(h.size() >> 8);
  return s + h;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Npy, RoundTripsEveryDtype) {
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kS8, DataType::kU8,
                      DataType::kS32, DataType::kS64, DataType::kF64}) {
    LogicalTensor t(3, dt, {2, 3});
    std::vector<char> buf(static_cast<size_t>(*t.buffer_bytes()));
    for (int i = 0; i < 6; ++i) store_from_double(buf.data(), i, dt, 0.25 * i - 0.5);
    const std::string path = tmp(dtype_name(dt));
    ASSERT_TRUE(write_npy(path, t, buf.data()).ok());
    std::vector<char> back(buf.size());
    ASSERT_TRUE(read_npy_into(path, t, back.data()).ok());
    EXPECT_EQ(buf, back);
  }
}

// The split backward's count (s64) and f64 sums are written as NumPy's own
// '<i8' / '<f8' (they were once labelled '<f4' over 8-byte data, which the
// round trip above catches by the payload size), and '<f4' is refused for them.
TEST(Npy, EightByteDtypesUseTheirOwnDescr) {
  for (DataType dt : {DataType::kS64, DataType::kF64}) {
    const LogicalTensor t(6, dt, {1});
    const int64_t value = 100352;
    const std::string path = tmp(std::string("descr_") + dtype_name(dt));
    ASSERT_TRUE(write_npy(path, t, &value).ok());
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(bytes.find(dt == DataType::kS64 ? "'<i8'" : "'<f8'"), std::string::npos);
  }
  LogicalTensor count(6, DataType::kS64, {1});
  const float f = 1.f;
  write_bytes(tmp("count_f4"), header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }") +
                                   std::string(reinterpret_cast<const char*>(&f), 4));
  EXPECT_STATUS_HAS(read_npy_into(tmp("count_f4"), count, nullptr),
                    "dtype '<f4' cannot hold tensor 6 of dtype s64 (use <i8)");
}

TEST(Npy, Bf16FromRawBitsAndRoundedF32) {
  LogicalTensor t(1, DataType::kBF16, {2});
  const uint16_t raw[2] = {0x3f80, 0xc000};
  write_bytes(tmp("u2"), header("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }") +
                             std::string(reinterpret_cast<const char*>(raw), 4));
  uint16_t got[2];
  ASSERT_TRUE(read_npy_into(tmp("u2"), t, got).ok());
  EXPECT_EQ(got[0], 0x3f80);
  EXPECT_EQ(got[1], 0xc000);
  const float f[2] = {1.0f + 3 * 0x1p-9f, -2.0f};  // first rounds to nearest even
  write_bytes(tmp("f4"), header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }") +
                             std::string(reinterpret_cast<const char*>(f), 8));
  ASSERT_TRUE(read_npy_into(tmp("f4"), t, got).ok());
  EXPECT_EQ(got[0], f32_to_bf16_bits(f[0]));
}

TEST(Npy, LyingFilesAreRejected) {
  LogicalTensor t(1, DataType::kF32, {2, 2});
  const std::string payload(16, '\0');
  write_bytes(tmp("shape"),
              header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }") + payload);
  EXPECT_STATUS_HAS(read_npy_into(tmp("shape"), t, nullptr),
                    "shape 4 does not match tensor 1's 2x2");
  write_bytes(tmp("dtype"), header("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }") +
                                payload.substr(0, 8));
  EXPECT_STATUS_HAS(read_npy_into(tmp("dtype"), t, nullptr),
                    "dtype '<f2' cannot hold tensor 1 of dtype f32");
  write_bytes(tmp("trunc"), header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }") +
                                payload.substr(0, 12));
  EXPECT_STATUS_HAS(read_npy_into(tmp("trunc"), t, nullptr), "payload is 12 bytes");
  std::string lie = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }") + payload;
  lie[8] = '\xff';
  lie[9] = '\x7f';
  write_bytes(tmp("hlen"), lie);
  EXPECT_STATUS_HAS(read_npy_into(tmp("hlen"), t, nullptr), "runs past the end of the file");
  write_bytes(
      tmp("huge"),
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }"));
  EXPECT_FALSE(read_npy_into(tmp("huge"), t, nullptr).ok());
  write_bytes(tmp("magic"), "PK\x03\x04 not numpy");
  EXPECT_STATUS_HAS(read_npy_into(tmp("magic"), t, nullptr), "bad magic");
  EXPECT_STATUS_HAS(read_npy_into(tmp("missing_file"), t, nullptr), "cannot open file");
}

}  // namespace
}  // namespace normgrad
