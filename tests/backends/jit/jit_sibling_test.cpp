// Sibling batch norms: two BatchNormTrainingBackwards reading one fused
// diff_dst (a downsampling block's gradient) run as one partition, one walk
// driving both batch norms' kernels. Against ref on every ISA, dtype,
// layout and walk; bit for bit against each batch norm's own fused
// partition and across thread counts; and the cases the JIT declines.
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/compile/pipeline.hpp>
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::isas;
using jit_test::IsaScope;
using testing_util::bn_bwd_siblings;
using testing_util::compare_with_ref;

Dims in_format(const Dims& nchw, const char* fmt) {
  return std::string(fmt) == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
}

// The siblings' graph with each batch norm fed by a ReLUBackward of its own
// (op 5 writes tensor 21 for the second): two ordinary fused partitions.
// The second reads tensor 30 as its src (the same mask, first > 0), so CSE
// does not merge the two.
Graph apart(const Dims& shape, const char* fmt, DataType dt) {
  Graph g = bn_bwd_siblings(shape, fmt, dt);
  Graph h;
  for (Op op : g.ops()) {
    if (op.id() == 4) op.mutable_inputs()[1].id = 21;
    EXPECT_TRUE(h.add_op(op).ok());
  }
  Op relu(5, OpKind::kReLUBackward, "relu_bwd_again");
  relu.set_attr("use_dst", false);
  relu.add_input(testing_util::lt(30, dt, shape))
      .add_input(testing_util::lt(31, dt, shape))
      .add_output(testing_util::lt(21, dt, shape));
  EXPECT_TRUE(h.add_op(relu).ok());
  return h;
}

// What the JIT's siblings pattern said at the first batch norm.
std::string siblings_answer(const Graph& g) {
  std::vector<PatternTrial> trials;
  auto parts = partition_graph(g, CompileOptions{"jit"}, &trials);
  std::string said;
  for (const PatternTrial& t : trials) {
    if (t.pattern == "jit.bn_bwd_siblings" && t.op_id == 2)
      said = t.result.ok() ? "matched" : t.result.message();
  }
  return said;
}

// Every ISA the host runs, dtype, layout and shape (grouped and single
// rows, pixels, swept and blocked pixels), with and without the gradient
// Add, the second batch norm without gamma or with diff_src only, and data
// offset by 1e4 in every third case: one partition, within ref's tolerance.
TEST(JitSiblings, TwoBatchNormsOneWalkMatchRef) {
  int ran = 0;
  jit_test::each_case(
      [&](const std::string& trace, DataType dt, const char* fmt, const Dims& shape, int k) {
        const bool add = k % 2 == 1;
        const bool gamma = k % 3 != 1;
        const int outputs = k % 5 == 4 ? 1 : 3;
        Graph g = bn_bwd_siblings(shape, fmt, dt, add, gamma, outputs);
        ASSERT_TRUE(g.finalize().ok());
        SCOPED_TRACE(trace + (add ? " add" : "") + (gamma ? "" : " no gamma") +
                     (outputs == 1 ? " diff_src only" : ""));
        const auto r =
            compare_with_ref(g, "jit", static_cast<uint64_t>(900 + k), k % 3 == 2 ? 1e4 : 0.0);
        ++ran;
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_NE(r.kernel.find("+sibling"), std::string::npos)
            << r.kernel << "; the pattern said: " << siblings_answer(g);
        EXPECT_EQ(r.kernel.find("+jit:"), std::string::npos) << "one partition: " << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      });
  EXPECT_GT(ran, 0);
}

// Each member's calls and sums are those of its own partition: the same
// bits as the two batch norms fused apart, as the side output and the plain
// backward that the siblings replace, and for 1, 2 and 4 threads.
TEST(JitSiblings, SameBitsAsEachBatchNormAloneAndForAnyThreadCount) {
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      for (const char* fmt : {"NCX", "NXC"}) {
        for (const Dims& nchw : {Dims{3, 17, 5, 7}, Dims{2, 40, 33, 33}, Dims{2, 256, 7, 7}}) {
          const Dims shape = in_format(nchw, fmt);
          Graph g = bn_bwd_siblings(shape, fmt, dt);
          Graph h = apart(shape, fmt, dt);
          ASSERT_TRUE(g.finalize().ok());
          ASSERT_TRUE(h.finalize().ok());
          SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + fmt + " " + dims_to_string(shape));
          const auto inputs = jit_test::inputs_for(g, 77);
          std::string together, separately;
          const auto got = jit_test::run_jit(g, "", inputs, &together);
          const auto want = jit_test::run_jit(h, "", inputs, &separately);
          std::string side_output;  // the two partitions the siblings replace
          const auto two = jit_test::run_jit(g, "no-siblings", inputs, &side_output);
          EXPECT_NE(side_output.find("+side_out"), std::string::npos) << side_output;
          EXPECT_NE(together.find("+sibling"), std::string::npos) << together;
          EXPECT_EQ(separately.find("+sibling"), std::string::npos) << separately;
          for (int64_t id : {5, 6, 7, 45, 46, 47}) {
            ASSERT_TRUE(got.count(id) && want.count(id)) << "tensor " << id;
            EXPECT_TRUE(got.at(id).bytes == want.at(id).bytes) << "tensor " << id;
            EXPECT_TRUE(got.at(id).bytes == two.at(id).bytes) << "tensor " << id;
          }
          jit_test::expect_same_bits_for_1_2_4_threads(g);
        }
      }
    }
  }
}

// A downsampling block's forward: the shortcut's BatchNormForwardTraining
// (op 5: src 50, statistics 51-54, dst 30) feeds the residual Add after the
// main branch's (jit_test::forward_graph's epilogue 3: dst 40), before or
// after it in the graph's order.
Graph forward_siblings(const Dims& shape, const char* fmt, DataType dt, bool shortcut_first) {
  using testing_util::lt;
  const Graph main = jit_test::forward_graph(shape, 3, fmt, dt);
  const int64_t c = std::string(fmt) == "NCX" ? shape[1] : shape.back();
  Op bn(5, OpKind::kBatchNormForwardTraining, "shortcut_bn");
  bn.set_attr("epsilon", 1e-5f).set_attr("data_format", fmt);
  bn.add_input(lt(50, dt, shape));
  for (int64_t id = 51; id <= 54; ++id) bn.add_input(lt(id, DataType::kF32, {c}));
  bn.add_output(lt(30, dt, shape));
  for (int64_t id = 55; id <= 58; ++id) bn.add_output(lt(id, DataType::kF32, {c}));
  Graph g;
  std::vector<Op> ops(main.ops().begin(), main.ops().end());
  ops.insert(shortcut_first ? ops.begin() : ops.end(), bn);
  for (const Op& op : ops) EXPECT_TRUE(g.add_op(op).ok());
  return g;
}

// The forward siblings: one partition (the shortcut's dst is kept in the
// partition's dst and overwritten there), within ref's tolerance on every
// ISA, dtype, layout and walk; the same bits as the two partitions it
// replaces (no-siblings) and for 1, 2 and 4 threads.
TEST(JitSiblings, ForwardShortcutJoinsTheResidualAdd) {
  int ran = 0;
  jit_test::each_case(
      [&](const std::string& trace, DataType dt, const char* fmt, const Dims& shape, int k) {
        Graph g = forward_siblings(shape, fmt, dt, k % 2 == 0);
        ASSERT_TRUE(g.finalize().ok());
        SCOPED_TRACE(trace + (k % 2 == 0 ? " shortcut first" : " shortcut last"));
        const auto seed = static_cast<uint64_t>(300 + k);
        const auto r = compare_with_ref(g, "jit", seed, k % 3 == 2 ? 1e4 : 0.0);
        ++ran;
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_NE(r.kernel.find("+sibling"), std::string::npos) << r.kernel;
        EXPECT_EQ(r.kernel.find("+jit:"), std::string::npos) << "one partition: " << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        if (k % 4 != 0) return;  // the bits on a quarter of the cases (each walk and dtype)
        const auto inputs = jit_test::inputs_for(g, seed);
        std::string together, apart;
        const auto got = jit_test::run_jit(g, "", inputs, &together);
        const auto want = jit_test::run_jit(g, "no-siblings", inputs, &apart);
        EXPECT_EQ(apart.find("+sibling"), std::string::npos) << apart;
        for (int64_t id : {40, 21, 22, 23, 24, 55, 56, 57, 58}) {
          ASSERT_TRUE(got.count(id) && want.count(id)) << "tensor " << id;
          EXPECT_TRUE(got.at(id).bytes == want.at(id).bytes) << "tensor " << id;
        }
        jit_test::expect_same_bits_for_1_2_4_threads(g);
      });
  EXPECT_GT(ran, 0);
}

// A forward variant applies to both members, and the NXC strips (a task a
// strip of channels, taken here through fwd-strips) go through the
// thread's own block: the same bits as the two partitions under it.
TEST(JitSiblings, ForwardVariantsAndStrips) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "no generated code on this CPU";
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    Graph g = forward_siblings({4, 7, 7, 512}, "NXC", dt, true);
    ASSERT_TRUE(g.finalize().ok());
    SCOPED_TRACE(dtype_name(dt));
    for (const std::string variant : {"fwd-strips", "fwd-no-strips"}) {
      SCOPED_TRACE(variant);
      const auto r = compare_with_ref(g, "jit", 61, 0.0, variant);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("+sibling"), std::string::npos) << r.kernel;
      EXPECT_EQ(r.kernel.find("strips") != std::string::npos, variant == "fwd-strips") << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      const auto inputs = jit_test::inputs_for(g, 62);
      std::string together, apart;
      const auto got = jit_test::run_jit(g, variant, inputs, &together);
      const auto want = jit_test::run_jit(g, variant + "+no-siblings", inputs, &apart);
      EXPECT_EQ(apart.find("+sibling"), std::string::npos) << apart;
      for (int64_t id : {40, 21, 22, 55, 56}) {
        ASSERT_TRUE(got.count(id) && want.count(id)) << "tensor " << id;
        EXPECT_TRUE(got.at(id).bytes == want.at(id).bytes) << "tensor " << id;
      }
    }
  }
}

// A variant applies to both members (here the NXC strips, whose tasks take
// a strip's reduce and apply for both batch norms).
TEST(JitSiblings, VariantsApplyToBothMembers) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "no generated code on this CPU";
  int ran = 0;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    Graph g = bn_bwd_siblings({2, 9, 9, 256}, "NXC", dt, true);
    ASSERT_TRUE(g.finalize().ok());
    SCOPED_TRACE(dtype_name(dt));
    const auto r = compare_with_ref(g, "jit", 40 + static_cast<uint64_t>(ran++), 0.0, "nxc-strips");
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_NE(r.kernel.find("pixels_strips"), std::string::npos) << r.kernel;
    EXPECT_NE(r.kernel.find("+sibling"), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    jit_test::expect_same_bits_for_1_2_4_threads(g, "nxc-strips");
  }
}

// What the JIT declines, with the reason --explain shows, and what runs
// instead: a strided src (staged) leaves the first batch norm fused with
// the side output and the second alone, with ref's numbers.
TEST(JitSiblings, StridedSrcFallsBackToTheSideOutput) {
  Graph g = bn_bwd_siblings({3, 5, 6, 7}, "NCX", DataType::kF32);
  Graph h;
  for (Op op : g.ops()) {
    if (op.id() == 4) op.mutable_inputs()[0].strides = {210, 1, 35, 5};  // channels last
    ASSERT_TRUE(h.add_op(op).ok());
  }
  ASSERT_TRUE(h.finalize().ok());
  std::vector<PatternTrial> trials;
  auto parts = partition_graph(h, CompileOptions{"jit"}, &trials);
  ASSERT_TRUE(parts.ok()) << parts.status().to_string();
  bool said = false;
  for (const PatternTrial& t : trials) {
    if (t.pattern == "jit.bn_bwd_siblings" && !t.result.ok())
      said = said || t.result.message().find("strided") != std::string::npos;
  }
  EXPECT_TRUE(said) << "the siblings pattern's refusal names the strided tensor";
  const auto r = compare_with_ref(h, "jit", 5);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.kernel.find("+sibling"), std::string::npos) << r.kernel;
  EXPECT_NE(r.kernel.find("+side_out"), std::string::npos) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
}

}  // namespace
}  // namespace normgrad
