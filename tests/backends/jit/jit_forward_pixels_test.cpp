// The JIT forward's NXC walks: the channel strips (a task per strip of
// adjacent channels across all pixels, statistics then apply) against ref
// on each ISA with every epilogue, every dtype, data far from zero, partial
// statistics chunks and several chunks to a group; bit for bit against the
// pixels walk (fwd-no-strips), as the walk keeps every sum's order; the same
// bits for any thread count; the rule that chooses them. And the statistics
// in groups of pixels (the sums in memory) against the channel-block sweeps.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/backends/backend.hpp>
#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::compare_with_ref;

struct Case {
  Dims shape;  // N, H, W, C
  const char* variant;
};

// 96 channels in strips of 32 (105 pixels: a partial second chunk); 64 in
// strips of 32 over 5000 pixels (79 chunks, two to a group); 512 in the
// variant's default widths (128 f32 channels; 16-bit 128 on AVX2, 256 on
// AVX-512); 160 in strips of 32 over 37 pixels (one partial chunk).
const Case kCases[] = {{{3, 5, 7, 96}, "fwd-strips-32"},
                       {{2, 50, 50, 64}, "fwd-strips-32"},
                       {{5, 7, 7, 512}, "fwd-strips"},
                       {{37, 1, 1, 160}, "fwd-strips-32"}};

TEST(JitForwardPixels, StripsMatchRefOnEachIsa) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;  // the portable path has no strips
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const Case& k : kCases) {
        const int epilogue = ran % 4;  // none, ReLU, LeakyReLU, Add + ReLU
        const Graph g = jit_test::forward_graph(k.shape, epilogue, "NXC", dt);
        SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + dims_to_string(k.shape) + " " + k.variant +
                     " epilogue " + std::to_string(epilogue));
        const double offset = epilogue == 0 ? 1e4 : 0.0;
        const auto r =
            compare_with_ref(g, "jit", 1100 + static_cast<uint64_t>(ran), offset, k.variant);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
        EXPECT_NE(r.kernel.find("_strips"), std::string::npos) << r.kernel;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

// Each channel's sums take the same chunks in the same order as the pixels
// walk's, and the apply is elementwise: the same bits as fwd-no-strips.
TEST(JitForwardPixels, StripsSameBitsAsThePixelsWalk) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  uint64_t seed = 1200;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const Case& k : kCases) {
      for (int epilogue : {0, 3}) {
        const Graph g = jit_test::forward_graph(k.shape, epilogue, "NXC", dt);
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dims_to_string(k.shape) + " " + k.variant +
                     " epilogue " + std::to_string(epilogue));
        const auto inputs = jit_test::inputs_for(g, seed++);
        std::string strips, pixels;
        const auto a = jit_test::run_jit(g, k.variant, inputs, &strips);
        const auto b = jit_test::run_jit(g, "fwd-no-strips", inputs, &pixels);
        EXPECT_NE(strips.find("_strips"), std::string::npos) << strips;
        EXPECT_EQ(pixels.find("_strips"), std::string::npos) << pixels;
        ASSERT_EQ(a.size(), b.size());
        for (const auto& [id, buf] : a) EXPECT_TRUE(buf.bytes == b.at(id).bytes) << "tensor " << id;
      }
    }
  }
}

TEST(JitForwardPixels, StripsSameBitsForAnyThreadCount) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    jit_test::expect_same_bits_for_1_2_4_threads(
        jit_test::forward_graph({2, 50, 50, 64}, 3, "NXC", dt), "fwd-strips-32");
  }
}

// The rule: 16-bit strips of 128 channels on AVX2 and 256 on AVX-512 when
// src is past the cache, a pixel's row is a page or more, every thread has
// a strip and all threads' strips fit in a quarter of the L3; none for f32;
// never for NCX, the synchronized forward's parts or the portable code. The
// variant takes widths the walk can take and leaves the others.
TEST(JitForwardPixels, StripsRule) {
  jit::FwdConf c;
  c.isa = jit::Isa::kAvx512;
  c.dt = DataType::kBF16;
  c.ncx_rows = false;
  c.n = 32;
  c.spatial = 49;
  c.c = 2048;  // ResNet-50's 7x7 layer: 6.4 MB of bf16
  c.pixels = c.n * c.spatial;
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  const bool past = 2 * c.pixels * c.c * 2 > l3 / 4;
  for (const auto& [isa, width] : std::vector<std::pair<jit::Isa, int64_t>>{
           {jit::Isa::kAvx512, jit::kFwdStrip16Avx512}, {jit::Isa::kAvx2, jit::kFwdStrip16Avx2}}) {
    jit::FwdConf k = c;
    k.isa = isa;
    EXPECT_EQ(jit::fwd_strip_width(k), width);
    const bool fits = 2 * k.pixels * width * 2 <= l3 / 4;
    EXPECT_EQ(jit::fwd_strip_rule(k, 2), past && fits ? width : 0);
    // 64 threads: 16 or fewer strips leave threads idle.
    EXPECT_EQ(jit::fwd_strip_rule(k, 64), 0);
    k.dt = DataType::kF16;
    EXPECT_EQ(jit::fwd_strip_rule(k, 2), past && fits ? width : 0);
    k.dt = DataType::kF32;  // 12.8 MB, 8 KiB a pixel: the pixels walk
    EXPECT_EQ(jit::fwd_strip_width(k), jit::kFwdStripF32);
    EXPECT_EQ(jit::fwd_strip_rule(k, 2), 0);
  }
  // 14x14 bf16: 2 KiB a pixel, so a page holds two strips' runs.
  jit::FwdConf half = c;
  half.spatial = 196;
  half.c = 1024;
  half.pixels = half.n * half.spatial;
  EXPECT_EQ(jit::fwd_strip_rule(half, 2), 0);
  // 7x7 bf16 at batch 1024: each strip's src (25.7 MB) is more than a
  // quarter of any L3 the cache model takes for two threads.
  jit::FwdConf big = c;
  big.n = 1024;
  big.pixels = big.n * big.spatial;
  if (2 * big.pixels * jit::kFwdStrip16Avx512 * 2 > l3 / 4) {
    EXPECT_EQ(jit::fwd_strip_rule(big, 2), 0);
  }
  c.dt = DataType::kF32;
  for (auto change : {+[](jit::FwdConf* k) { k->ncx_rows = true; },
                      +[](jit::FwdConf* k) { k->phase = jit::FwdPhase::kApply; },
                      +[](jit::FwdConf* k) { k->phase = jit::FwdPhase::kReduce; },
                      +[](jit::FwdConf* k) { k->isa = jit::Isa::kPortable; },
                      +[](jit::FwdConf* k) { k->c = 2048 + 16; }}) {
    jit::FwdConf k = c;
    change(&k);
    EXPECT_FALSE(jit::fwd_strips_possible(k, jit::kFwdStripF32));
    k.dt = DataType::kBF16;
    EXPECT_EQ(jit::fwd_strip_rule(k, 2), 0);
  }
  // The variant: a width of whole 32s that divides C, below C.
  for (const auto& [variant, width] :
       std::vector<std::pair<std::string, int64_t>>{{"fwd-strips", jit::kFwdStripF32},
                                                    {"fwd-strips-64", 64},
                                                    {"fwd-strips-48", 0},
                                                    {"fwd-strips-2048", 0},
                                                    {"fwd-strips-96", 0}}) {
    jit::FwdConf k = c;
    ASSERT_TRUE(jit::apply_forward_variant(variant, &k).ok());
    EXPECT_EQ(k.strip_channels, width) << variant;
    EXPECT_EQ(k.line_walk, width > 0) << variant;
    ASSERT_TRUE(jit::apply_forward_variant("fwd-no-strips", &k).ok());
    EXPECT_EQ(k.strip_channels, 0);
    EXPECT_FALSE(k.line_walk) << "f32 without strips takes the channel blocks";
  }
}

// The statistics in groups of 1, 3 and 8 pixels (fwd-stats-groups) keep
// each channel's sums in pixel order, rounded at every step as in
// registers: the same bits as the channel-block sweeps (fwd-stats-sweeps),
// on each ISA, with blocks whole and cut short, tails, and a last group of
// fewer pixels.
TEST(JitForwardPixels, StatsGroupsSameBitsAsSweeps) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const Dims& shape :
           {Dims{3, 5, 7, 96}, Dims{2, 9, 9, 200}, Dims{37, 1, 1, 33}, Dims{4, 3, 3, 1000}}) {
        const Graph g = jit_test::forward_graph(shape, ran % 4, "NXC", dt);
        const auto inputs = jit_test::inputs_for(g, 1400 + static_cast<uint64_t>(ran));
        std::string name;
        const auto sweeps = jit_test::run_jit(g, "fwd-stats-sweeps", inputs, &name);
        EXPECT_EQ(name.find("+stats_groups"), std::string::npos) << name;
        for (int group : {1, 3, 8}) {
          const std::string variant = "fwd-stats-groups-" + std::to_string(group);
          SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + dims_to_string(shape) + " " + variant);
          const auto grouped = jit_test::run_jit(g, variant, inputs, &name);
          // The variant ran: the compiled kernel walks groups of that size.
          EXPECT_NE(name.find("+stats_groups" + std::to_string(group)), std::string::npos) << name;
          ASSERT_EQ(grouped.size(), sweeps.size());
          for (const auto& [id, buf] : grouped)
            EXPECT_TRUE(buf.bytes == sweeps.at(id).bytes) << "tensor " << id;
        }
        const auto r = compare_with_ref(g, "jit", 1400 + static_cast<uint64_t>(ran),
                                        ran % 4 == 0 ? 1e4 : 0.0, "fwd-stats-groups-3");
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

// The 16-bit statistics' walk by row length: pixel by pixel from 512 bytes
// up to 2 KiB, the prefetching sweeps below and from there. The sweeps'
// prefetches change no bit (fwd-stats-no-prefetch), and the sweeps match
// ref on data far from zero.
TEST(JitForwardPixels, StatsWalkByRowLengthAndPrefetchBits) {
  // The variant turns the prefetches off, and the generated code's key
  // says so (the bits below cannot tell).
  jit::FwdConf plain;
  ASSERT_TRUE(jit::apply_forward_variant("fwd-stats-no-prefetch", &plain).ok());
  EXPECT_FALSE(plain.stats_prefetch);
  EXPECT_NE(plain.key(), jit::FwdConf{}.key());
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;
    jit_test::IsaScope scope(isa);
    for (int64_t c : {128, 512, 1000, 1024, 2048}) {
      const Graph g = jit_test::forward_graph({2, 3, 5, c}, ran % 4, "NXC", DataType::kBF16);
      const auto inputs = jit_test::inputs_for(g, 1500 + static_cast<uint64_t>(ran));
      SCOPED_TRACE(isa + " C " + std::to_string(c));
      std::string name, plain_name;
      const auto swept = jit_test::run_jit(g, "", inputs, &name);
      const bool by_pixel =
          c * 2 >= jit::kFwdStatsGroupRowBytes && c * 2 < jit::kFwdStatsSweepRowBytes;
      EXPECT_EQ(name.find("+stats_groups1") != std::string::npos, by_pixel) << name;
      const auto plain =
          jit_test::run_jit(g, "fwd-stats-sweeps+fwd-stats-no-prefetch", inputs, &plain_name);
      const auto prefetched = jit_test::run_jit(g, "fwd-stats-sweeps", inputs, &plain_name);
      ASSERT_EQ(plain.size(), swept.size());
      for (const auto& [id, buf] : plain) {
        EXPECT_TRUE(buf.bytes == swept.at(id).bytes) << "tensor " << id;
        EXPECT_TRUE(buf.bytes == prefetched.at(id).bytes) << "tensor " << id;
      }
      const auto r = compare_with_ref(g, "jit", 1500 + static_cast<uint64_t>(ran), 1e4);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

}  // namespace
}  // namespace normgrad
