// The rows apply that also reduces the next channel (StreamConf::overlap_reduce):
// where the JIT takes it, that its sums are the reduce kernel's to the bit
// (the same outputs as the ncx-no-overlap variant, whichever thread count
// splits the channels into runs), and that every output matches ref.
#include <string>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::conf_for;
using jit_test::expect_same_bits_for_1_2_4_threads;
using jit_test::form_op;
using jit_test::fused_graph;
using jit_test::inputs_for;
using jit_test::IsaScope;
using jit_test::RefCheck;
using jit_test::run_jit;
using testing_util::bn_bwd;
using testing_util::one_op;

// The overlapped kernel ran (its name says so), and every output has the
// bits of the same graph with the reduce kernel summing every channel.
void expect_bits_of_the_reduce_kernel(const Graph& g, uint64_t seed, const std::string& what) {
  SCOPED_TRACE(what);
  const auto inputs = inputs_for(g, seed);
  std::string overlapped, apart;
  const auto with = run_jit(g, "", inputs, &overlapped);
  const auto without = run_jit(g, "ncx-no-overlap", inputs, &apart);
  EXPECT_NE(overlapped.find("+overlap"), std::string::npos) << overlapped;
  EXPECT_EQ(apart.find("+overlap"), std::string::npos) << apart;
  ASSERT_EQ(with.size(), without.size());
  ASSERT_FALSE(with.empty());
  for (const auto& [id, buf] : with)
    EXPECT_TRUE(buf.bytes == without.at(id).bytes) << "tensor " << id;
}

TEST(JitBackend, ApplyReducesTheNextChannel) {
  if (jit::detect_isa() != jit::Isa::kAvx512)
    GTEST_SKIP() << "the overlapped apply is AVX-512 code; this host's JIT runs "
                 << jit::isa_name(jit::detect_isa());
  IsaScope scope("avx512");
  int ran = 0;
  const RefCheck check("avx512", 300, &ran);
  // Rows of whole vectors (the shortest rows not grouped); rows with a tail
  // whose diff_src rows start off a vector (17x17: the plain stores' copy);
  // ResNet's 28x28; 16-bit rows the cache holds; two channels (one run on two
  // threads).
  const struct {
    Dims shape;
    DataType dt;
  } cases[] = {{{3, 5, 16, 17}, DataType::kF32}, {{2, 7, 17, 17}, DataType::kF32},
               {{4, 6, 28, 28}, DataType::kF32}, {{2, 5, 16, 33}, DataType::kBF16},
               {{3, 4, 19, 31}, DataType::kF16}, {{2, 2, 20, 20}, DataType::kF32}};
  for (const auto& c : cases) {
    for (int form = 0; form < 6; ++form) {
      const Op op = form_op(c.shape, "NCX", c.dt, form);
      const std::string what =
          dims_to_string(c.shape) + " " + dtype_name(c.dt) + " form " + std::to_string(form);
      // Frozen statistics without diff_gamma (form 3's diff_src only: no reduction).
      const jit::BnConf conf = conf_for(op);
      if (!conf.needs_reduction) {
        EXPECT_FALSE(conf.stream.overlap_reduce) << what;
        continue;
      }
      EXPECT_TRUE(conf.stream.overlap_reduce) << what;
      expect_bits_of_the_reduce_kernel(one_op(op), static_cast<uint64_t>(ran), what);
      check(one_op(op), what, "+overlap");
    }
  }
  // Fused producers on either port, and the producers whose port-1 load reads
  // port 0's register (LeakyReLU's backward at src), with data offset from zero.
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (int port : {0, 1}) {
      for (OpKind kind : {OpKind::kReLUBackward, OpKind::kAdd}) {
        const Graph g = fused_graph({2, 5, 16, 40}, "NCX", kind, port, dt);
        const std::string what = std::string(op_kind_name(kind)) + " on port " +
                                 std::to_string(port) + " " + dtype_name(dt);
        expect_bits_of_the_reduce_kernel(g, static_cast<uint64_t>(ran), what);
        check(g, what, "+overlap");
      }
    }
  }
  // Channels 1100 elements apart (1024 used): the next channel is
  // channel_stride on, not cols.
  Op apart = bn_bwd({2, 3, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  for (int port : {0, 1}) apart.mutable_inputs()[port].strides = {3 * 1100, 1100, 32, 1};
  EXPECT_TRUE(conf_for(apart).stream.overlap_reduce);
  expect_bits_of_the_reduce_kernel(one_op(apart), 7, "channels padded apart");
  check(one_op(apart), "channels padded apart", "+overlap");
  // The runs follow the thread count; the bits do not.
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd({3, 24, 16, 20}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
}

TEST(JitBackend, OverlappedApplyOnlyWhereItPays) {
  const auto overlaps = [](const Op& op, const std::string& variant = "") {
    return conf_for(op, variant).stream.overlap_reduce;
  };
  const DataType f32 = DataType::kF32, bf16 = DataType::kBF16;
  {
    IsaScope scope("avx2");  // AVX2 has no registers for the next channel's sums
    EXPECT_FALSE(overlaps(bn_bwd({2, 3, 32, 32}, "NCX", f32, f32, true, 3)));
  }
  if (jit::detect_isa() != jit::Isa::kAvx512) return;
  IsaScope scope("avx512");
  EXPECT_TRUE(overlaps(bn_bwd({32, 64, 112, 112}, "NCX", f32, f32, true, 3)));
  // 16-bit data from DRAM: its apply slowed more than the reads overlapped.
  EXPECT_FALSE(overlaps(bn_bwd({32, 64, 112, 112}, "NCX", bf16, f32, true, 3)));
  // Short rows of adjacent channels take the grouped kernels; short rows of
  // channels apart (no groups) keep their sums across rows below
  // kPerRowSumCols elements; one channel has no next; NXC has no rows.
  EXPECT_FALSE(overlaps(bn_bwd({4, 8, 14, 14}, "NCX", f32, f32, true, 3)));
  for (int64_t cols : {jit::kPerRowSumCols - 1, jit::kPerRowSumCols}) {
    Op op = bn_bwd({4, 3, 1, cols}, "NCX", f32, f32, true, 3);
    for (int port : {0, 1}) op.mutable_inputs()[port].strides = {3 * 300, 300, cols, 1};
    EXPECT_EQ(overlaps(op), cols >= jit::kPerRowSumCols) << cols;
  }
  EXPECT_FALSE(overlaps(bn_bwd({4, 1, 32, 32}, "NCX", f32, f32, true, 3)));
  EXPECT_FALSE(overlaps(bn_bwd({4, 32, 32, 3}, "NXC", f32, f32, true, 3)));
  // The variant, and the reversed apply, which walks a channel last row first.
  EXPECT_FALSE(overlaps(bn_bwd({2, 3, 32, 32}, "NCX", f32, f32, true, 3), "ncx-no-overlap"));
  const jit::BnConf reversed =
      conf_for(bn_bwd({8, 3, 128, 128}, "NCX", f32, f32, true, 3), "ncx-reverse-apply");
  ASSERT_GT(reversed.stream.reverse_rows, 0);
  EXPECT_EQ(reversed.kernel_name().find("+overlap"), std::string::npos);
  // Staged tensors reduce and apply each packed channel on its own.
  Op staged = bn_bwd({2, 3, 32, 32}, "NCX", f32, f32, true, 3);
  staged.mutable_inputs()[0].strides = {3 * 32 * 40, 32 * 40, 40, 1};
  EXPECT_FALSE(overlaps(staged));
}

}  // namespace
}  // namespace normgrad
