// CanonicalizePass: graph in -> graph out (structure), and numeric equality
// of the whole graph through ref before and after the pass.
#include <normgrad/graph/text_io.hpp>
#include <normgrad/passes/canonicalize.hpp>
#include <normgrad/passes/fold_layout.hpp>

#include <random>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

Graph tf_graph(bool training, const std::string& fmt, bool inv_std) {
  const Dims shape = fmt == "NCHW" ? Dims{2, 3, 4, 4} : Dims{2, 4, 4, 3};
  Op op(4, OpKind::kFusedBatchNormGradV3, "grad");
  op.set_attr("is_training", training).set_attr("data_format", fmt).set_attr("epsilon", 0.01f);
  if (inv_std) op.set_attr("reserve_space_2_is_inv_std", true);
  op.add_input(lt(0, DataType::kF32, shape)).add_input(lt(1, DataType::kF32, shape));
  for (int i = 2; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {3}));
  op.add_input(lt(5, DataType::kF32, {0}));
  op.add_output(lt(6, DataType::kF32, shape))
      .add_output(lt(7, DataType::kF32, {3}))
      .add_output(lt(8, DataType::kF32, {3}));
  op.add_output(lt(9, DataType::kF32, {0})).add_output(lt(10, DataType::kF32, {0}));
  Graph g;
  EXPECT_TRUE(g.add_op(op).ok());
  Op end(5, OpKind::kEnd, "end");
  end.add_input(lt(9, DataType::kF32, {0}));
  EXPECT_TRUE(g.add_op(end).ok());
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

TEST(CanonicalizePass, RewritesFusedBatchNormGradV3) {
  Graph g = tf_graph(false, "NCHW", true);
  auto changed = CanonicalizePass().run(g);
  ASSERT_TRUE(changed.ok() && *changed);
  ASSERT_TRUE(g.finalize().ok());
  ASSERT_EQ(g.ops().size(), 1u);  // the End that marked an empty reserve output is gone
  const Op& bn = g.ops().at(0);
  EXPECT_EQ(bn.kind(), OpKind::kBatchNormTrainingBackward);
  EXPECT_EQ(bn.name(), "grad");
  EXPECT_EQ(*bn.attr_string("data_format"), "NCX");
  EXPECT_EQ(*bn.attr_bool("is_training"), false);
  EXPECT_EQ(*bn.attr_bool("variance_is_inv_std"), true);
  EXPECT_EQ(*bn.attr_f32("epsilon"), 0.01f);
  // src = x (1), diff_dst = y_backprop (0), mean = rs1 (3), variance = rs2 (4), gamma = scale (2).
  std::vector<int64_t> in_ids, out_ids;
  for (const auto& t : bn.inputs()) in_ids.push_back(t.id);
  for (const auto& t : bn.outputs()) out_ids.push_back(t.id);
  EXPECT_EQ(in_ids, (std::vector<int64_t>{1, 0, 3, 4, 2}));
  EXPECT_EQ(out_ids, (std::vector<int64_t>{6, 7, 8}));
  // A second run changes nothing.
  EXPECT_FALSE(*CanonicalizePass().run(g));
}

TEST(CanonicalizePass, MakesOneDnnFormsExplicit) {
  Graph g;
  ASSERT_TRUE(g.add_op(bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 1)).ok());
  ASSERT_TRUE(g.finalize().ok());
  ASSERT_TRUE(*CanonicalizePass().run(g));
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_EQ(*g.ops().at(0).attr_bool("is_training"), false);
  EXPECT_EQ(g.ops().at(0).inputs().size(), 4u);  // gamma, which oneDNN ignores here, is gone
  Graph h;
  ASSERT_TRUE(h.add_op(bn_bwd({2, 3, 4}, "NXC", DataType::kF32, DataType::kF32, false, 3)).ok());
  ASSERT_TRUE(h.finalize().ok());
  ASSERT_TRUE(*CanonicalizePass().run(h));
  EXPECT_EQ(*h.ops().at(0).attr_bool("is_training"), true);
}

TEST(CanonicalizePass, PipelinePrintsAfterEachPass) {
  Graph g = tf_graph(true, "NHWC", false);
  std::ostringstream os;
  std::vector<PassRecord> records;
  auto pipeline = build_pipeline(CompileOptions{});
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
  auto changed = pipeline->run(g, &os, &records);
  ASSERT_TRUE(changed.ok() && *changed);
  size_t builtin = 0;
  for (const PassInfo& p : registered_passes()) builtin += p.builtin ? 1 : 0;
  ASSERT_EQ(records.size(), builtin);
  EXPECT_EQ(records.front().name, "canonicalize");
  EXPECT_EQ(records.back().name, "split-sync-batch-norm");
  EXPECT_NE(os.str().find("// after canonicalize"), std::string::npos);
  EXPECT_NE(os.str().find("\"BatchNormTrainingBackward\""), std::string::npos);
  EXPECT_EQ(os.str().find("FusedBatchNormGradV3"), std::string::npos);
}

// The pass must not change any number: compare ref on the canonical graph with
// ref on a hand-written BatchNormTrainingBackward of the same meaning.
TEST(CanonicalizePass, NumbersAgreeWithTheHandWrittenForm) {
  for (bool training : {true, false}) {
    Graph tf = tf_graph(training, "NHWC", false);
    Graph bn;
    Op op = bn_bwd({2, 4, 4, 3}, "NXC", DataType::kF32, DataType::kF32, true, 3, 0.01f);
    op.set_attr("is_training", training);
    // Rename tensors to the TF graph's ids: src 1, diff_dst 0, mean 3, variance 4, gamma 2; outputs
    // 6, 7, 8.
    const int64_t in_ids[] = {1, 0, 3, 4, 2}, out_ids[] = {6, 7, 8};
    for (size_t i = 0; i < 5; ++i) op.mutable_inputs()[i].id = in_ids[i];
    for (size_t i = 0; i < 3; ++i) op.mutable_outputs()[i].id = out_ids[i];
    ASSERT_TRUE(bn.add_op(op).ok());
    auto a = CompiledGraph::compile(tf, CompileOptions{"ref"});
    auto b = CompiledGraph::compile(bn, CompileOptions{"ref"});
    ASSERT_TRUE(a.ok() && b.ok());
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    std::vector<float> x(96), dy(96), s(3), m(3), v(3);
    for (auto* vec : {&x, &dy, &s, &m, &v}) {
      for (float& f : *vec) f = u(rng);
    }
    std::map<int64_t, const void*> in = {{0, dy.data()}, {1, x.data()}, {2, s.data()},
                                         {3, m.data()},  {4, v.data()}, {5, nullptr}};
    std::vector<float> o1(96), g1(3), b1(3), o2(96), g2(3), b2(3);
    ASSERT_TRUE(
        a->execute(in,
                   {{6, o1.data()}, {7, g1.data()}, {8, b1.data()}, {9, nullptr}, {10, nullptr}})
            .ok());
    in.erase(5);  // the hand-written form has no reserve_space_3 (unknown ids are errors)
    ASSERT_TRUE(b->execute(in, {{6, o2.data()}, {7, g2.data()}, {8, b2.data()}}).ok());
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(g1, g2);
    EXPECT_EQ(b1, b2);
  }
}

// The fixed-point wrapper (XLA's HloPassFix) runs a one-step rewrite until it
// stops changing the graph, and a step that never stops is an error, not a hang.
class DropOneEnd final : public Pass {
 public:
  const char* name() const override { return "drop-one-end"; }
  StatusOr<bool> run(Graph& graph) const override {
    for (const Op& op : graph.ops()) {
      if (op.kind() == OpKind::kEnd) {
        NG_RETURN_IF_ERROR(graph.erase_op(op.id()));
        return true;
      }
    }
    return false;
  }
};

// One run of the fold folds every group there is (not one group a run,
// with the fixed point re-walking the graph after each: quadratic on large
// graphs).
TEST(FoldTranspose, OneRunFoldsEveryGroup) {
  std::string text;
  const int kGroups = 50;
  for (int k = 0; k < kGroups; ++k) {
    const int b = 100 * k, o = 10 * k;
    auto t = [&](int id) { return "%" + std::to_string(b + id); };
    text += t(20) + ":f32[2,5,5,8] = StaticTranspose#" + std::to_string(o + 1) + " \"t0\"(" + t(0) +
            ":f32[2,8,5,5]) {order=[0,2,3,1]}\n";
    text += t(21) + ":f32[2,5,5,8] = StaticTranspose#" + std::to_string(o + 2) + " \"t1\"(" + t(1) +
            ":f32[2,8,5,5]) {order=[0,2,3,1]}\n";
    text += t(22) + ":f32[2,5,5,8], " + t(6) + ":f32[8], " + t(7) +
            ":f32[8] = BatchNormTrainingBackward#" + std::to_string(o + 3) + " \"bn\"(" + t(20) +
            ":f32[2,5,5,8], " + t(21) + ":f32[2,5,5,8], " + t(2) + ":f32[8], " + t(3) +
            ":f32[8], " + t(4) +
            ":f32[8]) {data_format=\"NXC\", epsilon=0.001f, is_training=true}\n";
    text += t(5) + ":f32[2,8,5,5] = StaticTranspose#" + std::to_string(o + 4) + " \"t2\"(" + t(22) +
            ":f32[2,5,5,8]) {order=[0,3,1,2]}\n";
  }
  auto g = graph_from_text(text);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(g->finalize().ok());
  const FoldTransposePass pass;
  auto changed = pass.run(*g);
  ASSERT_TRUE(changed.ok()) << changed.status().to_string();
  EXPECT_TRUE(*changed);
  ASSERT_EQ(g->ops().size(), static_cast<size_t>(kGroups));
  for (const Op& op : g->ops()) {
    EXPECT_EQ(op.kind(), OpKind::kBatchNormTrainingBackward);
    EXPECT_EQ(*op.attr_string("data_format"), "NCX");
  }
  EXPECT_TRUE(g->check_against_rebuild().ok());
  auto again = pass.run(*g);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

TEST(FixedPoint, RunsAStepUntilNothingChanges) {
  Graph g;
  Op relu(0, OpKind::kReLU, "r");
  relu.add_input(testing_util::lt(0, DataType::kF32, {4}))
      .add_output(testing_util::lt(1, DataType::kF32, {4}));
  ASSERT_TRUE(g.add_op(relu).ok());
  for (int64_t k = 1; k <= 3; ++k) {
    Op end(k, OpKind::kEnd, "e");
    end.add_input(testing_util::lt(1, DataType::kF32, {4}));
    ASSERT_TRUE(g.add_op(end).ok());
  }
  ASSERT_TRUE(g.finalize().ok());
  auto pass = fixed_point(std::make_unique<DropOneEnd>());
  EXPECT_STREQ(pass->name(), "drop-one-end");
  auto changed = pass->run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_EQ(g.ops().size(), 1u);
  EXPECT_FALSE(*pass->run(g));  // nothing left to do
  auto forever = run_to_fixed_point(
      g, [](Graph&) -> StatusOr<bool> { return true; }, 5);
  EXPECT_STATUS_HAS(forever.status(), "still changed the graph after 5 steps");
}

}  // namespace
}  // namespace normgrad
