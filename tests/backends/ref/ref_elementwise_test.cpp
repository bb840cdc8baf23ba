// Reference elementwise ops against hand-computed values, including strided tensors.
#include <cmath>

#include <normgrad/compile/compiler.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::lt;

std::vector<float> run(const Graph& g, const std::map<int64_t, std::vector<float>>& in,
                       int64_t out_id, size_t out_elems) {
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, const void*> ip;
  for (const auto& [id, v] : in) ip[id] = v.data();
  std::vector<float> out(out_elems, -77.f);
  Status s = cg->execute(ip, {{out_id, out.data()}});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

TEST(RefElementwise, ReLUBackwardBothVariantsMaskOnPositive) {
  for (bool use_dst : {true, false}) {
    Graph g;
    Op op(0, OpKind::kReLUBackward, "rb");
    op.set_attr("use_dst", use_dst);
    op.add_input(lt(0, DataType::kF32, {4}))
        .add_input(lt(1, DataType::kF32, {4}))
        .add_output(lt(2, DataType::kF32, {4}));
    ASSERT_TRUE(g.add_op(op).ok());
    auto y = run(g, {{0, {-1, 0, 2, 3}}, {1, {5, 6, 7, 8}}}, 2, 4);
    EXPECT_EQ(y, (std::vector<float>{0, 0, 7, 8}));
  }
}

// A kind added with a schema and a ref case only: it partitions to ref with
// no pattern of its own, and computes the closed form (extremes included).
TEST(RefElementwise, SigmoidRunsOnRefFromItsSchemaAlone) {
  Graph g;
  Op op(0, OpKind::kSigmoid, "sig");
  op.add_input(lt(0, DataType::kF32, {6})).add_output(lt(1, DataType::kF32, {6}));
  ASSERT_TRUE(g.add_op(op).ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  ASSERT_EQ(cg->partitions().size(), 1u);
  EXPECT_STREQ(cg->partitions()[0]->backend_name(), "ref");
  std::vector<float> x = {-800.f, -2.f, 0.f, 0.5f, 3.f, 800.f};
  std::vector<float> y(6, -77.f);
  ASSERT_TRUE(cg->execute({{0, x.data()}}, {{1, y.data()}}).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    EXPECT_EQ(y[i], static_cast<float>(want)) << "x = " << x[i];
  }
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[5], 1.f);
  // Its schema checks it like any other kind.
  Graph bad;
  Op wrong(0, OpKind::kSigmoid, "sig");
  wrong.add_input(lt(0, DataType::kF32, {6})).add_output(lt(1, DataType::kBF16, {6}));
  EXPECT_FALSE(bad.add_op(wrong).ok());
}

TEST(RefElementwise, AddBroadcastsAndMixesDtypes) {
  // 2x3 f32 + 3 bf16 (lower rank, aligned right) -> 2x3 f32, as numpy would.
  Graph g;
  Op op(0, OpKind::kAdd, "add");
  op.add_input(lt(0, DataType::kF32, {2, 3}))
      .add_input(lt(1, DataType::kBF16, {3}))
      .add_output(lt(2, DataType::kF32, {2, 3}));
  ASSERT_TRUE(g.add_op(op).ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{});  // auto: only ref takes it
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  EXPECT_STREQ(cg->partitions()[0]->backend_name(), "ref");
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {f32_to_bf16_bits(0.5f), f32_to_bf16_bits(-1.f),
                             f32_to_bf16_bits(10.f)};
  std::vector<float> out(6, -77.f);
  ASSERT_TRUE(cg->execute({{0, a.data()}, {1, b.data()}}, {{2, out.data()}}).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 1, 13, 4.5f, 4, 16}));
  // No silent slow path: forbidding ref makes the fallback an error with the reasons.
  CompileOptions strict;
  strict.allow_reference = false;
  auto refused = CompiledGraph::compile(g, strict);
  EXPECT_STATUS_HAS(refused.status(),
                    "only the reference backend would run it, and "
                    "CompileOptions::allow_reference is off");
  EXPECT_STATUS_HAS(refused.status(), "Add with broadcasting or mixed dtypes is not lowered");
}

TEST(RefElementwise, ChainWithTransposeCastAndAdd) {
  // x (2x3) -> transpose [1, 0] -> (3x2); + y; relu; cast to bf16 and back is exact for these
  // values.
  Graph g;
  Op t(0, OpKind::kStaticTranspose, "t");
  t.set_attr("order", std::vector<int64_t>{1, 0});
  t.add_input(lt(0, DataType::kF32, {2, 3})).add_output(lt(1, DataType::kF32, {3, 2}));
  Op a(1, OpKind::kAdd, "a");
  a.add_input(lt(1, DataType::kF32, {3, 2}))
      .add_input(lt(2, DataType::kF32, {3, 2}))
      .add_output(lt(3, DataType::kF32, {3, 2}));
  Op r(2, OpKind::kReLU, "r");
  r.add_input(lt(3, DataType::kF32, {3, 2})).add_output(lt(4, DataType::kF32, {3, 2}));
  Op c(3, OpKind::kTypeCast, "c");
  c.add_input(lt(4, DataType::kF32, {3, 2})).add_output(lt(5, DataType::kBF16, {3, 2}));
  Op back(4, OpKind::kTypeCast, "b");
  back.add_input(lt(5, DataType::kBF16, {3, 2})).add_output(lt(6, DataType::kF32, {3, 2}));
  for (Op* op : {&back, &c, &r, &a, &t}) ASSERT_TRUE(g.add_op(*op).ok());  // any order
  auto y = run(g, {{0, {1, 2, 3, 4, 5, 6}}, {2, {0, -10, 0, 0, -9, 1}}}, 6, 6);
  // transpose: {1,4, 2,5, 3,6}; + y: {1,-6, 2,5, -6,7}; relu: {1,0, 2,5, 0,7}.
  EXPECT_EQ(y, (std::vector<float>{1, 0, 2, 5, 0, 7}));
}

TEST(RefElementwise, StridedInputIsAddressedThroughStrides) {
  Graph g;
  Op r(0, OpKind::kReLU, "r");
  LogicalTensor in = lt(0, DataType::kF32, {2, 2});
  in.strides = {1, 2};  // column-major view
  r.add_input(in).add_output(lt(1, DataType::kF32, {2, 2}));
  ASSERT_TRUE(g.add_op(r).ok());
  auto y = run(g, {{0, {1, -2, 3, 4}}}, 1, 4);
  EXPECT_EQ(y, (std::vector<float>{1, 3, 0, 4}));
}

}  // namespace
}  // namespace normgrad
