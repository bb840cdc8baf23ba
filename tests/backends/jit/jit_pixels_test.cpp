// The JIT's pixels walk (NXC, and NCX with spatial 1) on rows wider than
// the registers, against ref: the per-pixel, channel-blocked and
// channel-swept kernels make_conf chooses and every one a bench variant can
// pick, and the reduction partition, fixed by the shape alone.
#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::expect_same_bits_for_1_2_4_threads;
using jit_test::form_op;
using jit_test::fused_on_port;
using jit_test::streams;
using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

// Wide NXC rows (C > 64 on AVX-512) take the per-pixel kernels up to
// kPerPixelMaxChannels, whether or not src and diff_dst fit in the cache;
// wider rows the channel-blocked ones, f32 always and 16-bit data in half
// the L3 (per pixel from DRAM). The swept kernels are a variant only
// (NxcVariantsMatchRef).
TEST(JitBackend, WidePixelKernels) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "the wide-row kernels are AVX-512";
  int ran = 0;
  // `walk` is the kernel name's walk: "pixels" alone (per pixel) or "pixels_blocked".
  auto check = [&](const Graph& g, const std::string& what, const std::string& walk,
                   const char* feature) {
    SCOPED_TRACE(what);
    const auto r = compare_with_ref(g, "jit", static_cast<uint64_t>(ran++));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_NE(r.kernel.find(":" + walk), std::string::npos) << r.kernel;
    if (walk == "pixels") {
      EXPECT_EQ(r.kernel.find(":pixels_"), std::string::npos) << r.kernel;
    }
    EXPECT_NE(r.kernel.find(feature), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  };
  // C = 65: the apply wide, one vector and a tail; 129: the reduce wide too;
  // 320: two reduce blocks and 4 vectors left, no tail; 1000: 7 blocks and a tail.
  // Pixels: 7 (single pixels only), 30 (3 groups and 6 singles), 128. All
  // fit in the cache, and all go pixel by pixel.
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (int64_t c : {65, 129, 320, 1000}) {
      for (const Dims& px : {Dims{1, 1, 7}, Dims{2, 3, 5}, Dims{2, 8, 8}}) {
        const Op op = form_op({px[0], px[1], px[2], c}, "NXC", dt, ran % 6);
        check(one_op(op),
              std::string(dtype_name(dt)) + " C " + std::to_string(c) + " " + dims_to_string(px),
              "pixels", ":pixels");
      }
    }
  }
  // Data streamed from DRAM: src + diff_dst larger than the L3 whatever this
  // host reports (3.2 MB per image in 16 bits).
  const int64_t images = jit::cache_sizes().l3_bytes / (56 * 56 * 256 * 2 * 2) + 1;
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    const bool f32 = dt == DataType::kF32;
    const Op dram = bn_bwd({images, 56, 56, 256}, "NXC", dt, DataType::kF32, true, 3);
    auto dram_conf = jit::make_conf(dram, jit::Isa::kAvx512);
    ASSERT_TRUE(dram_conf.ok());
    EXPECT_EQ(dram_conf->walk.pixel_group, 0) << dtype_name(dt);
    EXPECT_EQ(dram_conf->walk.sweep_rows, 0) << dtype_name(dt);
    if (f32) {  // the walk at this size, against ref
      const auto r = compare_with_ref(one_op(dram), "jit", 77);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find(":pixels"), std::string::npos) << r.kernel;
      EXPECT_EQ(r.kernel.find(":pixels_"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
    // Rows wider than kPerPixelMaxChannels from DRAM: f32 takes the blocked
    // walk, 16-bit data stays per pixel; in half the L3 both are blocked.
    const int64_t wide_images = jit::cache_sizes().l3_bytes / (7 * 7 * 2048 * 2 * 2) + 1;
    static_assert(jit::kPerPixelMaxChannels < 2048, "the wide rows below");
    auto wide_conf = jit::make_conf(
        bn_bwd({wide_images, 7, 7, 2048}, "NXC", dt, DataType::kF32, true, 3), jit::Isa::kAvx512);
    ASSERT_TRUE(wide_conf.ok());
    EXPECT_EQ(wide_conf->walk.pixel_group, f32 ? jit::kPixelGroup : 0) << dtype_name(dt);
    EXPECT_EQ(wide_conf->walk.sweep_rows, 0) << dtype_name(dt);
    auto wide_cached_conf = jit::make_conf(
        bn_bwd({2, 3, 7, 2048}, "NXC", dt, DataType::kF32, true, 3), jit::Isa::kAvx512);
    ASSERT_TRUE(wide_cached_conf.ok());
    EXPECT_EQ(wide_cached_conf->walk.pixel_group, jit::kPixelGroup) << dtype_name(dt);
    // 512 channels in the cache: per pixel, as from DRAM.
    auto cached_conf = jit::make_conf(bn_bwd({4, 14, 14, 512}, "NXC", dt, DataType::kF32, true, 3),
                                      jit::Isa::kAvx512);
    ASSERT_TRUE(cached_conf.ok());
    EXPECT_EQ(cached_conf->walk.pixel_group, 0) << dtype_name(dt);
    EXPECT_EQ(cached_conf->walk.sweep_rows, 0) << dtype_name(dt);
  }
  const Op widest = bn_bwd({2, 3, 7, 2048}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  check(one_op(widest), "2x3x7x2048", "pixels_blocked", ":pixels");
  check(one_op(bn_bwd({2, 3, 7, 2048}, "NXC", DataType::kBF16, DataType::kF32, true, 3)),
        "bf16 2x3x7x2048", "pixels_blocked", ":pixels");
  // Fused producers on either port.
  for (int port : {0, 1}) {
    check(fused_on_port({3, 5, 7, 200}, "NXC", port), "fused on port " + std::to_string(port),
          "pixels", port == 0 ? "+src_" : "+diff_dst_");
  }
  // Rows padded from 150 to 160 channels in src and diff_dst, to 176 in diff_src.
  Op padded = bn_bwd({2, 5, 7, 150}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  padded.mutable_inputs()[0].strides = {5 * 7 * 160, 7 * 160, 160, 1};
  padded.mutable_inputs()[1].strides = {5 * 7 * 160, 7 * 160, 160, 1};
  padded.mutable_outputs()[0].strides = {5 * 7 * 176, 7 * 176, 176, 1};
  check(one_op(padded), "padded rows", "pixels", "+strided");
  // 5.2 MB per tensor: on a 32 MiB L3 the three take more than a quarter of
  // it (streaming stores).
  Op big = bn_bwd({4, 32, 32, 320}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  auto conf = jit::make_conf(big, jit::Isa::kAvx512);
  ASSERT_TRUE(conf.ok());
  EXPECT_EQ(conf->stream.nt_stores, streams(conf->total_elements * 4));
  check(one_op(big), "4x32x32x320", "pixels", ":pixels");
  // The chunks, groups and calls are fixed by the shape: same bits for 1, 2 and 4 threads.
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd({16, 14, 14, 320}, "NXC", DataType::kF32, DataType::kF32, true, 3)));
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd({4, 14, 14, 520}, "NXC", DataType::kBF16, DataType::kF32, true, 3)));
}

// Every NXC walk a bench variant can pick for wide rows, against ref: the
// per-pixel, channel-blocked (groups of 2, 4 and 8 pixels) and channel-swept
// kernels (calls of the default size, and of 16 KiB so that a chunk takes
// several calls into one partial), with software prefetches, and with each
// split and apply order, on the shapes of WidePixelKernels.
TEST(JitBackend, NxcVariantsMatchRef) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "the wide-row kernels are AVX-512";
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"nxc-per-pixel", "pixels"},
      {"nxc-blocked-2", "pixels_blocked"},
      {"nxc-blocked-4", "pixels_blocked"},
      {"nxc-blocked", "pixels_blocked"},
      {"nxc-swept", "pixels_swept"},
      {"nxc-swept-16", "pixels_swept"},
      {"nxc-swept-ahead", "pixels_swept"},
      {"nxc-swept-ahead-64", "pixels_swept"},
      {"nxc-swept+nxc-contiguous-split", "pixels_swept"},
      {"nxc-swept+nxc-contiguous-split+nxc-last-first-apply", "pixels_swept"},
      {"nxc-blocked+nxc-last-first-apply", "pixels_blocked"},
      {"nxc-per-pixel+nxc-adaptive-split+nxc-forward-apply", "pixels"}};
  // The walk in a kernel name: "pixels_swept" in "jit:avx512:f32/f32:pixels_swept+strided".
  auto walk_of = [](const std::string& kernel) {
    size_t at = 0;
    for (int i = 0; i < 3 && at != std::string::npos; ++i) at = kernel.find(':', at + (i > 0));
    if (at == std::string::npos) return std::string();
    const size_t end = kernel.find_first_of("+:", at + 1);
    return kernel.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
  };
  // The split and order variants change the conf as they say; by default the
  // split is adaptive and the apply runs front to back.
  const Op wide = bn_bwd({2, 8, 8, 320}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  EXPECT_FALSE(jit_test::conf_for(wide).walk.contiguous_split);
  EXPECT_FALSE(jit_test::conf_for(wide).walk.apply_last_first);
  EXPECT_TRUE(jit_test::conf_for(wide, "nxc-contiguous-split").walk.contiguous_split);
  EXPECT_TRUE(jit_test::conf_for(wide, "nxc-last-first-apply").walk.apply_last_first);
  EXPECT_FALSE(
      jit_test::conf_for(wide, "nxc-last-first-apply+nxc-forward-apply").walk.apply_last_first);
  EXPECT_FALSE(
      jit_test::conf_for(wide, "nxc-contiguous-split+nxc-adaptive-split").walk.contiguous_split);
  uint64_t seed = 0;
  for (const auto& [variant, feature] : variants) {
    auto check = [&, variant = variant, feature = feature](const Graph& g, const std::string& what,
                                                           bool wide = true) {
      SCOPED_TRACE(variant + " " + what);
      const auto r = compare_with_ref(g, "jit", ++seed, 0.0, variant);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      if (wide) {
        EXPECT_EQ(walk_of(r.kernel), feature) << r.kernel;
      }
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    };
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (int64_t c : {65, 129, 320, 1000}) {
        for (const Dims& px : {Dims{1, 1, 7}, Dims{2, 3, 5}, Dims{2, 8, 8}}) {
          const Op op = form_op({px[0], px[1], px[2], c}, "NXC", dt, static_cast<int>(seed % 6));
          check(one_op(op),
                std::string(dtype_name(dt)) + " C " + std::to_string(c) + " " + dims_to_string(px));
        }
      }
    }
    for (int port : {0, 1}) {
      check(fused_on_port({3, 5, 7, 200}, "NXC", port), "fused on port " + std::to_string(port));
      check(fused_on_port({3, 5, 7, 200}, "NXC", port, DataType::kBF16),
            "bf16 fused on port " + std::to_string(port));
    }
    Op padded = bn_bwd({2, 5, 7, 150}, "NXC", DataType::kF32, DataType::kF32, true, 3);
    padded.mutable_inputs()[0].strides = {5 * 7 * 160, 7 * 160, 160, 1};
    padded.mutable_inputs()[1].strides = {5 * 7 * 160, 7 * 160, 160, 1};
    padded.mutable_outputs()[0].strides = {5 * 7 * 176, 7 * 176, 176, 1};
    check(one_op(padded), "padded rows");
    // Short rows keep the kernels that hold every channel in registers.
    check(one_op(bn_bwd({2, 5, 7, 48}, "NXC", DataType::kF32, DataType::kF32, true, 3)), "C 48",
          false);
  }
  // 4 MiB of src + diff_dst in 16 KiB calls: several calls per chunk, and the
  // same bits for 1, 2 and 4 threads, each taking a contiguous share and
  // applying it last chunk first.
  const Graph g = one_op(bn_bwd({8, 16, 16, 1000}, "NXC", DataType::kF32, DataType::kF32, true, 3));
  auto runs = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                              static_cast<size_t>(threads));
    CompileOptions options{"jit"};
    options.jit_variant = "nxc-swept-16+nxc-contiguous-split+nxc-last-first-apply";
    auto cg = CompiledGraph::compile(g, options);
    EXPECT_TRUE(cg.ok()) << cg.status().to_string();
    auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 5, nullptr);
    EXPECT_TRUE(inputs.ok());
    auto outs = testing_util::run_outputs(*cg, *inputs);
    EXPECT_TRUE(outs.ok()) << outs.status().to_string();
    std::map<int64_t, std::vector<char>> bytes;
    for (auto& [id, b] : *outs) bytes[id].assign(b.bytes.begin(), b.bytes.end());
    return bytes;
  };
  const auto one = runs(1), two = runs(2), four = runs(4);
  for (const auto& [id, b] : one) {
    EXPECT_EQ(b, two.at(id)) << "tensor " << id;
    EXPECT_EQ(b, four.at(id)) << "tensor " << id;
  }
  CompileOptions bad{"jit"};
  bad.jit_variant = "nxc-blocked-99";
  const auto refused = CompiledGraph::compile(g, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("PIXELS must be in [1, 16]"), std::string::npos)
      << refused.status().to_string();
}

// The pixels walk's reduction partition: a function of the shape alone, chunks
// of at most ~1 MiB of src + diff_dst, and when there are few, a multiple of 8
// chunks of one size, so that 2, 4 or 8 threads share them evenly.
TEST(JitBackend, PixelChunksAreEvenAndFixedByShape) {
  struct Case {
    int64_t pixels, bytes_per_pixel;
  } cases[] = {{784, 4096},    {784, 2048}, {784, 1024}, {6272, 8192},   {1568, 16384},
               {100352, 2048}, {17, 4096},  {5, 64},     {1000003, 512}, {1 << 20, 1 << 20}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.pixels) + " pixels of " + std::to_string(k.bytes_per_pixel));
    const int64_t rows = jit::pixel_chunk_rows(k.pixels, k.bytes_per_pixel);
    ASSERT_GE(rows, 1);
    const int64_t chunks = (k.pixels + rows - 1) / rows;
    const int64_t max_rows =
        std::max<int64_t>(jit::kMinChunkRows, jit::kChunkBytes / k.bytes_per_pixel);
    if (chunks >= jit::kManyChunks) {
      EXPECT_LE(rows, max_rows);
      continue;
    }
    // Every chunk but the last is full; the last is short by less than one
    // pixel per chunk, so an even share of 8 chunks stays even.
    EXPECT_LT(chunks * rows - k.pixels, chunks) << chunks << " x " << rows;
    if (k.pixels >= jit::kChunkMultiple * jit::kMinChunkRows) {
      EXPECT_EQ(chunks % jit::kChunkMultiple, 0) << chunks << " x " << rows;
    }
  }
  // The 4x512x14x14 cases of --shapes=cached, which had 4 and 2 uneven chunks.
  EXPECT_EQ(jit::pixel_chunk_rows(784, 4096), 98);  // 8 chunks of 98
  EXPECT_EQ(jit::pixel_chunk_rows(784, 2048), 98);
}

}  // namespace
}  // namespace normgrad
