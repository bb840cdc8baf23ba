// Error flow of FusedBatchNormGrad / V2 / V3: every shape, dtype and attribute
// rule, including the CVE-2021-41223 and CVE-2021-29583 inputs.
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::lt;

// y_backprop 0, x 1, scale 2, reserve_space_1 3, reserve_space_2 4 (V3: reserve_space_3 5).
Op tf_grad(OpKind kind, Dims x, Dims dy, int64_t c, DataType t = DataType::kF32,
           const std::string& fmt = "NHWC") {
  Op op(0, kind, "g");
  op.set_attr("data_format", fmt);
  op.add_input(lt(0, t, dy)).add_input(lt(1, t, x));
  for (int i = 2; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {c}));
  if (kind == OpKind::kFusedBatchNormGradV3) op.add_input(lt(5, DataType::kF32, {0}));
  op.add_output(lt(10, t, x))
      .add_output(lt(11, DataType::kF32, {c}))
      .add_output(lt(12, DataType::kF32, {c}));
  op.add_output(lt(13, DataType::kF32, {0})).add_output(lt(14, DataType::kF32, {0}));
  return op;
}

Status add(Op op) {
  Graph g;
  return g.add_op(std::move(op));
}

TEST(TfBatchNormGradSchema, AcceptsValidForms) {
  for (OpKind k : {OpKind::kFusedBatchNormGrad, OpKind::kFusedBatchNormGradV2,
                   OpKind::kFusedBatchNormGradV3}) {
    EXPECT_TRUE(add(tf_grad(k, {2, 3, 3, 4}, {2, 3, 3, 4}, 4)).ok());
    EXPECT_TRUE(add(tf_grad(k, {2, 4, 3, 3}, {2, 4, 3, 3}, 4, DataType::kF32, "NCHW")).ok());
    Op three = tf_grad(k, {0, 3, 3, 4}, {0, 3, 3, 4}, 4);  // empty batch, reserve outputs left out
    three.mutable_outputs().resize(3);
    EXPECT_TRUE(add(three).ok());
  }
  EXPECT_TRUE(add(tf_grad(OpKind::kFusedBatchNormGradV3, {2, 3, 3, 3, 5}, {2, 3, 3, 3, 5}, 5,
                          DataType::kBF16, "NDHWC"))
                  .ok());
  EXPECT_TRUE(
      add(tf_grad(OpKind::kFusedBatchNormGradV2, {2, 3, 3, 5}, {2, 3, 3, 5}, 5, DataType::kF16))
          .ok());
}

TEST(TfBatchNormGradSchema, CveShapesAreRefused) {
  // CVE-2021-41223 / 29583: mismatched x and y_backprop, and an empty scale.
  EXPECT_STATUS_HAS(add(tf_grad(OpKind::kFusedBatchNormGrad, {1, 1, 1, 2}, {1, 1, 3, 3}, 2)),
                    "x and y_backprop must have the same shape, but x has shape [1,1,1,2] and "
                    "y_backprop has shape [1,1,3,3]");
  Op empty_scale = tf_grad(OpKind::kFusedBatchNormGradV3, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  empty_scale.mutable_inputs()[2].dims = {0};
  EXPECT_STATUS_HAS(
      add(empty_scale),
      "input 2 'scale': scale must have the same number of elements as the channels of x: 0 vs 2");
  Op rs1 =
      tf_grad(OpKind::kFusedBatchNormGradV2, {1, 4, 1, 1}, {1, 4, 1, 1}, 4, DataType::kF32, "NCHW");
  rs1.mutable_inputs()[3].dims = {3};
  EXPECT_STATUS_HAS(
      add(rs1),
      "reserve_space_1 must have the same number of elements as the channels of x: 3 vs 4");
  Op rs2 = tf_grad(OpKind::kFusedBatchNormGrad, {1, 1, 1, 4}, {1, 1, 1, 4}, 4);
  rs2.mutable_inputs()[4].dims = {2, 2};
  EXPECT_STATUS_HAS(add(rs2), "reserve_space_2 must be 1-dimensional, got shape [2,2]");
}

TEST(TfBatchNormGradSchema, RankFollowsDataFormat) {
  EXPECT_STATUS_HAS(add(tf_grad(OpKind::kFusedBatchNormGrad, {2, 3, 4}, {2, 3, 4}, 4)),
                    "x must be a 4-dimensional tensor for data_format NHWC, got shape [2,3,4]");
  EXPECT_STATUS_HAS(add(tf_grad(OpKind::kFusedBatchNormGradV3, {2, 3, 3, 4}, {2, 3, 3, 4}, 4,
                                DataType::kF32, "NCDHW")),
                    "x must be a 5-dimensional tensor for data_format NCDHW");
  EXPECT_STATUS_HAS(add(tf_grad(OpKind::kFusedBatchNormGradV2, {2, 3, 3, 3, 4}, {2, 3, 3, 3, 4}, 4,
                                DataType::kF32, "NDHWC")),
                    "'data_format' is 'NDHWC', expected one of NHWC, NCHW");
}

TEST(TfBatchNormGradSchema, Dtypes) {
  EXPECT_STATUS_HAS(
      add(tf_grad(OpKind::kFusedBatchNormGrad, {1, 1, 1, 2}, {1, 1, 1, 2}, 2, DataType::kBF16)),
      "T is bf16, FusedBatchNormGrad takes float only");
  Op u = tf_grad(OpKind::kFusedBatchNormGradV2, {1, 1, 1, 2}, {1, 1, 1, 2}, 2, DataType::kBF16);
  u.mutable_inputs()[2].dtype = DataType::kBF16;
  EXPECT_STATUS_HAS(add(u), "input 2 'scale': dtype bf16, expected f32 (U = f32)");
  Op tattr = tf_grad(OpKind::kFusedBatchNormGradV3, {1, 1, 1, 2}, {1, 1, 1, 2}, 2, DataType::kF16);
  tattr.set_attr("T", std::string("float"));
  EXPECT_STATUS_HAS(add(tattr), "attribute 'T' is float but the tensors are f16");
  tattr.set_attr("T", std::string("half")).set_attr("U", std::string("double"));
  EXPECT_STATUS_HAS(add(tattr), "attribute 'U': 'double' is not one of float, half, bfloat16");
  tattr.set_attr("U", std::string("float"));
  EXPECT_TRUE(add(tattr).ok());
  Op out = tf_grad(OpKind::kFusedBatchNormGradV2, {1, 1, 1, 2}, {1, 1, 1, 2}, 2, DataType::kF16);
  out.mutable_outputs()[0].dtype = DataType::kF32;
  EXPECT_STATUS_HAS(add(out), "output 0 'x_backprop': dtype f32, expected f16 (T)");
}

TEST(TfBatchNormGradSchema, AttributesAndPorts) {
  Op op = tf_grad(OpKind::kFusedBatchNormGrad, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  op.set_attr("U", std::string("float"));
  EXPECT_STATUS_HAS(add(op), "unknown attribute 'U'");
  Op eps = tf_grad(OpKind::kFusedBatchNormGradV2, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  eps.set_attr("epsilon", -0.5f);
  EXPECT_STATUS_HAS(add(eps), "'epsilon' must be finite and >= 0");
  Op reserve = tf_grad(OpKind::kFusedBatchNormGradV2, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  reserve.mutable_outputs()[3].dims = {2};
  EXPECT_STATUS_HAS(add(reserve),
                    "output 3 'reserve_space_3': shape 2 does not match the inferred 0");
  Op four = tf_grad(OpKind::kFusedBatchNormGradV3, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  four.mutable_outputs().resize(4);
  EXPECT_STATUS_HAS(add(four), "has 4 outputs, expected 3 or 5");
  Op v2_six = tf_grad(OpKind::kFusedBatchNormGradV3, {1, 1, 1, 2}, {1, 1, 1, 2}, 2);
  Op as_v2(0, OpKind::kFusedBatchNormGradV2, "g");
  for (const auto& t : v2_six.inputs()) as_v2.add_input(t);
  for (const auto& t : v2_six.outputs()) as_v2.add_output(t);
  EXPECT_STATUS_HAS(add(as_v2), "has 6 inputs, expected 5");
}

}  // namespace
}  // namespace normgrad
