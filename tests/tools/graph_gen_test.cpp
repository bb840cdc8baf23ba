// The fuzzer's graphs reach the training-graph case and the large shapes: a batch norm's backward
// whose gradient is another backward's diff_src, as it is, through a
// ReLUBackward or added to another gradient, never one over the same src.
#include <gtest/gtest.h>

#include <normgrad/compile/pipeline.hpp>
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

// Some graphs have sibling backwards (two reading one produced gradient, a
// downsampling block's), and the JIT takes some of them as one partition.
TEST(GraphGen, SomeBackwardsShareTheirGradientAsSiblings) {
  cli::GraphGenOptions options;
  options.max_ops = 16;
  int shared = 0, taken = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    auto g = cli::random_graph(seed, options);
    ASSERT_TRUE(g.ok()) << seed << ": " << g.status().to_string();
    ASSERT_TRUE(g->finalize().ok()) << seed;
    for (const Op& op : g->ops()) {
      if (op.kind() != OpKind::kBatchNormTrainingBackward) continue;
      int readers = 0;
      for (const Use& u : g->uses(op.inputs()[1].id))
        readers += g->op(u.op_id)->kind() == OpKind::kBatchNormTrainingBackward ? 1 : 0;
      shared += readers == 2 && g->producer(op.inputs()[1].id) != nullptr ? 1 : 0;
    }
    auto parts = partition_graph(*g, CompileOptions{"auto"});
    ASSERT_TRUE(parts.ok()) << seed << ": " << parts.status().to_string();
    for (const Partition& p : *parts) taken += p.pattern == "jit.bn_bwd_siblings" ? 1 : 0;
  }
  EXPECT_GT(shared, 20);
  EXPECT_GT(taken, 5);
}

// Some forwards' activation input is read by a backward too, and the JIT
// writes it as a side output of the fused forward.
TEST(GraphGen, SomeForwardsWriteTheActivationInputAsASideOutput) {
  cli::GraphGenOptions options;
  options.max_ops = 16;
  int read_twice = 0, taken = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    auto g = cli::random_graph(seed, options);
    ASSERT_TRUE(g.ok()) << seed << ": " << g.status().to_string();
    ASSERT_TRUE(g->finalize().ok()) << seed;
    for (const Op& op : g->ops()) {
      if (op.kind() != OpKind::kReLU && op.kind() != OpKind::kLeakyReLU) continue;
      const Op* bn = g->producer(op.inputs()[0].id);
      read_twice += bn != nullptr && bn->kind() == OpKind::kBatchNormForwardTraining &&
                            g->uses(op.inputs()[0].id).size() == 2
                        ? 1
                        : 0;
    }
    auto parts = partition_graph(*g, CompileOptions{"auto"});
    ASSERT_TRUE(parts.ok()) << seed << ": " << parts.status().to_string();
    for (const Partition& p : *parts) {
      const Op* act = p.bound(FusionRole::kActivation);
      bool side = false;
      for (const LogicalTensor& t : p.outputs) side = side || (act && t.id == act->inputs()[0].id);
      taken += p.pattern == "jit.bn_fwd_side_output" && side ? 1 : 0;
    }
  }
  EXPECT_GT(read_twice, 10);
  EXPECT_GT(taken, 10);
}

// Some graphs are large enough for the walks the JIT chooses by size: a
// batch norm over more than a quarter of the cache model's 32 MiB L3 in
// f32, or over pixel rows of 4 KiB.
TEST(GraphGen, SomeShapesReachTheWalksChosenBySize) {
  cli::GraphGenOptions options;
  options.max_ops = 16;
  int large = 0;
  for (uint64_t seed = 1; seed <= 500; ++seed) {
    auto g = cli::random_graph(seed, options);
    ASSERT_TRUE(g.ok()) << seed;
    for (const Op& op : g->ops()) {
      if (op.kind() != OpKind::kBatchNormTrainingBackward &&
          op.kind() != OpKind::kBatchNormForwardTraining)
        continue;
      const Dims& d = op.inputs()[0].dims;
      int64_t n = 1;
      for (int64_t x : d) n *= x;
      if (n * 4 > (8 << 20) || (d.size() == 4 && d.back() >= 1024)) ++large;
    }
  }
  EXPECT_GE(large, 3);
}

}  // namespace
}  // namespace normgrad
