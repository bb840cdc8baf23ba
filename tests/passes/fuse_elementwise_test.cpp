// FuseElementwisePass: which producers join their batch norm (graph in ->
// groups and partitions out), the DoesNot... cases, and numeric equality of
// the fused graph with the unfused one through ref.
#include <normgrad/passes/fuse_elementwise.hpp>

#include <normgrad/backends/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

// producer(kind) -> t (id 20) -> BN port `port`; producer inputs 30, 31.
Graph chain(OpKind kind, int port, DataType dt = DataType::kF32, const std::string& fmt = "NXC",
            bool use_dst = true) {
  const Dims shape = fmt == "NXC" ? Dims{2, 5, 5, 24} : Dims{2, 24, 5, 5};
  Op pre(1, kind, "pre");
  if (kind == OpKind::kReLUBackward) pre.set_attr("use_dst", use_dst);
  pre.add_input(lt(30, dt, shape)).add_input(lt(31, dt, shape)).add_output(lt(20, dt, shape));
  Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  bn.mutable_inputs()[port].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(pre).ok());
  EXPECT_TRUE(g.add_op(bn).ok());
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

TEST(FuseElementwisePass, GroupsProducerOnEitherPort) {
  for (OpKind kind : {OpKind::kReLUBackward, OpKind::kAdd}) {
    for (int port : {0, 1}) {
      Graph g = chain(kind, port);
      auto changed = FuseElementwisePass().run(g);
      ASSERT_TRUE(changed.ok() && *changed);
      EXPECT_EQ(g.fusion_groups().at(1), 0);
      EXPECT_EQ(g.fusion_groups().at(0), 0);
      auto parts = partition_graph(g);
      ASSERT_TRUE(parts.ok());
      ASSERT_EQ(parts->size(), 1u);
      const Partition& p = (*parts)[0];
      EXPECT_EQ(p.ops_string(), std::string(op_kind_name(kind)) + "+BatchNormTrainingBackward");
      std::vector<int64_t> in_ids, out_ids;
      for (const auto& t : p.inputs) in_ids.push_back(t.id);
      for (const auto& t : p.outputs) out_ids.push_back(t.id);
      // The internal tensor 20 is neither an input nor an output of the partition.
      EXPECT_EQ(std::count(in_ids.begin(), in_ids.end(), 20), 0);
      EXPECT_EQ(out_ids, (std::vector<int64_t>{5, 6, 7}));
      EXPECT_EQ(in_ids.size(), 6u);  // 30, 31 and the batch norm's other four inputs
      // The groups survive a JSON round trip through `normgrad opt`'s writer.
      auto again = graph_from_json(graph_to_json(g, true));
      ASSERT_TRUE(again.ok()) << again.status().to_string();
      EXPECT_EQ(again->fusion_groups(), g.fusion_groups());
    }
  }
}

TEST(FuseElementwisePass, DoesNotFuseASecondConsumer) {
  Graph g = chain(OpKind::kReLUBackward, 1);
  Op other(2, OpKind::kReLU, "other");
  other.add_input(lt(20, DataType::kF32, {2, 5, 5, 24}))
      .add_output(lt(40, DataType::kF32, {2, 5, 5, 24}));
  ASSERT_TRUE(g.add_op(other).ok());
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_FALSE(*FuseElementwisePass().run(g));
  EXPECT_TRUE(g.fusion_groups().empty());
}

TEST(FuseElementwisePass, DoesNotFuseAGraphOutput) {
  Graph g = chain(OpKind::kAdd, 1);
  g.set_output_ports({20, 5, 6, 7});
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_FALSE(*FuseElementwisePass().run(g));
}

TEST(FuseElementwisePass, DoesNotFuseOtherProducersOrPorts) {
  // A TypeCast producer (not elementwise-fusible here) and a producer feeding mean.
  Graph g;
  Op cast(1, OpKind::kTypeCast, "cast");
  cast.add_input(lt(30, DataType::kBF16, {2, 24})).add_output(lt(20, DataType::kF32, {2, 24}));
  Op bn = bn_bwd({2, 24}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  bn.mutable_inputs()[1].id = 20;
  ASSERT_TRUE(g.add_op(cast).ok());
  ASSERT_TRUE(g.add_op(bn).ok());
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_FALSE(*FuseElementwisePass().run(g));
  Graph h;
  Op relu(1, OpKind::kReLU, "relu");
  relu.add_input(lt(30, DataType::kF32, {24})).add_output(lt(2, DataType::kF32, {24}));
  ASSERT_TRUE(h.add_op(relu).ok());
  ASSERT_TRUE(h.add_op(bn_bwd({2, 24}, "NXC", DataType::kF32, DataType::kF32, true, 3)).ok());
  ASSERT_TRUE(h.finalize().ok());
  EXPECT_FALSE(*FuseElementwisePass().run(h));
}

TEST(FuseElementwisePass, DoesNotFuseATensorFeedingBothPorts) {
  Graph g = chain(OpKind::kReLUBackward, 1);
  Graph h;
  for (Op op : g.ops()) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) op.mutable_inputs()[0].id = 20;
    ASSERT_TRUE(h.add_op(op).ok());
  }
  ASSERT_TRUE(h.finalize().ok());
  EXPECT_FALSE(*FuseElementwisePass().run(h));
}

// The whole pipeline does not change the numbers: the fused partition on ref
// against the hand-unfused graph (fusion groups cleared) on ref.
TEST(FuseElementwisePass, NumbersMatchTheUnfusedGraph) {
  for (OpKind kind : {OpKind::kReLUBackward, OpKind::kAdd}) {
    for (int port : {0, 1}) {
      Graph g = chain(kind, port, DataType::kBF16, "NCX");
      auto fused = CompiledGraph::compile(g, CompileOptions{"ref"});
      ASSERT_TRUE(fused.ok());
      ASSERT_EQ(fused->partitions().size(), 1u);
      // Unfused: the same graph with the pass switched off by hand.
      Graph lowered = fused->lowered_graph();
      lowered.clear_fusion_groups();
      auto parts = partition_graph(lowered);
      ASSERT_TRUE(parts.ok());
      ASSERT_EQ(parts->size(), 2u);
      const auto r = testing_util::compare_with_ref(g, "jit", 4);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find(port == 0 ? "+src_" : "+diff_dst_"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
  }
}

}  // namespace
}  // namespace normgrad
