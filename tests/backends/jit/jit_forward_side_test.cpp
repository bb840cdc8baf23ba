// A forward's side output: BatchNormForwardTraining -> [Add] -> ReLU or
// LeakyReLU whose activation input is read elsewhere too (here a graph
// output, as a LeakyReLU's backward reads it) runs as one partition that
// writes both tensors. Against ref on every ISA, dtype, layout and walk;
// bit for bit against the partitions without the side output (the batch
// norm alone, the fused activation alone) and across thread counts; the
// variants and the walks the sizes do not reach; and what runs apart.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/compile/pipeline.hpp>
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::compare_with_ref;

// jit_test::forward_graph's activation input: the batch norm's dst (20) or,
// with the Add (epilogue 3), the sum (31).
int64_t activation_input(int epilogue) {
  return epilogue == 3 ? 31 : 20;
}

// forward_graph with the activation's input a graph output too.
Graph with_side(const Dims& shape, int epilogue, const char* fmt, DataType dt) {
  Graph g = jit_test::forward_graph(shape, epilogue, fmt, dt);
  g.set_output_ports({21, 22, 23, 24, activation_input(epilogue), 40});
  return g;
}

// forward_graph less its activation: the batch norm (and the Add) alone.
Graph without_activation(const Dims& shape, int epilogue, const char* fmt, DataType dt) {
  const Graph full = jit_test::forward_graph(shape, epilogue, fmt, dt);
  Graph g;
  for (const Op& op : full.ops()) {
    if (op.id() != 3) {
      EXPECT_TRUE(g.add_op(op).ok());
    }
  }
  return g;
}

// Runs `g` on the JIT under `variant` on `inputs`, finalised.
std::map<int64_t, oracle::Buffer> run(Graph g, const std::string& variant,
                                      const std::map<int64_t, oracle::Buffer>& inputs,
                                      std::string* kernel) {
  EXPECT_TRUE(g.finalize().ok());
  return jit_test::run_jit(g, variant, inputs, kernel);
}

// The side output's bits are the batch norm's (and Add's) partition's, and
// the activation's output and statistics are the fused partition's
// without a side output, on the same inputs.
void expect_bits_of_the_partitions_apart(const Dims& shape, int epilogue, const char* fmt,
                                         DataType dt, uint64_t seed,
                                         const std::string& variant = "") {
  Graph g = with_side(shape, epilogue, fmt, dt);
  ASSERT_TRUE(g.finalize().ok());
  const auto inputs = jit_test::inputs_for(g, seed);
  std::string k_side, k_act, k_pre;
  const auto got = jit_test::run_jit(g, variant, inputs, &k_side);
  const auto act = run(jit_test::forward_graph(shape, epilogue, fmt, dt), variant, inputs, &k_act);
  const auto pre = run(without_activation(shape, epilogue, fmt, dt), variant, inputs, &k_pre);
  EXPECT_NE(k_side.find("+side_out"), std::string::npos) << k_side;
  EXPECT_EQ(k_act.find("+side_out"), std::string::npos) << k_act;
  const int64_t y = activation_input(epilogue);
  for (int64_t id : {int64_t{40}, int64_t{21}, int64_t{22}, int64_t{23}, int64_t{24}}) {
    ASSERT_TRUE(got.count(id) && act.count(id)) << "tensor " << id;
    EXPECT_TRUE(got.at(id).bytes == act.at(id).bytes) << "tensor " << id;
  }
  ASSERT_TRUE(got.count(y) && pre.count(y)) << "tensor " << y;
  EXPECT_TRUE(got.at(y).bytes == pre.at(y).bytes) << "the side output, tensor " << y;
}

// Every ISA the host runs, dtype, layout and walk, with ReLU, LeakyReLU and
// Add+ReLU in turn, data offset by 1e4 in every third case: one partition
// writing both tensors, within ref's tolerance; on a quarter of the cases
// the bits of the partitions apart and the same bits for 1, 2 and 4 threads.
TEST(JitForwardSide, ActivationInputWrittenTooMatchesRef) {
  int ran = 0;
  jit_test::each_case(
      [&](const std::string& trace, DataType dt, const char* fmt, const Dims& shape, int k) {
        const int epilogue = 1 + k % 3;
        SCOPED_TRACE(trace + " epilogue " + std::to_string(epilogue));
        Graph g = with_side(shape, epilogue, fmt, dt);
        ASSERT_TRUE(g.finalize().ok());
        const auto seed = static_cast<uint64_t>(500 + k);
        const auto r = compare_with_ref(g, "jit", seed, k % 3 == 2 ? 1e4 : 0.0);
        ++ran;
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_NE(r.kernel.find("+side_out"), std::string::npos) << r.kernel;
        EXPECT_EQ(r.kernel.find("+jit:"), std::string::npos) << "one partition: " << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        if (k % 4 != 0) return;
        expect_bits_of_the_partitions_apart(shape, epilogue, fmt, dt, seed);
        jit_test::expect_same_bits_for_1_2_4_threads(g);
      });
  EXPECT_GT(ran, 0);
}

// The walks the sizes above do not reach, through variants: single NCX
// rows whose images the two applies take in runs (56x56 f32: 5 images of
// 64 KiB, bf16: 10), NXC strips
// (the side output's apply and the forward's go block by block within a
// strip) and NCX grouped rows streamed through the bounce buffer (rows off
// lines, src past a quarter of the cache model's L3); each the bits of the
// partitions apart under the same variant.
TEST(JitForwardSide, VariantsAndStrips) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "no generated code on this CPU";
  // Images of 512 channels of 14x14 (rows of 784 or 392 bytes) until src
  // and dst pass a quarter of the L3 in bf16.
  const int64_t image_bytes = 512 * 14 * 14 * 2;
  const int64_t images = cache_sizes().l3_bytes / 4 / (2 * image_bytes) + 1;
  struct Case {
    Dims shape;
    const char* fmt;
    const char* variant;
    const char* kernel;  // what the variant's kernel name says
  };
  const Case cases[] = {{{6, 16, 56, 56}, "NCX", "default", ":fwd:rows+"},
                        {{4, 7, 7, 512}, "NXC", "fwd-strips", "_strips"},
                        {{images, 512, 14, 14}, "NCX", "fwd-bounce", "+nt_bounce"}};
  int k = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;
    jit_test::IsaScope scope(isa);
    for (const Case& c : cases) {
      for (DataType dt : {DataType::kF32, DataType::kBF16}) {
        for (int epilogue : {2, 3}) {
          SCOPED_TRACE(isa + " " + c.variant + " " + dtype_name(dt) + " epilogue " +
                       std::to_string(epilogue));
          Graph g = with_side(c.shape, epilogue, c.fmt, dt);
          ASSERT_TRUE(g.finalize().ok());
          const auto seed = 70 + static_cast<uint64_t>(k++);
          const auto r = compare_with_ref(g, "jit", seed, 0.0, c.variant);
          ASSERT_TRUE(r.status.ok()) << r.status.to_string();
          EXPECT_NE(r.kernel.find("+side_out"), std::string::npos) << r.kernel;
          EXPECT_NE(r.kernel.find(c.kernel), std::string::npos) << r.kernel;
          EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          expect_bits_of_the_partitions_apart(c.shape, epilogue, c.fmt, dt, seed, c.variant);
        }
      }
    }
  }
}

// The synchronized forward's Apply half takes the side output too: here
// one process's Reduce feeds its Apply (the global sums are the local
// ones), whose LeakyReLU's input is a graph output.
TEST(JitForwardSide, SynchronizedApplyWritesTheSideOutput) {
  using testing_util::lt;
  const DataType f32 = DataType::kF32;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const char* fmt : {"NCX", "NXC"}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + fmt);
      const Dims shape = std::string(fmt) == "NCX" ? Dims{3, 24, 9, 11} : Dims{3, 9, 11, 24};
      Graph g;
      Op reduce(1, OpKind::kBatchNormForwardReduce, "reduce");
      reduce.set_attr("data_format", fmt);
      reduce.add_input(lt(10, dt, shape))
          .add_output(lt(15, DataType::kF64, {24}))
          .add_output(lt(16, DataType::kF64, {24}))
          .add_output(lt(17, DataType::kS64, {1}));
      Op apply(2, OpKind::kBatchNormForwardApply, "apply");
      apply.set_attr("epsilon", 1e-3f).set_attr("data_format", fmt);
      apply.add_input(lt(10, dt, shape)).add_input(lt(11, f32, {24})).add_input(lt(12, f32, {24}));
      apply.add_input(lt(15, DataType::kF64, {24}))
          .add_input(lt(16, DataType::kF64, {24}))
          .add_input(lt(17, DataType::kS64, {1}));
      apply.add_input(lt(13, f32, {24})).add_input(lt(14, f32, {24}));
      apply.add_output(lt(20, dt, shape));
      for (int64_t id = 21; id <= 24; ++id) apply.add_output(lt(id, f32, {24}));
      Op act(3, OpKind::kLeakyReLU, "act");
      act.set_attr("alpha", 0.1f);
      act.add_input(lt(20, dt, shape)).add_output(lt(40, dt, shape));
      for (const Op& op : {reduce, apply, act}) ASSERT_TRUE(g.add_op(op).ok());
      g.set_output_ports({21, 22, 23, 24, 20, 40});
      ASSERT_TRUE(g.finalize().ok());
      const auto r = compare_with_ref(g, "jit", 17, 1e4);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("+apply+leaky_relu"), std::string::npos) << r.kernel;
      EXPECT_NE(r.kernel.find("+side_out"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
  }
}

// What --explain says, and fwd-no-side-output: the JIT declines the side
// output, and bn_fwd_epilogue's only-reader form takes the batch norm with
// its Add (when there is one); the activation runs apart, with ref's numbers.
TEST(JitForwardSide, ExplainedAndRunApartOnRequest) {
  for (int epilogue : {2, 3}) {
    SCOPED_TRACE("epilogue " + std::to_string(epilogue));
    Graph g = with_side({2, 16, 5, 5}, epilogue, "NCX", DataType::kF32);
    ASSERT_TRUE(g.finalize().ok());
    std::vector<PatternTrial> trials;
    auto parts = partition_graph(g, CompileOptions{"jit"}, &trials);
    ASSERT_TRUE(parts.ok()) << parts.status().to_string();
    const std::string note =
        "dst: tensor " + std::to_string(activation_input(epilogue)) + " written as a side output";
    bool said = false;
    for (const PatternTrial& t : trials) {
      if (t.pattern == "jit.bn_fwd_side_output" && t.result.ok())
        said = said || t.note.find(note) != std::string::npos;
    }
    EXPECT_TRUE(said) << "the side-output pattern's note names the side output";
    CompileOptions options{"auto"};
    options.jit_variant = "fwd-no-side-output";
    std::vector<PatternTrial> apart_trials;
    auto apart_parts = partition_graph(g, options, &apart_trials);
    ASSERT_TRUE(apart_parts.ok()) << apart_parts.status().to_string();
    bool epilogue_took_it = false;
    for (const Partition& p : *apart_parts) {
      if (p.pattern == "jit.bn_fwd_epilogue")
        epilogue_took_it = p.bound(FusionRole::kResidualAdd) != nullptr;
    }
    EXPECT_EQ(epilogue_took_it, epilogue == 3);
    const auto apart = compare_with_ref(g, "auto", 9, 0.0, "fwd-no-side-output");
    ASSERT_TRUE(apart.status.ok()) << apart.status.to_string();
    EXPECT_EQ(apart.kernel.find("+side_out"), std::string::npos) << apart.kernel;
    EXPECT_EQ(apart.kernel.find("+add") != std::string::npos, epilogue == 3) << apart.kernel;
    EXPECT_LE(apart.worst_ratio, 1.0) << apart.report;
  }
}

}  // namespace
}  // namespace normgrad
