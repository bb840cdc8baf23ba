// Patterns and the partitioner: which producers join their batch norm, which
// backend's pattern wins in priority order, what --explain records, that a
// fused pattern declined by the fast backend falls to the next pattern (not a
// split-back), that a pattern a test declines is one declaration, and that
// fused partitions give the unfused graph's numbers.
#include <normgrad/passes/partitioner.hpp>
#include <normgrad/passes/rewrite_util.hpp>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/compile/pipeline.hpp>
#include <normgrad/graph/text_io.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

// producer(kind) -> t (id 20) -> BN port `port`; producer inputs 30, 31.
Graph chain(OpKind kind, int port, DataType dt = DataType::kF32, const std::string& fmt = "NXC",
            bool finalize = true) {
  const Dims shape = fmt == "NXC" ? Dims{2, 5, 5, 24} : Dims{2, 24, 5, 5};
  Op pre(1, kind, "pre");
  if (kind == OpKind::kReLUBackward) pre.set_attr("use_dst", true);
  pre.add_input(lt(30, dt, shape)).add_input(lt(31, dt, shape)).add_output(lt(20, dt, shape));
  Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  bn.mutable_inputs()[port].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(pre).ok());
  EXPECT_TRUE(g.add_op(bn).ok());
  if (finalize) {
    EXPECT_TRUE(g.finalize().ok());
  }
  return g;
}

std::vector<Partition> parts_of(const Graph& g, const CompileOptions& o = {},
                                std::vector<PatternTrial>* trials = nullptr) {
  auto parts = partition_graph(g, o, trials);
  EXPECT_TRUE(parts.ok()) << parts.status().to_string();
  return parts.ok() ? *parts : std::vector<Partition>{};
}

// The answer of `pattern` at op `op_id`.
std::string answer(const std::vector<PatternTrial>& trials, int64_t op_id,
                   const std::string& pattern) {
  for (const PatternTrial& t : trials) {
    if (t.op_id == op_id && t.pattern == pattern)
      return t.result.ok() ? "matched" : t.result.message();
  }
  return "not tried";
}

TEST(Partitioner, JitPatternTakesAProducerOnEitherPort) {
  for (OpKind kind : {OpKind::kReLUBackward, OpKind::kAdd}) {
    for (int port : {0, 1}) {
      const auto parts = parts_of(chain(kind, port));
      ASSERT_EQ(parts.size(), 1u);
      const Partition& p = parts[0];
      EXPECT_EQ(p.ops_string(), std::string(op_kind_name(kind)) + "+BatchNormTrainingBackward");
      EXPECT_EQ(p.backend, "jit");
      EXPECT_EQ(p.pattern, "jit.bn_bwd_producers");
      EXPECT_EQ(p.anchor(), 0);  // the batch norm (bn_bwd's op id)
      std::vector<int64_t> in_ids, out_ids;
      for (const auto& t : p.inputs) in_ids.push_back(t.id);
      for (const auto& t : p.outputs) out_ids.push_back(t.id);
      // The internal tensor 20 is neither an input nor an output of the partition.
      EXPECT_EQ(std::count(in_ids.begin(), in_ids.end(), 20), 0);
      EXPECT_EQ(out_ids, (std::vector<int64_t>{5, 6, 7}));
      EXPECT_EQ(in_ids.size(), 6u);  // 30, 31 and the batch norm's other four inputs
    }
  }
}

// The partition of `parts` that holds op `op_id`.
const Partition& holding(const std::vector<Partition>& parts, int64_t op_id) {
  for (const Partition& p : parts) {
    for (const Op& op : p.ops)
      if (op.id() == op_id) return p;
  }
  ADD_FAILURE() << "no partition holds op " << op_id;
  return parts.front();
}

bool writes(const Partition& p, int64_t tensor) {
  for (const LogicalTensor& lt : p.outputs)
    if (lt.id == tensor) return true;
  return false;
}

TEST(Partitioner, RulesThatKeepAProducerApartAreExplained) {
  // A second reader of the diff_dst producer's output: the JIT fuses it and
  // writes that output too (a side output); on src it stays apart.
  for (int port : {1, 0}) {
    Graph g = chain(OpKind::kReLUBackward, port, DataType::kF32, "NXC", false);
    Op other(2, OpKind::kReLU, "other");
    other.add_input(lt(20, DataType::kF32, {2, 5, 5, 24}))
        .add_output(lt(40, DataType::kF32, {2, 5, 5, 24}));
    ASSERT_TRUE(g.add_op(other).ok());
    ASSERT_TRUE(g.finalize().ok());
    std::vector<PatternTrial> trials;
    auto parts = parts_of(g, {}, &trials);
    if (port == 1) {
      ASSERT_EQ(parts.size(), 2u);
      EXPECT_EQ(answer(trials, 0, "jit.bn_bwd_producers"), "matched");
      EXPECT_EQ(holding(parts, 1).id, holding(parts, 0).id) << "the producer joins the batch norm";
      EXPECT_TRUE(writes(holding(parts, 0), 20)) << "the side output is a partition output";
      // ref runs producers only as their only reader.
      std::vector<PatternTrial> ref_trials;
      EXPECT_EQ(parts_of(g, CompileOptions{"ref"}, &ref_trials).size(), 3u);
      EXPECT_NE(answer(ref_trials, 0, "ref.bn_bwd_producers").find("tensor 20 has another reader"),
                std::string::npos);
    } else {
      ASSERT_EQ(parts.size(), 3u);
      EXPECT_EQ(answer(trials, 0, "jit.bn_bwd_producers"),
                "no producer to fuse (src: tensor 20 has another reader; diff_dst: tensor 1 is a "
                "graph input)");
      EXPECT_EQ(answer(trials, 0, "jit.bn_bwd"), "matched");
    }
  }
  // A graph output: the same, a side output on diff_dst, apart on src.
  std::vector<PatternTrial> trials;
  Graph h = chain(OpKind::kAdd, 1);
  h.set_output_ports({20, 5, 6, 7});
  ASSERT_TRUE(h.finalize().ok());
  auto fused = parts_of(h, {}, &trials);
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_TRUE(writes(fused[0], 20));
  Graph on_src = chain(OpKind::kAdd, 0);
  on_src.set_output_ports({20, 5, 6, 7});
  ASSERT_TRUE(on_src.finalize().ok());
  trials.clear();
  EXPECT_EQ(parts_of(on_src, {}, &trials).size(), 2u);
  EXPECT_NE(answer(trials, 0, "jit.bn_bwd_producers").find("tensor 20 is a graph output"),
            std::string::npos);
  // A tensor feeding both data ports.
  Graph both;
  const Graph single = chain(OpKind::kReLUBackward, 1);
  for (Op op : single.ops()) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) op.mutable_inputs()[0].id = 20;
    ASSERT_TRUE(both.add_op(op).ok());
  }
  ASSERT_TRUE(both.finalize().ok());
  trials.clear();
  EXPECT_EQ(parts_of(both, {}, &trials).size(), 2u);
  EXPECT_NE(
      answer(trials, 0, "jit.bn_bwd_producers").find("feeds 2 ports of BatchNormTrainingBackward"),
      std::string::npos)
      << answer(trials, 0, "jit.bn_bwd_producers");
  // A producer of another kind (TypeCast) is no ReLUBackward or Add.
  Graph cast_g;
  Op cast(1, OpKind::kTypeCast, "cast");
  cast.add_input(lt(30, DataType::kBF16, {2, 24})).add_output(lt(20, DataType::kF32, {2, 24}));
  Op bn = bn_bwd({2, 24}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  bn.mutable_inputs()[1].id = 20;
  ASSERT_TRUE(cast_g.add_op(cast).ok());
  ASSERT_TRUE(cast_g.add_op(bn).ok());
  ASSERT_TRUE(cast_g.finalize().ok());
  trials.clear();
  EXPECT_EQ(parts_of(cast_g, {}, &trials).size(), 2u);
  EXPECT_NE(answer(trials, 0, "jit.bn_bwd_producers").find("is not ReLUBackward or Add"),
            std::string::npos);
}

TEST(Partitioner, AFusedPatternTheJitDeclinesFallsToTheNextPattern) {
  // The producer reads a padded (strided) tensor: the JIT's kernel reads fused
  // operands in place and needs them dense, so its fused pattern is declined
  // by supports(); its single-op pattern takes the batch norm and the
  // producer goes to the next backend with a pattern for it.
  Graph g = chain(OpKind::kReLUBackward, 1, DataType::kF32, "NXC", false);
  Graph h;
  for (Op op : g.ops()) {
    if (op.kind() == OpKind::kReLUBackward) op.mutable_inputs()[0].strides = {3000, 600, 120, 1};
    ASSERT_TRUE(h.add_op(op).ok());
  }
  ASSERT_TRUE(h.finalize().ok());
  std::vector<PatternTrial> trials;
  const auto parts = parts_of(h, {}, &trials);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(answer(trials, 0, "jit.bn_bwd_producers"), "the JIT takes dense fused inputs");
  EXPECT_EQ(parts[1].pattern, "jit.bn_bwd");
  EXPECT_NE(parts[0].backend, "jit");
  // Forced to ref, the group stays whole (ref runs it op by op).
  const auto on_ref = parts_of(h, CompileOptions{"ref"});
  ASSERT_EQ(on_ref.size(), 1u);
  EXPECT_EQ(on_ref[0].pattern, "ref.bn_bwd_producers");
  // Fusion off: one partition per op.
  CompileOptions unfused;
  unfused.optimize = false;
  EXPECT_EQ(parts_of(chain(OpKind::kAdd, 0), unfused).size(), 2u);
}

TEST(Partitioner, AnOpNoPatternTakesIsUnsupportedWithEveryAnswer) {
  // Forced to the JIT, a ReLU has no pattern: unsupported, saying so.
  Graph g;
  Op relu(1, OpKind::kReLU, "relu");
  relu.add_input(lt(30, DataType::kF32, {24})).add_output(lt(2, DataType::kF32, {24}));
  ASSERT_TRUE(g.add_op(relu).ok());
  ASSERT_TRUE(g.finalize().ok());
  const auto parts = parts_of(g, CompileOptions{"jit"});
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_FALSE(parts[0].is_supported());
  EXPECT_EQ(parts[0].reason, "no pattern of backend 'jit' is anchored at ReLU");
  EXPECT_TRUE(parts_of(g)[0].is_supported());
}

TEST(Partitioner, AddingAPatternIsOneDeclaration) {
  // A pattern a test declares: two chained ReLUs as one partition of a
  // backend "test", ahead of everything else; ReLU -> ReLU -> ReLU gives the
  // first pair to it and the third ReLU to the next pattern.
  Graph g;
  for (int64_t k = 0; k < 3; ++k) {
    Op relu(k, OpKind::kReLU, "relu");
    relu.add_input(lt(10 + k, DataType::kF32, {8})).add_output(lt(11 + k, DataType::kF32, {8}));
    ASSERT_TRUE(g.add_op(relu).ok());
  }
  ASSERT_TRUE(g.finalize().ok());
  PartitionerOptions o;
  Pattern pair;
  pair.name = "relu_pair";
  pair.backend = "test";
  pair.anchors = {OpKind::kReLU};
  pair.fused = true;
  pair.match = [](const Graph& graph, const Op& first) -> StatusOr<PatternOps> {
    const Op* reader = sole_consumer(graph, first.outputs()[0].id);
    if (reader == nullptr || reader->kind() != OpKind::kReLU)
      return unimplemented("no ReLU reads it");
    return PatternOps{{{first.id(), FusionRole::kAnchor}, {reader->id(), FusionRole::kMember}}, ""};
  };
  o.patterns = {pair, single_op_pattern("op", "other", {OpKind::kReLU})};
  auto parts = match_partitions(g, o);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].pattern, "test.relu_pair");
  EXPECT_EQ((*parts)[0].ops_string(), "ReLU+ReLU");
  EXPECT_EQ((*parts)[0].outputs.size(), 1u);  // tensor 11 stays inside
  EXPECT_EQ((*parts)[1].pattern, "other.op");
  // With fusion off the pair is not tried.
  o.fuse = false;
  EXPECT_EQ(match_partitions(g, o)->size(), 3u);
}

TEST(Partitioner, AHandBuiltPartitionIsMatchedWhole) {
  // compile_partition on ops put together by hand: the pattern that takes
  // exactly them is found; ops no pattern takes together are refused.
  Graph g = chain(OpKind::kAdd, 1);
  Partition p;
  p.ops = g.ops().to_vector();
  p.inputs = {lt(30, DataType::kF32, {2, 5, 5, 24}), lt(31, DataType::kF32, {2, 5, 5, 24})};
  for (const LogicalTensor& t : g.ops().at(1).inputs()) {
    if (t.id != 20) p.inputs.push_back(t);
  }
  p.outputs = g.ops().at(1).outputs();
  auto cp = compile_partition(p, CompileOptions{});
  ASSERT_TRUE(cp.ok()) << cp.status().to_string();
  EXPECT_EQ((*cp)->partition().pattern, "jit.bn_bwd_producers");
  EXPECT_EQ((*cp)->partition().inputs[0].id, 30);  // the caller's port order is kept
  auto dnnl_only = compile_partition(p, CompileOptions{"dnnl"});
  if (find_backend("dnnl") != nullptr) {
    EXPECT_STATUS_HAS(dnnl_only.status(), "no pattern takes these ops as one partition");
  }
}

// The numbers do not change with fusion: the fused graph on ref gives the
// same bits as the unfused one (intermediates in their own dtype), and the
// JIT's fused kernel is within bf16's threshold of it.
TEST(Partitioner, FusedNumbersMatchTheUnfusedGraph) {
  for (OpKind kind : {OpKind::kReLUBackward, OpKind::kAdd}) {
    for (int port : {0, 1}) {
      Graph g = chain(kind, port, DataType::kBF16, "NCX");
      CompileOptions unfused{"ref"};
      unfused.optimize = false;
      auto plain = CompiledGraph::compile(g, unfused);
      auto fused = CompiledGraph::compile(g, CompileOptions{"ref"});
      ASSERT_TRUE(plain.ok() && fused.ok());
      ASSERT_EQ(plain->partitions().size(), 2u);
      ASSERT_EQ(fused->partitions().size(), 1u);
      auto inputs = oracle::make_inputs(plain->graph(), plain->lowered_graph(), "", 7, nullptr);
      ASSERT_TRUE(inputs.ok());
      auto a = testing_util::run_outputs(*plain, *inputs);
      auto b = testing_util::run_outputs(*fused, *inputs);
      ASSERT_TRUE(a.ok() && b.ok());
      for (const auto& [id, buf] : *a) EXPECT_TRUE(buf.bytes == b->at(id).bytes) << id;
      const auto r = testing_util::compare_with_ref(g, "jit", 4);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find(port == 0 ? "+src_" : "+diff_dst_"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
  }
}

// BatchNormForwardTraining -> Add -> ReLU where the Add's other input comes
// from the same batch norm's batch_mean: fusing the three would need the
// other Add before and after the partition. The partitioner declines it, the
// plan runs, and every backend's numbers are ref's.
constexpr const char* kPathBack = R"(
%10:f32[2,4,4,8], %11:f32[8], %12:f32[8], %13:f32[8], %14:f32[8] = BatchNormForwardTraining#1 "bn_fwd"(%0:f32[2,4,4,8], %1:f32[8], %2:f32[8], %3:f32[8], %4:f32[8]) {data_format="NXC", epsilon=0.001f, momentum=0.1f}
%20:f32[2,4,4,8] = Add#2 "mean_plus"(%5:f32[2,4,4,8], %13:f32[8])
%21:f32[2,4,4,8] = Add#3 "residual"(%10:f32[2,4,4,8], %20:f32[2,4,4,8])
%22:f32[2,4,4,8] = ReLU#4 "relu"(%21:f32[2,4,4,8])
)";

TEST(Partitioner, AMatchWithAPathBackIsDeclinedAndThePlanRuns) {
  auto g = graph_from_text(kPathBack);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(g->finalize().ok());
  std::vector<PatternTrial> trials;
  const auto parts = parts_of(*g, {}, &trials);
  for (const Partition& p : parts) EXPECT_LE(p.ops.size(), 1u) << p.pattern;
  bool explained = false;
  for (const PatternTrial& t : trials)
    explained = explained || t.result.message().find("not convex") != std::string::npos;
  EXPECT_TRUE(explained);
  EXPECT_TRUE(check_partition_order(*g, parts).ok());
  for (const char* backend : {"auto", "ref"}) {  // the JIT alone has no Add or ReLU
    const auto r = testing_util::compare_with_ref(*g, backend, 3);
    ASSERT_TRUE(r.status.ok()) << backend << ": " << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << backend << ": " << r.report;
  }
}

// A plan whose partitions read each other is refused before anything runs.
TEST(Partitioner, APartitionOrderWithACycleIsAnInternalError) {
  auto g = graph_from_text(kPathBack);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->finalize().ok());
  // The fusion the partitioner declines, built by hand: {1, 3, 4} and {2}.
  std::vector<Partition> parts = {make_partition(*g, {1, 3, 4}), make_partition(*g, {2})};
  const Status s = check_partition_order(*g, parts);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.to_string();
  EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.message();
  std::swap(parts[0], parts[1]);
  EXPECT_FALSE(check_partition_order(*g, parts).ok());  // either order: a cycle
}

// Sibling batch norms (jit.bn_bwd_siblings): the ReLUBackward and both
// batch norms in one partition. A reader of the first's diff_src that the
// graph's order puts before the second (a convolution's backward in a
// captured graph) is moved after the partition; a reader that leads into
// the second batch norm is a real cycle, and the siblings are declined.
TEST(Partitioner, SiblingBatchNormsMoveAnEarlyReaderOrDeclineACycle) {
  const Dims shape = {2, 24, 5, 5};
  for (bool cycle : {false, true}) {
    Graph g = testing_util::bn_bwd_siblings(shape, "NCX", DataType::kF32);
    Graph h;
    Op reader(9, OpKind::kReLU, "reads_diff_src");
    reader.add_input(lt(5, DataType::kF32, shape))
        .add_output(lt(cycle ? 40 : 60, DataType::kF32, shape));
    for (const Op& op : g.ops()) {
      if (op.id() == 4) {
        ASSERT_TRUE(h.add_op(reader).ok());  // before the second batch norm
      }
      ASSERT_TRUE(h.add_op(op).ok());
    }
    ASSERT_TRUE(h.finalize().ok());
    SCOPED_TRACE(cycle ? "the reader writes the second's src" : "the reader is only early");
    std::vector<PatternTrial> trials;
    const auto parts = parts_of(h, {}, &trials);
    EXPECT_TRUE(check_partition_order(h, parts).ok());
    const Partition& first = holding(parts, 2);
    if (!cycle) {
      EXPECT_EQ(first.pattern, "jit.bn_bwd_siblings");
      EXPECT_EQ(first.ops_string(),
                "ReLUBackward+BatchNormTrainingBackward+BatchNormTrainingBackward");
      ASSERT_NE(first.bound(FusionRole::kSibling), nullptr);
      EXPECT_EQ(first.bound(FusionRole::kSibling)->id(), 4);
      EXPECT_EQ(first.anchor(), 2);
      EXPECT_GT(holding(parts, 9).id, first.id) << "the early reader runs after the siblings";
      EXPECT_TRUE(writes(first, 5) && writes(first, 45)) << "both batch norms' outputs leave";
      EXPECT_FALSE(writes(first, 20)) << "the shared gradient stays inside";
    } else {
      EXPECT_NE(answer(trials, 2, "jit.bn_bwd_siblings").find("not convex"), std::string::npos)
          << answer(trials, 2, "jit.bn_bwd_siblings");
      EXPECT_EQ(first.pattern, "jit.bn_bwd_producers");
      EXPECT_TRUE(writes(first, 20)) << "the first batch norm writes the gradient as a side output";
      EXPECT_NE(holding(parts, 4).id, first.id);
    }
  }
}

}  // namespace
}  // namespace normgrad
