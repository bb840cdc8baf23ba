// LogicalTensor: overflow-checked sizes, strided buffer extents, validation.
#include <normgrad/graph/logical_tensor.hpp>

#include "tests/test_util.hpp"

namespace normgrad {
namespace {

TEST(LogicalTensor, ProductsAreOverflowChecked) {
  const int64_t big = int64_t{1} << 31;
  LogicalTensor t(1, DataType::kF32, {big, big, big, 4});
  EXPECT_EQ(t.element_count().status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(t.validate("t").ok());
  LogicalTensor u(2, DataType::kF32, {int64_t{1} << 61});  // elements fit, bytes do not
  EXPECT_TRUE(u.element_count().ok());
  EXPECT_EQ(u.buffer_bytes().status().code(), StatusCode::kOutOfRange);
}

TEST(LogicalTensor, StridedExtent) {
  LogicalTensor t(1, DataType::kBF16, {2, 3, 4});
  EXPECT_EQ(*t.buffer_bytes(), 48);
  t.strides = {24, 1, 3};  // channels-last view of 2x3x4 with padding in dim 0
  EXPECT_EQ(*t.buffer_elements(), 24 + 2 + 9 + 1);
  LogicalTensor empty(2, DataType::kF32, {0, 5});
  EXPECT_EQ(*empty.buffer_bytes(), 0);
}

TEST(LogicalTensor, ValidateRejectsBadDimsAndStrides) {
  LogicalTensor t(1, DataType::kF32, {2, -3});
  EXPECT_STATUS_HAS(t.validate("x"), "dims must be >= 0");
  LogicalTensor s(1, DataType::kF32, {2, 3});
  s.strides = {1};
  EXPECT_STATUS_HAS(s.validate("x"), "1 strides for rank 2");
  s.strides = {3, -1};
  EXPECT_STATUS_HAS(s.validate("x"), "strides must be >= 0");
  LogicalTensor unknown(1, DataType::kF32, {kUnknownDim, 3});
  EXPECT_TRUE(unknown.validate("x").ok());
  EXPECT_EQ(dims_to_string(unknown.dims), "?x3");
}

}  // namespace
}  // namespace normgrad
