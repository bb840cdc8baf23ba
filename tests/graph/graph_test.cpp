// Graph: add_op and finalize rules (duplicates, producers, metadata, cycles,
// dangling inputs) and shape inference through unknown dims.
#include <random>
#include <set>

#include <normgrad/graph/graph.hpp>

#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

Op relu(int64_t id, int64_t in, int64_t out, Dims dims = {2, 3}) {
  Op op(id, OpKind::kReLU, "relu" + std::to_string(id));
  op.add_input(lt(in, DataType::kF32, dims)).add_output(lt(out, DataType::kF32, dims));
  return op;
}

TEST(Graph, DuplicateOpIdIsRejectedAtOnce) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  EXPECT_STATUS_HAS(g.add_op(relu(1, 1, 2)), "op id 1 is already used by ReLU 'relu1'");
}

TEST(Graph, TwoProducers) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 5)).ok());
  ASSERT_TRUE(g.add_op(relu(2, 1, 5)).ok());
  EXPECT_STATUS_HAS(g.finalize(), "tensor 5 is produced by both op 1");
}

TEST(Graph, ConflictingMetadata) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  Op b = relu(2, 1, 2);
  b.mutable_inputs()[0].dims = {2, 4};
  b.mutable_outputs()[0].dims = {2, 4};
  ASSERT_TRUE(g.add_op(b).ok());
  EXPECT_STATUS_HAS(g.finalize(), "tensor 1 has conflicting shapes: 2x3 and 2x4");
  Graph h;
  ASSERT_TRUE(h.add_op(relu(1, 0, 1)).ok());
  Op c(2, OpKind::kReLU, "r");
  c.add_input(lt(1, DataType::kBF16, {2, 3})).add_output(lt(2, DataType::kBF16, {2, 3}));
  ASSERT_TRUE(h.add_op(c).ok());
  EXPECT_STATUS_HAS(h.finalize(), "tensor 1 has conflicting dtypes: f32 and bf16");
}

TEST(Graph, Cycles) {
  Graph self;
  ASSERT_TRUE(self.add_op(relu(1, 3, 3)).ok());
  EXPECT_STATUS_HAS(self.finalize(), "consumes its own output tensor 3");
  Graph loop;
  ASSERT_TRUE(loop.add_op(relu(1, 10, 11)).ok());
  ASSERT_TRUE(loop.add_op(relu(2, 11, 10)).ok());
  EXPECT_STATUS_HAS(loop.finalize(), "cycle among op 1");
}

TEST(StatusOr, ValueOnAnErrorAbortsWithTheMessageInEveryBuild) {
  StatusOr<int> bad = invalid_argument("no such tensor");
  EXPECT_DEATH((void)bad.value(), "value\\(\\) on a failed StatusOr: .*no such tensor");
  StatusOr<int> good = 3;
  EXPECT_EQ(good.value(), 3);
}

TEST(Op, SetAttrLiteralsTakeTheSchemaType) {
  Op op(0, OpKind::kBatchNormTrainingBackward, "bn");
  op.set_attr("epsilon", 1e-5);  // double literal: f32
  EXPECT_EQ(attr_value_kind(op.attrs().at("epsilon")), AttrKind::kF32);
  EXPECT_EQ(*op.attr_f32("epsilon"), 1e-5f);
  op.set_attr("epsilon", 0);  // int literal on an f32 attribute: converted exactly
  EXPECT_EQ(attr_value_kind(op.attrs().at("epsilon")), AttrKind::kF32);
  EXPECT_EQ(*op.attr_f32("epsilon"), 0.0f);
  op.set_attr("epsilon", int64_t{16777217});  // 2^24 + 1 has no f32: stays s64, refused later
  EXPECT_EQ(attr_value_kind(op.attrs().at("epsilon")), AttrKind::kS64);
  op.set_attr("data_format", "NCX");  // a string, not the bool a const char* would become
  EXPECT_EQ(*op.attr_string("data_format"), "NCX");
  op.set_attr("is_training", false);
  EXPECT_EQ(attr_value_kind(op.attrs().at("is_training")), AttrKind::kBool);
  Op conv(1, OpKind::kConvolution, "conv");  // opaque: integers stay s64
  conv.set_attr("groups", 4);
  EXPECT_EQ(*conv.attr_s64("groups"), 4);
}

TEST(Graph, IncompletePortsAreToleratedAndNoted) {
  // oneDNN's own inputs list fewer ports than the graph reads, or name a port
  // no op produces: such graphs load (as oneDNN loads them) and the slip is noted.
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  ASSERT_TRUE(g.add_op(relu(2, 7, 2)).ok());
  g.set_input_ports({7});
  ASSERT_TRUE(g.finalize().ok());
  ASSERT_EQ(g.graph_inputs().size(), 2u);  // the port first, then the unlisted reader's input
  EXPECT_EQ(g.graph_inputs()[0].id, 7);
  EXPECT_EQ(g.graph_inputs()[1].id, 0);
  EXPECT_TRUE(g.notes().empty());
  g.set_input_ports({0, 7, 30});
  g.set_output_ports({9, 1});
  ASSERT_TRUE(g.finalize().ok());
  ASSERT_EQ(g.notes().size(), 2u);
  EXPECT_EQ(g.notes()[0], "input port 30 names no tensor of the graph: ignored");
  EXPECT_EQ(g.notes()[1], "output port 9 is not produced by any op: ignored");
  ASSERT_EQ(g.graph_outputs().size(), 1u);
  EXPECT_EQ(g.graph_outputs()[0].id, 1);
  g.set_input_ports({2});
  EXPECT_STATUS_HAS(g.finalize(), "input port 2 is produced by op 2");
  g.set_input_ports({0, 7});
  g.set_output_ports({1, 2});
  EXPECT_TRUE(g.finalize().ok());
  Graph empty;
  EXPECT_STATUS_HAS(empty.finalize(), "the graph has no ops");
}

TEST(Graph, InfersUnknownShapesAndOrdersTopologically) {
  Graph g;
  // Added consumer first, with unknown dims everywhere except the graph inputs.
  Op bn = bn_bwd({2, 3, 4, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  bn.mutable_inputs()[1] =
      lt(20, DataType::kF32, {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
  for (auto& out : bn.mutable_outputs()) {
    out.dims = {};
    out.rank_unknown = true;
  }
  ASSERT_TRUE(g.add_op(bn).ok());
  Op r(9, OpKind::kReLUBackward, "rb");
  r.add_input(lt(30, DataType::kF32, {2, 3, 4, 4})).add_input(lt(31, DataType::kF32, {2, 3, 4, 4}));
  LogicalTensor unknown_rank = lt(20, DataType::kF32, {});
  unknown_rank.rank_unknown = true;
  r.add_output(unknown_rank);
  ASSERT_TRUE(g.add_op(r).ok());
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_EQ(g.ops().at(0).kind(), OpKind::kReLUBackward);
  EXPECT_EQ(g.find_tensor(20)->dims, (Dims{2, 3, 4, 4}));
  EXPECT_EQ(g.find_tensor(6)->dims, (Dims{3}));
  EXPECT_EQ(g.ops().at(1).inputs()[1].dims, (Dims{2, 3, 4, 4}));
  EXPECT_EQ(g.graph_inputs().size(), 6u);  // src 0, mean 2, variance 3, gamma 4, and 30, 31
  EXPECT_EQ(g.graph_outputs().size(), 3u);
}

TEST(Graph, UnknownGraphInputShapeIsAnErrorOnlyWhenShapesAreNeeded) {
  // Partitioning works without shapes (as in oneDNN Graph); compiling needs them.
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1, {kUnknownDim, 3})).ok());
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_STATUS_HAS(g.unknown_shape_error(g.ops().at(0)),
                    "has unknown shape ?x3; graph inputs need concrete shapes");
}

TEST(Graph, ShapeRulesFireAfterPropagation) {
  // The producer makes 2x5x4x4 while the batch norm's stats say C = 3.
  Graph g;
  Op bn = bn_bwd({2, 3, 4, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  bn.mutable_inputs()[0] =
      lt(40, DataType::kF32, {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
  bn.mutable_inputs()[1] =
      lt(41, DataType::kF32, {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
  ASSERT_TRUE(g.add_op(bn).ok());
  ASSERT_TRUE(g.add_op(relu(1, 50, 40, {2, 5, 4, 4})).ok());
  ASSERT_TRUE(g.add_op(relu(2, 51, 41, {2, 5, 4, 4})).ok());
  EXPECT_STATUS_HAS(g.finalize(), "input 2 'mean' has 3 elements, expected C=5");
}

}  // namespace
}  // namespace normgrad

namespace normgrad {
namespace {

Graph relu_chain() {  // %0 -> ReLU#1 -> %1 -> ReLU#2 -> %2
  Graph g;
  Op a(1, OpKind::kReLU, "a");
  a.add_input(LogicalTensor(0, DataType::kF32, {4}))
      .add_output(LogicalTensor(1, DataType::kF32, {4}));
  Op b(2, OpKind::kReLU, "b");
  b.add_input(LogicalTensor(1, DataType::kF32, {4}))
      .add_output(LogicalTensor(2, DataType::kF32, {4}));
  EXPECT_TRUE(g.add_op(a).ok());
  EXPECT_TRUE(g.add_op(b).ok());
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

// A graph derived with with_ops is not finalized; its queries answer for the
// ops as they are, not from the original's maps.
TEST(Graph, QueriesAnswerForTheOpsOfADerivedGraph) {
  const Graph original = relu_chain();
  EXPECT_EQ(original.producer(2)->id(), 2);
  EXPECT_EQ(original.value(1)->producer, 1);
  std::vector<Op> ops = original.ops().to_vector();
  ops.erase(ops.begin());  // the first ReLU goes: tensor 1 has no producer now
  const Graph g = original.with_ops(std::move(ops));
  EXPECT_FALSE(g.finalized());
  EXPECT_EQ(g.producer(1), nullptr);
  EXPECT_EQ(g.producer(2)->id(), 2);
  ASSERT_EQ(g.uses(1).size(), 1u);
  EXPECT_EQ(g.uses(1)[0].op_id, 2);
  ASSERT_NE(g.find_tensor(2), nullptr);
  EXPECT_EQ(g.find_tensor(0), nullptr);
  // The value of tensor 1 as the ops now say: no producer, read by ReLU#2 on port 0.
  const auto v = g.value(1);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->producer, -1);
  ASSERT_EQ(v->uses.size(), 1u);
  EXPECT_EQ(v->uses[0].op_id, 2);
  EXPECT_FALSE(g.value(0).has_value());
}

// A value is one object per tensor: its producer and output port, and every
// use with its port (an op reading it twice is two uses).
TEST(Graph, ValuesHaveTheirProducerAndUses) {
  Graph g;
  Op relu(1, OpKind::kReLU, "r");
  relu.add_input(LogicalTensor(0, DataType::kF32, {4}))
      .add_output(LogicalTensor(1, DataType::kF32, {4}));
  Op add(2, OpKind::kAdd, "twice");
  add.add_input(LogicalTensor(1, DataType::kF32, {4}))
      .add_input(LogicalTensor(1, DataType::kF32, {4}))
      .add_output(LogicalTensor(2, DataType::kF32, {kUnknownDim}));
  ASSERT_TRUE(g.add_op(add).ok());
  ASSERT_TRUE(g.add_op(relu).ok());
  ASSERT_TRUE(g.finalize().ok());
  const auto v = g.value(1);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->producer, 1);
  EXPECT_EQ(v->producer_port, 0u);
  ASSERT_EQ(v->uses.size(), 2u);
  EXPECT_EQ(v->uses[0].op_id, 2);
  EXPECT_EQ(v->uses[0].port, 0u);
  EXPECT_EQ(v->uses[1].port, 1u);
  EXPECT_EQ(g.op(g.uses(1)[0].op_id), &g.ops().at(1));  // the Add, after the sort
  EXPECT_EQ(g.value(2)->desc.dims, (Dims{4}));          // inferred into the value
  EXPECT_EQ(g.value(0)->producer, -1);
}

// The rewriter keeps the graph finalized and its queries current, and refuses
// (leaving the graph as it was) what would break it.
TEST(GraphRewriter, EditsKeepQueriesCurrentAndRefuseBrokenOrders) {
  Graph g = relu_chain();
  EXPECT_STATUS_HAS(g.erase_op(1), "still reads tensor 1");
  // A second reader of %0, inserted before b, then b reads its output instead of a's.
  Op c(3, OpKind::kReLU, "c");
  c.add_input(LogicalTensor(0, DataType::kF32, {4}))
      .add_output(LogicalTensor(3, DataType::kF32, {4}));
  ASSERT_TRUE(g.insert_op(c, 2).ok());
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.producer(3), &g.ops().at(1));
  EXPECT_EQ(g.uses(0).size(), 2u);
  ASSERT_TRUE(g.replace_all_uses_with(1, LogicalTensor(3, DataType::kF32, {4})).ok());
  EXPECT_TRUE(g.uses(1).empty());
  EXPECT_TRUE(g.value(1)->uses.empty());  // the use moved to %3's value, with its port
  ASSERT_EQ(g.value(3)->uses.size(), 1u);
  EXPECT_EQ(g.value(3)->uses[0].op_id, 2);
  ASSERT_TRUE(g.erase_op(1).ok());  // a is dead now
  EXPECT_EQ(g.order_of(1), -1);
  EXPECT_EQ(g.producer(2), &g.ops().at(1));
  EXPECT_EQ(g.find_tensor(1), nullptr);
  // Reading a tensor before it is written is refused, and nothing changes.
  Op d(4, OpKind::kReLU, "d");
  d.add_input(LogicalTensor(2, DataType::kF32, {4}))
      .add_output(LogicalTensor(4, DataType::kF32, {4}));
  EXPECT_STATUS_HAS(g.insert_op(d, 3), "before ReLU 'b' writes it");
  EXPECT_EQ(g.ops().size(), 2u);
  EXPECT_TRUE(g.finalized());
  EXPECT_STATUS_HAS(g.replace_all_uses_with(3, LogicalTensor(2, DataType::kF32, {4})),
                    "consumes its own output tensor 2");
  EXPECT_EQ(g.uses(3).size(), 1u);
  // replace_op keeps the position; a schema violation is refused.
  Op bad(2, OpKind::kReLU, "b2");
  bad.add_input(LogicalTensor(3, DataType::kF32, {4}))
      .add_output(LogicalTensor(2, DataType::kF16, {4}));
  EXPECT_FALSE(g.replace_op(2, bad).ok());
  Op good(2, OpKind::kReLUBackward, "b3");
  good.add_input(LogicalTensor(0, DataType::kF32, {4}))
      .add_input(LogicalTensor(3, DataType::kF32, {4}))
      .add_output(LogicalTensor(2, DataType::kF32, {4}));
  ASSERT_TRUE(g.replace_op(2, good).ok());
  EXPECT_EQ(g.ops().at(1).kind(), OpKind::kReLUBackward);
  EXPECT_TRUE(g.finalize().ok());  // and the full check agrees
}

// cut_op removes an op that others still read: its output becomes a graph
// input, on a finalized graph as after a fresh finalize.
TEST(GraphRewriter, CutOpTurnsWhatItWroteIntoAGraphInput) {
  Graph g = relu_chain();
  ASSERT_TRUE(g.cut_op(1).ok());
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.producer(1), nullptr);
  ASSERT_EQ(g.graph_inputs().size(), 1u);
  EXPECT_EQ(g.graph_inputs()[0].id, 1);
  EXPECT_EQ(g.find_tensor(0), nullptr);  // read by nothing now
  EXPECT_TRUE(g.check_against_rebuild().ok());
  EXPECT_STATUS_HAS(g.cut_op(1), "no op 1");
}

// update_tensors re-describes tensors everywhere they appear; a finalized
// graph is finalized again (shapes re-inferred), an id change is refused.
TEST(GraphRewriter, UpdateTensorsRedescribesAndReinfers) {
  Graph g = relu_chain();
  ASSERT_TRUE(g.update_tensors([](LogicalTensor& lt) {
                 lt.dims = {6};
                 lt.dtype = DataType::kBF16;
               }).ok());
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.value(2)->desc.dims, (Dims{6}));
  EXPECT_EQ(g.value(1)->desc.dtype, DataType::kBF16);
  EXPECT_TRUE(g.check_against_rebuild().ok());
  // Inconsistent descriptions are refused by the finalize that follows, and
  // so is an id change; either way the graph is left as it was.
  EXPECT_FALSE(g.update_tensors([](LogicalTensor& lt) {
                  if (lt.id == 1) lt.dims = {5};
                }).ok());
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.value(1)->desc.dims, (Dims{6}));
  EXPECT_EQ(g.ops().at(1).inputs()[0].dims, (Dims{6}));
  EXPECT_TRUE(g.check_against_rebuild().ok());
  EXPECT_STATUS_HAS(g.update_tensors([](LogicalTensor& lt) {
    lt.dims = {7};
    if (lt.id == 2) lt.id = 12;
  }),
                    "not its id");
  EXPECT_EQ(g.ops().at(0).inputs()[0].dims, (Dims{6}));
  EXPECT_EQ(g.ops().at(1).outputs()[0].dims, (Dims{6}));
  EXPECT_TRUE(g.check_against_rebuild().ok());
}

// The edits keep the maps by updating only what they touch. After every
// edit of a long random sequence, accepted or refused, every query answers
// as the same ops finalized from scratch answer.
void expect_same_queries(const Graph& g, int step) {
  EXPECT_TRUE(g.check_against_rebuild().ok()) << "step " << step;
  Graph fresh = g.with_ops(g.ops().to_vector());
  ASSERT_TRUE(fresh.finalize().ok()) << "step " << step;
  ASSERT_EQ(fresh.ops().size(), g.ops().size());
  std::set<int64_t> ids;
  auto in_fresh = fresh.ops().begin();
  int64_t last_key = -1;
  for (const Op& op : g.ops()) {
    // The same order, and order keys that grow along it (they need not match).
    EXPECT_EQ((in_fresh++)->id(), op.id()) << "step " << step;
    EXPECT_GT(g.order_of(op.id()), last_key) << "step " << step;
    last_key = g.order_of(op.id());
    for (const auto* ports : {&op.inputs(), &op.outputs()})
      for (const LogicalTensor& t : *ports) ids.insert(t.id);
  }
  for (int64_t id : ids) {
    const auto a = g.value(id), b = fresh.value(id);
    ASSERT_TRUE(a && b) << "step " << step << " tensor " << id;
    EXPECT_EQ(a->producer, b->producer) << "step " << step << " tensor " << id;
    EXPECT_EQ(a->desc.dims, b->desc.dims) << "step " << step << " tensor " << id;
    ASSERT_EQ(a->uses.size(), b->uses.size()) << "step " << step << " tensor " << id;
    for (size_t u = 0; u < a->uses.size(); ++u) {
      EXPECT_EQ(a->uses[u].op_id, b->uses[u].op_id) << "step " << step << " tensor " << id;
      EXPECT_EQ(a->uses[u].port, b->uses[u].port) << "step " << step << " tensor " << id;
    }
  }
  std::vector<int64_t> in_a, in_b;
  for (const LogicalTensor& t : g.graph_inputs()) in_a.push_back(t.id);
  for (const LogicalTensor& t : fresh.graph_inputs()) in_b.push_back(t.id);
  EXPECT_EQ(in_a, in_b) << "step " << step;
}

TEST(GraphRewriter, IncrementalMapsMatchAFreshFinalizeOverRandomEdits) {
  std::mt19937 rng(11);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto t = [](int64_t id) { return LogicalTensor(id, DataType::kF32, {4}); };
  Graph g;
  for (int64_t i = 1; i <= 40; ++i) {  // ReLUs and Adds over earlier tensors
    Op op(i, i % 3 == 0 ? OpKind::kAdd : OpKind::kReLU, "op" + std::to_string(i));
    op.add_input(t(static_cast<int64_t>(rng() % i)));
    if (op.kind() == OpKind::kAdd) op.add_input(t(static_cast<int64_t>(rng() % i)));
    op.add_output(t(i));
    ASSERT_TRUE(g.add_op(op).ok());
  }
  ASSERT_TRUE(g.finalize().ok());
  int accepted = 0, refused = 0;
  for (int step = 0; step < 400; ++step) {
    const auto& ops = g.ops();
    const Op& victim = ops.at(pick(ops.size()));
    // A tensor the graph has: an op's output or input.
    const Op& other = ops.at(pick(ops.size()));
    const int64_t some = pick(2) ? other.outputs()[0].id : other.inputs()[0].id;
    Status s;
    switch (pick(4)) {
      case 0: {  // the victim reads another tensor
        Op r = victim;
        r.mutable_inputs()[pick(r.inputs().size())] = t(some);
        s = g.replace_op(victim.id(), r);
        break;
      }
      case 1: {  // a new ReLU of some tensor, somewhere
        Op n(g.new_op_id(), OpKind::kReLU, "new");
        n.add_input(t(some)).add_output(t(g.new_tensor_id()));
        s = g.insert_op(n, pick(3) ? victim.id() : -1);
        break;
      }
      case 2:
        s = g.erase_op(victim.id());
        break;
      default:
        s = g.replace_all_uses_with(victim.outputs()[0].id, t(some));
    }
    (s.ok() ? accepted : refused)++;
    ASSERT_TRUE(g.finalized()) << "step " << step << ": " << s.to_string();
    expect_same_queries(g, step);
    if (::testing::Test::HasFailure()) return;
    if (g.ops().size() < 5) break;
  }
  EXPECT_GT(accepted, 50);
  EXPECT_GT(refused, 20);
}

}  // namespace
}  // namespace normgrad
