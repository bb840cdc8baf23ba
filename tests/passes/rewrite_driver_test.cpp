// The op list's O(1) edits and order keys, and the greedy rewrite driver:
// what it visits, that one run reaches the fixed point, that patterns which
// never settle are an error, and that the graph's listener is put back.
#include <normgrad/passes/rewrite_driver.hpp>

#include <algorithm>
#include <random>

#include <normgrad/graph/text_io.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::lt;

Op relu(int64_t id, int64_t in, int64_t out) {
  Op op(id, OpKind::kReLU, "r" + std::to_string(id));
  op.add_input(lt(in, DataType::kF32, {4})).add_output(lt(out, DataType::kF32, {4}));
  return op;
}

std::vector<int64_t> ids(const Graph& g) {
  std::vector<int64_t> v;
  for (const Op& op : g.ops()) v.push_back(op.id());
  return v;
}

// Many inserts at one place run the keys out of room; the list keys itself
// again and the order (and the keys' order) stays right, as do addresses.
TEST(OpList, KeysStayOrderedThroughInsertsAtOnePlace) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  ASSERT_TRUE(g.add_op(relu(2, 1, 2)).ok());
  ASSERT_TRUE(g.finalize().ok());
  const Op* first = g.op(1);
  // 200 ReLUs of tensor 1 between op 1 and op 2, each inserted right before
  // the one inserted last: more than the 32 halvings a gap allows.
  int64_t before = 2;
  for (int64_t k = 0; k < 200; ++k) {
    const int64_t id = 100 + k;
    ASSERT_TRUE(g.insert_op(relu(id, 1, 1000 + k), before).ok()) << k;
    before = id;
  }
  EXPECT_EQ(g.op(1), first);  // no op moved
  ASSERT_EQ(g.ops().size(), 202u);
  std::vector<int64_t> want = {1};
  for (int64_t k = 199; k >= 0; --k) want.push_back(100 + k);
  want.push_back(2);
  EXPECT_EQ(ids(g), want);
  int64_t last = -1;
  for (const Op& op : g.ops()) {
    EXPECT_GT(g.order_of(op.id()), last);
    last = g.order_of(op.id());
  }
  EXPECT_EQ(g.order_of(12345), -1);
  EXPECT_TRUE(g.check_against_rebuild().ok());
  // A copy is its own list: edits of one leave the other alone.
  Graph copy = g;
  ASSERT_TRUE(copy.erase_op(150).ok());
  EXPECT_EQ(copy.ops().size(), 201u);
  EXPECT_EQ(g.ops().size(), 202u);
  EXPECT_NE(g.op(150), nullptr);
  EXPECT_NE(copy.op(1), g.op(1));
  EXPECT_TRUE(copy.check_against_rebuild().ok());
}

// with_ops takes any list; finalize names a repeated op id.
TEST(OpList, RepeatedIdsAreRefusedAtFinalize) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  Graph twice = g.with_ops({relu(1, 0, 1), relu(1, 1, 2)});
  EXPECT_STATUS_HAS(twice.finalize(), "op id 1 is used twice");
}

// A chain of 2,000 ReLUs of which only the first op's output is a graph
// output: the 1,999 after it are dead, last first. They go in one run, and
// each op is visited a bounded number of times.
TEST(RewriteDriver, OneRunReachesTheFixedPointOnADeadChain) {
  constexpr int64_t kOps = 2000;
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  for (int64_t i = 2; i <= kOps; ++i) ASSERT_TRUE(g.add_op(relu(i, i - 1, i)).ok());
  g.set_output_ports({1});  // only the first op's output is observed
  ASSERT_TRUE(g.finalize().ok());
  RewritePattern erase{
      "erase-unread", {OpKind::kReLU}, [](Graph& graph, const Op& op) -> StatusOr<bool> {
        const int64_t out = op.outputs()[0].id;
        if (!graph.uses(out).empty() || out == 1) return false;
        NG_RETURN_IF_ERROR(graph.erase_op(op.id()));
        return true;
      }};
  RewriteStats stats;
  auto changed = apply_patterns_greedily(g, {erase}, &stats);
  ASSERT_TRUE(changed.ok()) << changed.status().to_string();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(g.ops().size(), 1u);
  EXPECT_EQ(stats.rewrites, kOps - 1);
  // Each op is visited at first and once more when its reader goes.
  EXPECT_LE(stats.visits, 2 * kOps + 1);
  EXPECT_TRUE(g.check_against_rebuild().ok());
  // A second run finds nothing.
  auto again = apply_patterns_greedily(g, {erase});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

// Two patterns that undo each other never settle: an error, not a hang.
TEST(RewriteDriver, PatternsThatNeverSettleAreAnError) {
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  ASSERT_TRUE(g.finalize().ok());
  RewritePattern flip{"flip", {OpKind::kReLU}, [](Graph& graph, const Op& op) -> StatusOr<bool> {
                        Op other = op;
                        other.set_name(op.name() == "a" ? "b" : "a");
                        NG_RETURN_IF_ERROR(graph.replace_op(op.id(), other));
                        return true;
                      }};
  auto r = apply_patterns_greedily(g, {flip}, nullptr, 50);
  EXPECT_STATUS_HAS(r.status(), "rewrite pattern 'flip' still fires after 50 rewrites");
  EXPECT_TRUE(g.check_against_rebuild().ok());
}

// The driver listens only while it runs, and puts back a listener it found.
TEST(RewriteDriver, ListenerIsPutBackAndToldOfEveryEdit) {
  struct Counter final : EditListener {
    int inserted = 0, erased = 0, replaced = 0, uses = 0;
    void op_inserted(const Op&) override { ++inserted; }
    void op_erased(const Op&) override { ++erased; }
    void op_replaced(const Op&, const Op&) override { ++replaced; }
    void uses_replaced(int64_t, int64_t) override { ++uses; }
  } counter;
  Graph g;
  ASSERT_TRUE(g.add_op(relu(1, 0, 1)).ok());
  ASSERT_TRUE(g.add_op(relu(2, 1, 2)).ok());
  ASSERT_TRUE(g.finalize().ok());
  g.set_listener(&counter);
  RewritePattern none{"none", {}, [](Graph&, const Op&) -> StatusOr<bool> { return false; }};
  ASSERT_TRUE(apply_patterns_greedily(g, {none}).ok());
  EXPECT_EQ(g.set_listener(&counter), &counter);
  ASSERT_TRUE(g.insert_op(relu(3, 1, 3), 2).ok());
  ASSERT_TRUE(g.replace_all_uses_with(3, lt(1, DataType::kF32, {4})).ok());
  ASSERT_TRUE(g.erase_op(3).ok());
  Op renamed = *g.op(2);
  renamed.set_name("x");
  ASSERT_TRUE(g.replace_op(2, renamed).ok());
  // A refused edit (a second producer of tensor 2) reports nothing.
  EXPECT_FALSE(g.insert_op(relu(4, 0, 2)).ok());
  EXPECT_EQ(counter.inserted, 1);
  EXPECT_EQ(counter.uses, 1);
  EXPECT_EQ(counter.erased, 1);
  EXPECT_EQ(counter.replaced, 1);
  g.set_listener(nullptr);
}

// Random edits through the driver: a pattern that erases ReLUs whose output
// nobody reads, on random DAGs; the result matches a repeated naive walk.
TEST(RewriteDriver, MatchesANaiveFixedPointOnRandomGraphs) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    Graph g;
    const int64_t n = 60;
    for (int64_t i = 1; i <= n; ++i) ASSERT_TRUE(g.add_op(relu(i, rng() % i, i)).ok());
    g.set_output_ports({static_cast<int64_t>(1 + rng() % n), static_cast<int64_t>(1 + rng() % n)});
    ASSERT_TRUE(g.finalize().ok());
    Graph naive = g;
    auto dead = [](const Graph& graph, const Op& op) {
      const int64_t out = op.outputs()[0].id;
      const auto& ports = *graph.output_ports();
      return graph.uses(out).empty() && std::find(ports.begin(), ports.end(), out) == ports.end();
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (const Op& op : naive.ops().to_vector()) {
        if (dead(naive, op)) {
          ASSERT_TRUE(naive.erase_op(op.id()).ok());
          changed = true;
        }
      }
    }
    RewritePattern erase{"erase", {}, [&](Graph& graph, const Op& op) -> StatusOr<bool> {
                           if (!dead(graph, op)) return false;
                           NG_RETURN_IF_ERROR(graph.erase_op(op.id()));
                           return true;
                         }};
    ASSERT_TRUE(apply_patterns_greedily(g, {erase}).ok());
    EXPECT_EQ(ids(g), ids(naive)) << "trial " << trial;
    EXPECT_TRUE(g.check_against_rebuild().ok());
  }
}

}  // namespace
}  // namespace normgrad
