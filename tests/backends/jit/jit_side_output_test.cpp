// Fused diff_dst producers beyond the only-reader case: a producer whose
// output is a result too (the JIT writes it as a side output), and the
// gradient Add in front of a ReLUBackward (Fuse::kAddReluBackward), each on
// every ISA, dtype and layout, on the walks the sizes choose, against ref.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/compile/compiler.hpp>
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::each_case;
using jit_test::fused_graph;
using jit_test::isas;
using jit_test::IsaScope;
using testing_util::compare_with_ref;

// `g` with tensor 20 (the fused producer's output) and the batch norm's
// outputs as the graph's outputs: 20 is then a result too.
void with_side_output(Graph& g) {
  std::vector<int64_t> outs = {20};
  for (const Op& op : g.ops()) {
    if (op.kind() != OpKind::kBatchNormTrainingBackward) continue;
    for (const LogicalTensor& lt : op.outputs()) outs.push_back(lt.id);
  }
  g.set_output_ports(outs);
}

// Tensor 20 of the JIT's run and of ref's, bit for bit: the side output is
// the producer's value exactly.
void expect_side_output_exact(const Graph& g, uint64_t seed) {
  const auto inputs = jit_test::inputs_for(g, seed);
  std::string name;
  const auto got = jit_test::run_jit(g, "", inputs, &name);
  auto ref = CompiledGraph::compile(g, CompileOptions{"ref"});
  ASSERT_TRUE(ref.ok());
  const auto want = oracle::run_outputs(*ref, inputs);
  ASSERT_TRUE(want.ok());
  ASSERT_TRUE(got.count(20));
  EXPECT_TRUE(got.at(20).bytes == want->at(20).bytes);
}

// How many partitions the JIT's compile of `g` has.
size_t partition_count(const Graph& g) {
  auto cg = CompiledGraph::compile(g, CompileOptions{"jit"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  return cg.ok() ? cg->partitions().size() : 0;
}

// `g` on the JIT against ref (data offset by 1e4 in every third case k): one
// partition, whose kernel name holds `fused`, within tolerance.
testing_util::Comparison expect_fused(const Graph& g, uint64_t seed, int k,
                                      const std::string& fused) {
  auto r = compare_with_ref(g, "jit", seed, k % 3 == 2 ? 1e4 : 0.0);
  EXPECT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_NE(r.kernel.find(fused), std::string::npos) << r.kernel;
  EXPECT_EQ(partition_count(g), 1u) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  return r;
}

// A diff_dst producer whose output is a result too (a graph output here; a
// second reader alike): the fused kernel stores it in its reduce pass and
// the apply reads it back. Every ISA, dtype and layout, the walks the sizes
// choose, and data far from zero; the side output is ReLUBackward's or
// Add's value exactly (the same bits as ref's), the rest within tolerance.
TEST(JitSideOutput, FusedProducerWritesItsOutputAsASideOutput) {
  each_case([](const std::string& trace, DataType dt, const char* fmt, const Dims& shape, int k) {
    const bool relu = k % 2 == 0;
    Graph g = fused_graph(shape, fmt, relu ? OpKind::kReLUBackward : OpKind::kAdd, 1, dt,
                          relu ? std::optional<bool>(true) : std::nullopt);
    with_side_output(g);
    ASSERT_TRUE(g.finalize().ok());
    SCOPED_TRACE(trace + (relu ? " ReLUBackward" : " Add"));
    const auto seed = static_cast<uint64_t>(500 + k);
    if (expect_fused(g, seed, k, "+side_out").status.ok()) expect_side_output_exact(g, seed);
  });
}

// Add -> ReLUBackward -> diff_dst: one kernel computes the gradients' sum
// (rounded to the dtype, as the Add stores it), masks it and reduces it;
// with and without the ReLUBackward's output as a result too.
TEST(JitSideOutput, GradientAddInFrontOfTheReluBackwardFuses) {
  each_case([](const std::string& trace, DataType dt, const char* fmt, const Dims& shape, int k) {
    Graph g = fused_graph(shape, fmt, OpKind::kReLUBackward, 1, dt, true);
    Op add(3, OpKind::kAdd, "gradient_add");  // writes the ReLUBackward's gradient, 31
    add.add_input(testing_util::lt(32, dt, shape))
        .add_input(testing_util::lt(33, dt, shape))
        .add_output(testing_util::lt(31, dt, shape));
    ASSERT_TRUE(g.add_op(add).ok());
    const bool side = k % 2 == 1;
    if (side) with_side_output(g);
    ASSERT_TRUE(g.finalize().ok());
    SCOPED_TRACE(trace + (side ? " with the side output" : ""));
    const auto seed = static_cast<uint64_t>(700 + k);
    const auto r = expect_fused(g, seed, k, "+diff_dst_add_relu_bwd");
    EXPECT_EQ(r.kernel.find("+side_out") != std::string::npos, side) << r.kernel;
    if (side && r.status.ok()) expect_side_output_exact(g, seed);
  });
}

}  // namespace
}  // namespace normgrad
