// The JIT backward's channel strips (NXC: a task per strip of adjacent
// channels across every pixel, its reduce, then its apply): against ref on
// each ISA in every output form, every dtype, data far from zero, partial
// chunks and fused producers on either port; the same bits for any thread
// count; and the variants that choose them.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

struct Case {
  Dims shape;  // N, H, W, C
  const char* variant;
};

// 96 channels in strips of 32 (105 pixels); 256 in the rule's strips of 128
// over 5000 pixels (several chunks, the last partial); 160 in strips of 32
// over 37 pixels (one partial chunk); 64 in strips of 32 over 1 pixel.
const Case kCases[] = {{{3, 5, 7, 96}, "nxc-strips-32"},
                       {{2, 50, 50, 256}, "nxc-strips"},
                       {{37, 1, 1, 160}, "nxc-strips-32"},
                       {{1, 1, 1, 64}, "nxc-strips-32"}};

TEST(JitPixelStrips, MatchRefOnEachIsa) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;  // the portable path has no strips
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const Case& k : kCases) {
        // Every output form but Reduce and Apply's (the whole backward only):
        // with and without gamma, diff_src only, frozen statistics, inverse std.
        const int form = ran % 6;
        const Op op = jit_test::form_op(k.shape, "NXC", dt, form);
        SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + dims_to_string(k.shape) + " " + k.variant +
                     " form " + std::to_string(form));
        const double offset = ran % 2 == 0 ? 1e4 : 0.0;
        const auto r = compare_with_ref(one_op(op), "jit", 1300 + static_cast<uint64_t>(ran),
                                        offset, k.variant);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
        // Form 2 (frozen statistics, diff_src only) sums nothing: no strips.
        EXPECT_EQ(r.kernel.find(":pixels_strips") != std::string::npos, form != 2) << r.kernel;
        ++ran;
      }
    }
    // Fused producers: the second operand of each walks the strips too.
    for (int port : {0, 1}) {
      SCOPED_TRACE(isa + " fused on port " + std::to_string(port));
      const auto r = compare_with_ref(jit_test::fused_on_port({3, 5, 7, 192}, "NXC", port), "jit",
                                      1350 + static_cast<uint64_t>(port), 0.0, "nxc-strips-64");
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      EXPECT_NE(r.kernel.find(":pixels_strips+"), std::string::npos) << r.kernel;
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

TEST(JitPixelStrips, SameBitsForAnyThreadCount) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    jit_test::expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({2, 50, 50, 256}, "NXC", dt, DataType::kF32, true, 3)), "nxc-strips-32");
  }
}

// The JIT takes strips only through the variant: nxc-strips takes widths
// the walk can take and leaves the others, and the other NXC walks'
// variants time their walk over all channels.
TEST(JitPixelStrips, Variants) {
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto c = jit::make_conf(bn_bwd({32, 7, 7, 2048}, "NXC", dt, DataType::kF32, true, 3),
                            jit::Isa::kAvx512);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_FALSE(c->walk.strips) << "not by default";
    EXPECT_EQ(c->walk.cols, 2048);
    for (const auto& [variant, width] :
         std::vector<std::pair<std::string, int64_t>>{{"nxc-strips", jit::kBwdStripChannels},
                                                      {"nxc-strips-64", 64},
                                                      {"nxc-strips-48", 0},
                                                      {"nxc-strips-2048", 0}}) {
      jit::BnConf k = *c;
      ASSERT_TRUE(jit::apply_variant(variant, &k).ok());
      EXPECT_EQ(k.walk.strips, width > 0) << variant;
      EXPECT_EQ(k.walk.cols, width > 0 ? width : 2048) << variant;
      EXPECT_EQ(k.walk.row_stride, 2048) << variant;
      EXPECT_EQ(k.walk.sweep_rows, width > 0 ? 0 : c->walk.sweep_rows) << variant;
      EXPECT_EQ(k.walk.pixel_group, width > 0 ? 0 : c->walk.pixel_group) << variant;
      ASSERT_TRUE(jit::apply_variant("nxc-per-pixel", &k).ok());
      EXPECT_FALSE(k.walk.strips) << variant;
      EXPECT_EQ(k.walk.cols, 2048) << variant;
    }
  }
  // Not for NCX, Reduce, the portable code, or C that strips cannot divide.
  const Op ncx = bn_bwd({32, 2048, 7, 7}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  auto rows = jit::make_conf(ncx, jit::Isa::kAvx512);
  ASSERT_TRUE(rows.ok());
  EXPECT_FALSE(jit::bwd_strips_possible(*rows, 128));
  ASSERT_TRUE(jit::apply_variant("nxc-strips", &*rows).ok());
  EXPECT_FALSE(rows->walk.strips);
  auto odd = jit::make_conf(
      bn_bwd({32, 7, 7, 2000}, "NXC", DataType::kF32, DataType::kF32, true, 3), jit::Isa::kAvx512);
  ASSERT_TRUE(odd.ok());
  EXPECT_FALSE(jit::bwd_strips_possible(*odd, 128));
  EXPECT_FALSE(odd->walk.strips);
  auto reduce = jit::make_conf(
      bn_bwd({32, 7, 7, 2048}, "NXC", DataType::kF32, DataType::kF32, true, 3), jit::Isa::kAvx512);
  ASSERT_TRUE(reduce.ok());
  reduce->d.phase = BackwardPhase::kReduce;
  EXPECT_FALSE(jit::bwd_strips_possible(*reduce, 128));
  auto portable =
      jit::make_conf(bn_bwd({32, 7, 7, 2048}, "NXC", DataType::kF32, DataType::kF32, true, 3),
                     jit::Isa::kPortable);
  ASSERT_TRUE(portable.ok());
  EXPECT_FALSE(jit::bwd_strips_possible(*portable, 128));
}

}  // namespace
}  // namespace normgrad
