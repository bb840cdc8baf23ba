// Error flow of the batch-norm schemas: every rule, with status and message fragment.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

Status add(Op op) {
  Graph g;
  return g.add_op(std::move(op));
}

TEST(BatchNormTrainingBackwardSchema, AcceptsTheDocumentedForms) {
  for (const char* fmt : {"NCX", "NXC"}) {
    for (int rank = 2; rank <= 6; ++rank) {
      Dims shape(static_cast<size_t>(rank), 3);
      EXPECT_TRUE(add(bn_bwd(shape, fmt, DataType::kF32, DataType::kF32, true, 3)).ok());
      EXPECT_TRUE(
          add(bn_bwd(shape, fmt, DataType::kF32, DataType::kF32, false, 3)).ok());  // gamma = 1
      EXPECT_TRUE(add(bn_bwd(shape, fmt, DataType::kF32, DataType::kF32, true, 1)).ok());
    }
  }
  EXPECT_TRUE(add(bn_bwd({2, 4, 3, 3}, "NCX", DataType::kBF16, DataType::kBF16, true, 3)).ok());
  EXPECT_TRUE(add(bn_bwd({2, 4, 3, 3}, "NCX", DataType::kBF16, DataType::kF32, true, 3)).ok());
  EXPECT_TRUE(add(bn_bwd({2, 4, 3, 3}, "NXC", DataType::kF16, DataType::kF32, true, 3)).ok());
}

TEST(BatchNormTrainingBackwardSchema, PortCounts) {
  Op op = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  op.mutable_outputs().pop_back();
  EXPECT_STATUS_HAS(add(op), "has 2 outputs, expected 1 or 3");
  Op three_in = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, false, 3);
  three_in.mutable_inputs().pop_back();
  EXPECT_STATUS_HAS(add(three_in), "has 3 inputs, expected 4 to 5");
}

TEST(BatchNormTrainingBackwardSchema, Attributes) {
  Op op = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  op.erase_attr("epsilon");
  EXPECT_STATUS_HAS(add(op), "required attribute 'epsilon' is missing");
  op.set_attr("epsilon", -1.0f);
  EXPECT_STATUS_HAS(add(op), "'epsilon' must be finite and >= 0");
  op.set_attr("epsilon", std::numeric_limits<float>::infinity());
  EXPECT_STATUS_HAS(add(op), "'epsilon' must be finite and >= 0");
  op.set_attr("epsilon", AttrValue(int64_t{1}));  // the raw variant keeps s64
  EXPECT_STATUS_HAS(add(op), "attribute 'epsilon' has type s64, expected f32");
  op.set_attr("epsilon", 0.0f);
  EXPECT_TRUE(add(op).ok());
  op.set_attr("data_format", std::string("NHWC"));
  EXPECT_STATUS_HAS(add(op), "'data_format' is 'NHWC', expected one of NCX, NXC");
  op.set_attr("data_format", std::string("NCX"));
  op.set_attr("momentum", 0.5f);
  EXPECT_STATUS_HAS(add(op), "unknown attribute 'momentum'");
}

TEST(BatchNormTrainingBackwardSchema, Dtypes) {
  Op op = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  op.mutable_inputs()[1].dtype = DataType::kBF16;
  EXPECT_STATUS_HAS(add(op), "input 1 'diff_dst': dtype bf16 differs from src's f32");
  EXPECT_STATUS_HAS(add(bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kBF16, true, 3)),
                    "input 2 'mean': dtype bf16 is not allowed with f32 data");
  EXPECT_STATUS_HAS(add(bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF16, DataType::kF16, true, 3)),
                    "dtype f16 is not allowed with f16 data");
  Op mixed = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kBF16, DataType::kF32, true, 3);
  mixed.mutable_inputs()[4].dtype = DataType::kBF16;
  EXPECT_STATUS_HAS(add(mixed), "input 4 'gamma': dtype bf16 differs from");
  Op out = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  out.mutable_outputs()[0].dtype = DataType::kF16;
  EXPECT_STATUS_HAS(add(out), "output 0 'diff_src': dtype f16 differs from src's f32");
}

TEST(BatchNormTrainingBackwardSchema, Shapes) {
  Op op = bn_bwd({2, 64, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  op.mutable_inputs()[4].dims = {63};
  EXPECT_STATUS_HAS(add(op), "input 4 'gamma' has 63 elements, expected C=64");
  Op nxc = bn_bwd({2, 3, 3, 64}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  nxc.mutable_inputs()[2].dims = {3};
  EXPECT_STATUS_HAS(add(nxc), "input 2 'mean' has 3 elements, expected C=64");
  Op two_d = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  two_d.mutable_inputs()[3].dims = {2, 2};
  EXPECT_STATUS_HAS(add(two_d), "input 3 'variance': must be 1-D with C=4 elements, got shape 2x2");
  Op dd = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  dd.mutable_inputs()[1].dims = {2, 4, 3, 4};
  EXPECT_STATUS_HAS(add(dd), "input 1 'diff_dst': shape 2x4x3x4 differs from src's 2x4x3x3");
  EXPECT_STATUS_HAS(add(bn_bwd({4}, "NCX", DataType::kF32, DataType::kF32, true, 3)),
                    "rank 1 is not supported");
  Op seven = bn_bwd({1, 2, 1, 1, 1, 1, 1}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  EXPECT_STATUS_HAS(add(seven), "rank 7 is not supported (expected 2 to 6)");
  Op out = bn_bwd({2, 4, 3, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  out.mutable_outputs()[1].dims = {5};
  EXPECT_STATUS_HAS(add(out), "output 1 'diff_gamma': shape 5 does not match the inferred 4");
}

TEST(BatchNormForwardTrainingSchema, Rules) {
  Op op(0, OpKind::kBatchNormForwardTraining, "fwd");
  op.set_attr("epsilon", 1e-5f).set_attr("data_format", std::string("NCX"));
  op.add_input(lt(0, DataType::kF32, {2, 3, 4})).add_input(lt(1, DataType::kF32, {3}));
  op.add_input(lt(2, DataType::kF32, {3})).add_input(lt(3, DataType::kF32, {3}));
  for (int i = 0; i < 5; ++i)
    op.add_output(lt(10 + i, DataType::kF32, i == 0 ? Dims{2, 3, 4} : Dims{3}));
  EXPECT_STATUS_HAS(add(op), "has 4 inputs, expected 3 or 5");
  op.add_input(lt(4, DataType::kF32, {3}));
  EXPECT_TRUE(add(op).ok());
  op.set_attr("momentum", std::string("x"));
  EXPECT_STATUS_HAS(add(op), "attribute 'momentum' has type string, expected f32");
}

TEST(BatchNormInferenceSchema, Rules) {
  Op op(0, OpKind::kBatchNormInference, "inf");
  op.set_attr("epsilon", 1e-5f);
  op.add_input(lt(0, DataType::kF32, {2, 4, 4, 3}));
  for (int i = 1; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {3}));
  op.add_output(lt(5, DataType::kF32, {2, 4, 4, 3}));
  EXPECT_TRUE(add(op).ok());  // NXC is the default
  op.set_attr("data_format", std::string("NCX"));
  EXPECT_STATUS_HAS(add(op), "input 1 'gamma' has 3 elements, expected C=4");
}

}  // namespace
}  // namespace normgrad

namespace normgrad {
namespace {

// op_ports.def's indices are the schemas' (the schemas are built from its
// order): every declared port has the schema's name at its index, and every
// schema port is declared.
TEST(OpPorts, DeclaredIndicesAreTheSchemas) {
  struct Declared {
    OpKind kind;
    bool input;
    std::string name;
    size_t index;
  };
  std::vector<Declared> declared;
  OpKind kind = OpKind::kEnd;
#define NG_IN(n, i) declared.push_back({kind, true, #n, i});
#define NG_IN_OPT(n, i) declared.push_back({kind, true, #n, i});
#define NG_OUT(n, i) declared.push_back({kind, false, #n, i});
#define NG_OUT_OPT(n, i) declared.push_back({kind, false, #n, i});
#define NG_IN_AS(n, label, i) declared.push_back({kind, true, label, i});
#define NG_IN_LIST(n, max)           \
  for (size_t k = 0; k < (max); ++k) \
    declared.push_back({kind, true, #n "_" + std::to_string(k), k});
#define NG_OUT_LIST(n, max)          \
  for (size_t k = 0; k < (max); ++k) \
    declared.push_back({kind, false, #n "_" + std::to_string(k), k});
  std::set<OpKind> kinds;
#define NG_OP_PORTS(Kind, inputs, outputs) \
  kind = OpKind::k##Kind;                  \
  kinds.insert(kind);                      \
  inputs outputs
#include <normgrad/ops/op_ports.def>
  ASSERT_GE(declared.size(), 30u);
  // Every kind with a schema names its ports there, and only those kinds.
  for (size_t k = 0; k < static_cast<size_t>(OpKind::kCount); ++k) {
    const auto kk = static_cast<OpKind>(k);
    EXPECT_EQ(op_registry().find(kk) != nullptr, kinds.count(kk) == 1) << op_kind_name(kk);
  }
  std::map<std::pair<OpKind, bool>, size_t> count;
  for (const Declared& d : declared) {
    const OpSchema* s = op_registry().find(d.kind);
    ASSERT_NE(s, nullptr) << d.name;
    EXPECT_EQ(d.input ? s->input_name(d.index) : s->output_name(d.index), d.name);
    ++count[{d.kind, d.input}];
  }
  for (const auto& [key, n] : count) {
    const OpSchema* s = op_registry().find(key.first);
    EXPECT_EQ(n, key.second ? s->inputs().size() : s->outputs().size());
  }
  // The accessors read those ports of a real op.
  const Op op = testing_util::bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  const BatchNormTrainingBackwardPorts bn(op);
  EXPECT_EQ(bn.diff_dst().id, op.inputs()[1].id);
  EXPECT_EQ(bn.variance().id, op.inputs()[3].id);
  EXPECT_EQ(bn.has_gamma(), op.inputs().size() == 5);
  EXPECT_EQ(BatchNormTrainingBackwardPorts::gamma_port(), 4u);
  EXPECT_EQ(bn.has_diff_beta(), op.outputs().size() == 3);
  // A variadic kind's list.
  Op all_reduce(9, OpKind::kAllReduce);
  all_reduce.add_input(LogicalTensor(1, DataType::kF32, {3}))
      .add_input(LogicalTensor(2, DataType::kF32, {3}))
      .add_output(LogicalTensor(3, DataType::kF32, {3}))
      .add_output(LogicalTensor(4, DataType::kF32, {3}));
  const AllReducePorts ar(all_reduce);
  EXPECT_EQ(ar.src_count(), 2u);
  EXPECT_EQ(ar.src(1).id, 2);
  EXPECT_EQ(ar.dst(1).id, 4);
  EXPECT_EQ(op_registry().find(OpKind::kAllReduce)->input_name(AllReducePorts::src_port(7)),
            "src_7");
}

}  // namespace
}  // namespace normgrad

namespace normgrad {
namespace {

// What the schemas declare once, and the compiler's in-place pairs and the
// benchdnn knobs read: data ports against per-channel ones, and which input
// an output may overwrite.
TEST(OpSchemaFacts, PerChannelPortsAndInPlacePairs) {
  struct Case {
    OpKind kind;
    std::vector<size_t> per_channel_in, per_channel_out;
    std::vector<std::pair<size_t, size_t>> inplace;
  } cases[] = {
      {OpKind::kBatchNormTrainingBackward, {2, 3, 4}, {1, 2}, {{1, 0}}},
      {OpKind::kBatchNormTrainingBackwardFromDst, {2, 3, 4}, {1, 2}, {{1, 0}}},
      {OpKind::kBatchNormForwardTraining, {1, 2, 3, 4}, {1, 2, 3, 4}, {{0, 0}}},
      {OpKind::kBatchNormInference, {1, 2, 3, 4}, {}, {{0, 0}}},
      {OpKind::kBatchNormBackwardReduce, {2}, {0, 1}, {}},
      {OpKind::kBatchNormBackwardApply, {2, 3, 4, 5, 7}, {1, 2}, {}},
      {OpKind::kFusedBatchNormGradV3, {2, 3, 4, 5}, {1, 2, 3, 4}, {}},
      {OpKind::kReLUBackward, {}, {}, {{1, 0}}},
      {OpKind::kReLU, {}, {}, {{0, 0}}},
      {OpKind::kLeakyReLU, {}, {}, {{0, 0}}},
      {OpKind::kAdd, {}, {}, {{0, 0}}},
      {OpKind::kTypeCast, {}, {}, {}},
  };
  for (const Case& c : cases) {
    const OpSchema* s = op_registry().find(c.kind);
    ASSERT_NE(s, nullptr) << op_kind_name(c.kind);
    for (size_t i = 0; i < s->inputs().size(); ++i) {
      const bool want = std::count(c.per_channel_in.begin(), c.per_channel_in.end(), i) != 0;
      EXPECT_EQ(s->is_per_channel(true, i), want) << op_kind_name(c.kind) << " input " << i;
    }
    for (size_t i = 0; i < s->outputs().size(); ++i) {
      const bool want = std::count(c.per_channel_out.begin(), c.per_channel_out.end(), i) != 0;
      EXPECT_EQ(s->is_per_channel(false, i), want) << op_kind_name(c.kind) << " output " << i;
    }
    EXPECT_EQ(s->inplace_pairs(), c.inplace) << op_kind_name(c.kind);
  }
}

}  // namespace
}  // namespace normgrad
