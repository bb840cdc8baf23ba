// The fuzzer's graphs reach the training-graph case: a batch norm's backward
// whose gradient is another backward's diff_src, as it is, through a
// ReLUBackward or added to another gradient, never one over the same src.
#include <gtest/gtest.h>

#include "tools/graph_gen.hpp"

namespace normgrad {
namespace {

TEST(GraphGen, BackwardsFeedEachOtherAsInATrainingGraph) {
  cli::GraphGenOptions options;
  options.max_ops = 16;
  int chained = 0, through = 0;
  for (uint64_t seed = 1; seed <= 500; ++seed) {
    auto g = cli::random_graph(seed, options);
    ASSERT_TRUE(g.ok()) << seed << ": " << g.status().to_string();
    ASSERT_TRUE(g->finalize().ok()) << seed;
    for (const Op& op : g->ops()) {
      if (op.kind() != OpKind::kBatchNormTrainingBackward) continue;
      const Op* p = g->producer(op.inputs()[1].id);
      if (p != nullptr && (p->kind() == OpKind::kReLUBackward || p->kind() == OpKind::kAdd)) {
        const Op* q = g->producer(p->inputs()[p->kind() == OpKind::kAdd ? 0 : 1].id);
        if (q != nullptr && q->kind() == OpKind::kBatchNormTrainingBackward) {
          ++through;
          p = q;
        }
      }
      if (p == nullptr || p->kind() != OpKind::kBatchNormTrainingBackward) continue;
      ++chained;
      EXPECT_NE(p->inputs()[0].id, op.inputs()[0].id)
          << seed << ": a backward's gradient is a function of its own src";
    }
  }
  EXPECT_GT(chained, 20);
  EXPECT_GT(through, 10);
}

}  // namespace
}  // namespace normgrad
