// Error flow of ReLU, ReLUBackward, Add, TypeCast, StaticTranspose and End; Add on s32.
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/op_checks.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::lt;

Op binary(OpKind kind, Dims a, Dims b, DataType dt = DataType::kF32) {
  Op op(0, kind, "e");
  op.add_input(lt(0, dt, a)).add_input(lt(1, dt, b)).add_output(lt(2, dt, a));
  return op;
}

Status add(Op op) {
  Graph g;
  return g.add_op(std::move(op));
}

TEST(ElementwiseSchemas, AddBroadcastsAsNumpy) {
  EXPECT_TRUE(add(binary(OpKind::kAdd, {2, 3}, {2, 3})).ok());
  Op b = binary(OpKind::kAdd, {2, 3}, {1, 3});
  EXPECT_TRUE(add(b).ok());
  Op lower_rank = binary(OpKind::kAdd, {4, 2, 3}, {3});
  ASSERT_TRUE(infer_op_shapes(lower_rank).ok());
  EXPECT_EQ(lower_rank.outputs()[0].dims, (Dims{4, 2, 3}));
  EXPECT_STATUS_HAS(add(binary(OpKind::kAdd, {2, 3}, {2, 4})),
                    "input 1 'src_1': shape 2x4 does not broadcast against src_0's 2x3");
  Op none = binary(OpKind::kAdd, {2, 3}, {1, 3});
  none.set_attr("auto_broadcast", std::string("none"));
  EXPECT_STATUS_HAS(add(none), "differs from src_0's 2x3 and auto_broadcast is 'none'");
  Op op = binary(OpKind::kAdd, {2, 3}, {2, 3});
  op.set_attr("auto_broadcast", std::string("pdpd"));
  EXPECT_STATUS_HAS(add(op), "'auto_broadcast' is 'pdpd', expected one of none, numpy");
}

TEST(ElementwiseSchemas, AddTakesS32AndRunsIt) {
  Op op = binary(OpKind::kAdd, {2, 3}, {1, 3}, DataType::kS32);
  Graph g;
  ASSERT_TRUE(g.add_op(op).ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{"auto"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  const int32_t a[6] = {1, -2, 3, 2000000000, 5, 2000000000};
  const int32_t b[3] = {10, 20, 2000000000};
  int32_t y[6] = {};
  ASSERT_TRUE(cg->execute({{0, a}, {1, b}}, {{2, y}}).ok());
  // Closed form, the last lane saturating at INT32_MAX as oneDNN's s32 does.
  const int32_t want[6] = {11, 18, 2000000003, 2000000010, 25, 2147483647};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << i;
  EXPECT_STATUS_HAS(add(binary(OpKind::kAdd, {2, 3}, {2, 3}, DataType::kS8)),
                    "dtype s8 is not supported");
}

TEST(ElementwiseSchemas, QuantizeRules) {
  auto quant = [](std::vector<float> scales, std::vector<int64_t> zps, DataType out) {
    Op op(1, OpKind::kQuantize, "q");
    op.set_attr("scales", std::move(scales)).set_attr("zps", std::move(zps));
    op.add_input(testing_util::lt(0, DataType::kF32, {2, 3}));
    op.add_output(testing_util::lt(1, out, {2, 3}));
    return op;
  };
  EXPECT_TRUE(add(quant({0.5f}, {0}, DataType::kS8)).ok());
  EXPECT_STATUS_HAS(add(quant({0.0f}, {0}, DataType::kS8)), "expected finite non-zero values");
  EXPECT_STATUS_HAS(add(quant({1.f, 2.f}, {0}, DataType::kS8)),
                    "'zps' has 1 entries, 'scales' has 2");
  EXPECT_STATUS_HAS(add(quant({1.f, 2.f}, {0, 0}, DataType::kU8)),
                    "per_tensor takes one scale, got 2");
  EXPECT_STATUS_HAS(add(quant({1.f}, {0}, DataType::kF32)),
                    "the quantized side is f32, expected s8, u8, f8_e5m2 or f8_e4m3");
  EXPECT_STATUS_HAS(add(quant({1.f}, {0}, DataType::kS32)), "dtype s32 is not supported");
}

TEST(ElementwiseSchemas, ReLUBackward) {
  Op op = binary(OpKind::kReLUBackward, {2, 3}, {2, 3});
  op.set_attr("use_dst", false);
  EXPECT_TRUE(add(op).ok());
  op.set_attr("use_dst", int64_t{0});
  EXPECT_STATUS_HAS(add(op), "attribute 'use_dst' has type s64, expected bool");
  Op dt = binary(OpKind::kReLUBackward, {2, 3}, {2, 3});
  dt.mutable_inputs()[1].dtype = DataType::kBF16;
  EXPECT_STATUS_HAS(add(dt), "input 1 'diff_dst': dtype bf16 differs from input 0's f32");
  Op three(0, OpKind::kReLUBackward, "");
  three.add_input(lt(0, DataType::kF32, {2}));
  three.add_output(lt(1, DataType::kF32, {2}));
  EXPECT_STATUS_HAS(add(three), "has 1 inputs, expected 2");
}

TEST(ElementwiseSchemas, StaticTranspose) {
  Op op(0, OpKind::kStaticTranspose, "t");
  op.add_input(lt(0, DataType::kF32, {2, 3, 4})).add_output(lt(1, DataType::kF32, {4, 2, 3}));
  EXPECT_STATUS_HAS(add(op), "required attribute 'order' is missing");
  op.set_attr("order", std::vector<int64_t>{2, 0, 1});
  EXPECT_TRUE(add(op).ok());
  op.set_attr("order", std::vector<int64_t>{-1, 0, 1});  // negative axes count from the end
  EXPECT_TRUE(add(op).ok());
  op.set_attr("order", std::vector<int64_t>{2, 2, 1});
  EXPECT_STATUS_HAS(add(op), "'order' is not a permutation of 0..2");
  op.set_attr("order", std::vector<int64_t>{1, 0});
  EXPECT_STATUS_HAS(add(op), "'order' has 2 entries, expected the rank 3");
  op.set_attr("order", std::vector<int64_t>{0, 1, 2});
  EXPECT_STATUS_HAS(add(op), "shape 4x2x3 does not match the inferred 2x3x4");
}

TEST(ElementwiseSchemas, TypeCastAndEnd) {
  Op cast(0, OpKind::kTypeCast, "c");
  cast.add_input(lt(0, DataType::kBF16, {5})).add_output(lt(1, DataType::kF32, {6}));
  EXPECT_STATUS_HAS(add(cast), "shape 6 does not match the inferred 5");
  Op end(1, OpKind::kEnd, "end");
  end.add_input(lt(0, DataType::kF32, {5}));
  EXPECT_TRUE(add(end).ok());
  end.add_output(lt(3, DataType::kF32, {5}));
  EXPECT_STATUS_HAS(add(end), "has 1 outputs, expected 0");
}

TEST(ElementwiseSchemas, UndefDtypeAndNegativeIds) {
  Op op = binary(OpKind::kReLU, {2}, {2});
  op.mutable_inputs().pop_back();
  op.mutable_inputs()[0].dtype = DataType::kUndef;
  EXPECT_STATUS_HAS(add(op), "input 0 'src': dtype is undef");
  Op neg = binary(OpKind::kAdd, {2}, {2});
  neg.mutable_inputs()[1].id = -4;
  EXPECT_STATUS_HAS(add(neg), "tensor id -4 is negative");
}

}  // namespace
}  // namespace normgrad
