// The JIT backend against ref on every code path this machine can run
// (AVX-512, AVX2+F16C and the portable C++ path, forced with NORMGRAD_JIT),
// channel and spatial tails, all forms, large offsets, and bitwise equality of
// results across thread counts.
#include <cstdlib>

#include <tbb/global_control.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

// The ISAs to test here: each one the CPU has, plus the portable path.
std::vector<std::string> isas() {
  std::vector<std::string> v = {"portable"};
  const jit::Isa best = jit::detect_isa("avx512");
  if (best != jit::Isa::kPortable) v.push_back("avx2");
  if (best == jit::Isa::kAvx512) v.push_back("avx512");
  return v;
}

struct IsaScope {
  explicit IsaScope(const std::string& isa) { setenv("NORMGRAD_JIT", isa.c_str(), 1); }
  ~IsaScope() { unsetenv("NORMGRAD_JIT"); }
};

// Forms 3-5 of make_case: frozen statistics, training with diff_src only, inverse std.
void apply_form(Op& op, int form) {
  if (form == 3) op.set_attr("is_training", false);
  if (form == 4) op.set_attr("is_training", true);
  if (form == 5) op.set_attr("is_training", true).set_attr("variance_is_inv_std", true);
}

Op make_case(DataType dt, DataType sdt, const std::string& fmt, int rank, int64_t c,
             int64_t spatial_scale, int form) {
  Dims shape = {rank == 2 ? 8 : 2};
  const int64_t spatial[] = {7 * spatial_scale, 3, 5};
  if (fmt == "NCX") shape.push_back(c);
  for (int i = 0; i < rank - 2; ++i) shape.push_back(spatial[i]);
  if (fmt == "NXC") shape.push_back(c);
  const bool gamma = form != 1;
  const int outputs = form == 2 || form == 4 ? 1 : 3;
  Op op = bn_bwd(shape, fmt, dt, sdt, gamma, outputs, 1e-3f);
  apply_form(op, form);
  return op;
}

TEST(JitBackend, SweepOnEveryCodePath) {
  const std::pair<DataType, DataType> dtypes[] = {{DataType::kF32, DataType::kF32},
                                                  {DataType::kBF16, DataType::kF32},
                                                  {DataType::kBF16, DataType::kBF16},
                                                  {DataType::kF16, DataType::kF32}};
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (auto [dt, sdt] : dtypes) {
      for (const char* fmt : {"NCX", "NXC"}) {
        for (int rank = 2; rank <= 5; ++rank) {
          for (int64_t c : {1, 3, 16, 17, 64, 251}) {
            const int form =
                ran % 6;  // 0: 3 outputs + gamma, 1: gamma = 1, 2: oneDNN single output,
                          // 3: frozen + gamma, 4: training diff_src only, 5: inverse std
            Op op = make_case(dt, sdt, fmt, rank, c, 1, form);
            SCOPED_TRACE(isa + " " + dtype_name(dt) + "/" + dtype_name(sdt) + " " + fmt + " " +
                         dims_to_string(op.inputs()[0].dims) + " form " + std::to_string(form));
            const auto r = compare_with_ref(one_op(op), "jit", static_cast<uint64_t>(ran));
            ASSERT_TRUE(r.status.ok()) << r.status.to_string();
            EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
            EXPECT_LE(r.worst_ratio, 1.0) << r.report;
            ++ran;
          }
        }
      }
    }
  }
  EXPECT_EQ(ran, static_cast<int>(isas().size()) * 4 * 2 * 4 * 6);
}

TEST(JitBackend, TailsSpatialOneAndLargeOffsets) {
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    // Spatial 1 (NCX becomes the pixels walk), N = 1, odd spatial sizes, all tails.
    const Dims shapes[] = {{1, 33, 1, 1}, {1, 5, 3, 3}, {3, 7, 1, 13}, {2, 19, 9, 11}};
    for (const Dims& s : shapes) {
      for (const char* fmt : {"NCX", "NXC"}) {
        Dims shape = s;
        if (std::string(fmt) == "NXC")
          std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
        for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
          Op op = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
          SCOPED_TRACE(isa + " " + fmt + " " + dims_to_string(shape) + " " + dtype_name(dt));
          const auto r = compare_with_ref(one_op(op), "jit");
          ASSERT_TRUE(r.status.ok()) << r.status.to_string();
          EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        }
      }
    }
    // mean 1e4: the reduction uses the given mean, so no catastrophic cancellation.
    for (const char* fmt : {"NCX", "NXC"}) {
      Op op = bn_bwd({8, 24, 12, 12}, fmt, DataType::kF32, DataType::kF32, true, 3);
      const auto r = compare_with_ref(one_op(op), "jit", 7, 1e4);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << isa << " " << fmt << ": " << r.report;
    }
  }
}

// Runs `g` on the JIT with `threads` threads, capped through oneTBB's
// global_control or, with `through_api`, normgrad::set_num_threads; returns
// every output's bytes.
std::map<int64_t, std::vector<char>> run_with_threads(const Graph& g, int threads,
                                                      bool through_api = false) {
  tbb::global_control limit(
      tbb::global_control::max_allowed_parallelism,
      through_api ? tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)
                  : static_cast<size_t>(threads));
  if (through_api) set_num_threads(threads);
  auto cg = CompiledGraph::compile(g, CompileOptions{"jit"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 11, &sources);
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> outs;
  std::map<int64_t, void*> p;
  for (const LogicalTensor& lt : cg->outputs())
    p[lt.id] = outs.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
  EXPECT_TRUE(cg->execute(in, p).ok());
  std::map<int64_t, std::vector<char>> bytes;
  for (auto& [id, b] : outs) bytes[id].assign(b.bytes.begin(), b.bytes.end());
  return bytes;
}

TEST(JitBackend, BitwiseIdenticalForAnyThreadCount) {
  for (const char* fmt : {"NCX", "NXC"}) {
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      // Above the single-thread threshold, with many reduction chunks.
      const Dims shape = std::string(fmt) == "NCX" ? Dims{16, 40, 28, 28} : Dims{16, 28, 28, 40};
      Graph g = one_op(bn_bwd(shape, fmt, dt, DataType::kF32, true, 3));
      const auto one = run_with_threads(g, 1);
      const auto two = run_with_threads(g, 2);
      const auto four = run_with_threads(g, 4);
      for (const auto& [id, b] : one) {
        EXPECT_EQ(b, two.at(id)) << fmt << " " << dtype_name(dt) << " tensor " << id;
        EXPECT_EQ(b, four.at(id)) << fmt << " " << dtype_name(dt) << " tensor " << id;
      }
    }
  }
}

// normgrad::set_num_threads caps the JIT through its own oneTBB arena (no
// tbb::global_control in the caller), and the bits do not change.
TEST(JitBackend, SetNumThreadsCapsTheJit) {
  Graph g = one_op(bn_bwd({16, 40, 28, 28}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  auto run = [&](int threads) {
    auto bytes = run_with_threads(g, threads, /*through_api=*/true);
    return std::make_pair(jit::last_max_concurrency(), bytes);
  };
  const auto one = run(1);
  EXPECT_EQ(one.first, 1);
  EXPECT_EQ(num_threads(), 1);
  const auto two = run(2);
  EXPECT_EQ(two.first, 2);
  EXPECT_EQ(one.second, two.second);
  set_num_threads(0);  // back to the default for the other tests
  EXPECT_EQ(num_threads(), 0);
}

// Whether the AVX-512 JIT streams diff_src of `tensor_bytes`: past half the
// L3, or when src, diff_dst and diff_src together exceed the L3.
bool streams(int64_t tensor_bytes) {
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  return tensor_bytes > l3 / 2 || 3 * tensor_bytes > l3;
}

TEST(JitBackend, StreamingStoresOnLargeOutputs) {
  // dx larger than half the L3 takes the non-temporal store path (AVX-512); rows
  // of 99x99 f32 alternate between aligned (streaming) and unaligned (plain)
  // starts. Then tensors of about 0.4x the L3 (batch sized from this host's
  // L3): under half of it, but the three together exceed it, so they stream too.
  const jit::Isa isa = jit::detect_isa();
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  const int64_t n7 = l3 * 2 / 5 / (64 * 49 * 4), n14 = l3 * 2 / 5 / (64 * 196 * 2);
  const struct {
    Dims shape;
    const char* fmt;
    DataType dt;
  } cases[] = {
      {{8, 64, 99, 99}, "NCX", DataType::kF32},    {{8, 99, 99, 64}, "NXC", DataType::kF32},
      {{8, 64, 128, 128}, "NCX", DataType::kBF16}, {{8, 128, 128, 64}, "NXC", DataType::kF16},
      {{n7, 64, 7, 7}, "NCX", DataType::kF32},     {{n7, 7, 7, 64}, "NXC", DataType::kF32},
      {{n14, 14, 14, 64}, "NXC", DataType::kBF16}};
  for (const auto& c : cases) {
    Op op = bn_bwd(c.shape, c.fmt, c.dt, DataType::kF32, true, 3);
    auto conf = jit::make_conf(op, isa);
    ASSERT_TRUE(conf.ok());
    const int64_t bytes = conf->total_elements * dtype_size(c.dt);
    EXPECT_EQ(conf->streaming_stores, isa == jit::Isa::kAvx512 && streams(bytes))
        << dims_to_string(c.shape);
    if (c.shape[0] == n7 || c.shape[0] == n14) {  // the second rule alone
      EXPECT_LE(bytes, l3 / 2) << dims_to_string(c.shape);
      EXPECT_EQ(conf->streaming_stores, isa == jit::Isa::kAvx512) << dims_to_string(c.shape);
    }
    const auto r = compare_with_ref(one_op(op), "jit", 3);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << dims_to_string(c.shape) << " " << r.report;
  }
}

void expect_same_bits_for_1_2_4_threads(const Graph& g) {
  const auto one = run_with_threads(g, 1);
  const auto two = run_with_threads(g, 2), four = run_with_threads(g, 4);
  for (const auto& [id, b] : one) {
    EXPECT_EQ(b, two.at(id)) << "tensor " << id;
    EXPECT_EQ(b, four.at(id)) << "tensor " << id;
  }
}

// A ReLUBackward (port 0: src) or an Add (port 1: diff_dst) feeding an f32
// batch-norm backward.
Graph fused_on_port(const Dims& shape, const char* fmt, int port, DataType dt = DataType::kF32) {
  Op pre(1, port == 0 ? OpKind::kReLUBackward : OpKind::kAdd, "pre");
  pre.add_input(testing_util::lt(30, dt, shape)).add_input(testing_util::lt(31, dt, shape));
  pre.add_output(testing_util::lt(20, dt, shape));
  Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  bn.mutable_inputs()[port].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(pre).ok());
  EXPECT_TRUE(g.add_op(bn).ok());
  return g;
}

// The channel-blocked pixel kernels (channels-last rows wider than the
// registers, AVX-512; f32 always, bf16/f16 when src and diff_dst fit in half
// the L3): whole channel blocks, leftover vectors, channel tails, groups of
// pixels and the single pixels after them, every output form and dtype, fused
// producers, padded rows, streaming stores, and the same bits for any thread count.
TEST(JitBackend, ChannelBlockedPixelKernels) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "the blocked kernels are AVX-512";
  int ran = 0;
  auto check = [&](const Graph& g, const std::string& what, const char* feature) {
    SCOPED_TRACE(what);
    const auto r = compare_with_ref(g, "jit", static_cast<uint64_t>(ran++));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_NE(r.kernel.find("pixels_blocked"), std::string::npos) << r.kernel;
    EXPECT_NE(r.kernel.find(feature), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  };
  // C = 65: apply blocked, one vector and a tail; 129: reduce blocked too;
  // 320: two reduce blocks and 4 vectors left, no tail; 1000: 7 blocks and a tail.
  // Pixels: 7 (single pixels only), 30 (3 groups and 6 singles), 128.
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (int64_t c : {65, 129, 320, 1000}) {
      for (const Dims& px : {Dims{1, 1, 7}, Dims{2, 3, 5}, Dims{2, 8, 8}}) {
        Op op = bn_bwd({px[0], px[1], px[2], c}, "NXC", dt, DataType::kF32, ran % 6 != 1,
                       ran % 6 == 2 || ran % 6 == 4 ? 1 : 3, 1e-3f);
        apply_form(op, ran % 6);
        check(one_op(op),
              std::string(dtype_name(dt)) + " C " + std::to_string(c) + " " + dims_to_string(px),
              ":pixels");
      }
    }
  }
  // 16-bit data streamed from DRAM keeps the per-pixel kernels (faster there):
  // src + diff_dst larger than the L3 whatever this host reports (3.2 MB per image).
  const int64_t images = jit::cache_sizes().l3_bytes / (56 * 56 * 256 * 2 * 2) + 1;
  for (DataType dt : {DataType::kBF16, DataType::kF16}) {
    const Op dram = bn_bwd({images, 56, 56, 256}, "NXC", dt, DataType::kF32, true, 3);
    auto dram_conf = jit::make_conf(dram, jit::Isa::kAvx512);
    ASSERT_TRUE(dram_conf.ok());
    EXPECT_EQ(dram_conf->pixel_group, 0) << dtype_name(dt);
    const Op cached = bn_bwd({4, 14, 14, 512}, "NXC", dt, DataType::kF32, true, 3);
    auto cached_conf = jit::make_conf(cached, jit::Isa::kAvx512);
    ASSERT_TRUE(cached_conf.ok());
    EXPECT_EQ(cached_conf->pixel_group,
              4 * 14 * 14 * 512 * 2 * 2 <= jit::cache_sizes().l3_bytes / 2 ? jit::kPixelGroup : 0)
        << dtype_name(dt);
  }
  // Fused producers on either port.
  for (int port : {0, 1}) {
    check(fused_on_port({3, 5, 7, 200}, "NXC", port), "fused on port " + std::to_string(port),
          port == 0 ? "+src_" : "+diff_dst_");
  }
  // Rows padded from 150 to 160 channels in src and diff_dst, to 176 in diff_src.
  Op padded = bn_bwd({2, 5, 7, 150}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  padded.mutable_inputs()[0].strides = {5 * 7 * 160, 7 * 160, 160, 1};
  padded.mutable_inputs()[1].strides = {5 * 7 * 160, 7 * 160, 160, 1};
  padded.mutable_outputs()[0].strides = {5 * 7 * 176, 7 * 176, 176, 1};
  check(one_op(padded), "padded rows", "+strided");
  // diff_src larger than half the L3 (on a 32 MiB L3): streaming stores.
  Op big = bn_bwd({8, 50, 50, 320}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  auto conf = jit::make_conf(big, jit::Isa::kAvx512);
  ASSERT_TRUE(conf.ok());
  EXPECT_EQ(conf->streaming_stores, streams(conf->total_elements * 4));
  check(one_op(big), "8x50x50x320", ":pixels");
  // The groups and blocks are fixed by the shape: same bits for 1, 2 and 4 threads.
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd({16, 14, 14, 320}, "NXC", DataType::kF32, DataType::kF32, true, 3)));
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd({4, 14, 14, 520}, "NXC", DataType::kBF16, DataType::kF32, true, 3)));
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

// The grouped rows kernels (short NCX rows of adjacent channels) on every
// path (AVX-512, AVX2, portable): groups whole and partial, rows on the short-row boundary and just
// past it, every output form, fused producers, padded batch strides, more
// images than one reduce call takes, streaming stores, and the same bits for
// any thread count.
TEST(JitBackend, GroupedRowsKernels) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    auto check = [&](const Graph& g, const std::string& what, bool grouped) {
      SCOPED_TRACE(isa + " " + what);
      const auto r = compare_with_ref(g, "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.kernel.find("rows_grouped") != std::string::npos, grouped) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    };
    // 19 channels: 2 whole groups of 8 and 3 left (AVX-512), 4 of 4 and 3 (AVX2);
    // 8: whole groups only; 3: fewer channels than a group. 16x16 f32 and
    // 16x32 bf16 rows are 1 KiB, the longest short rows; 17x17 f32 is past it.
    struct Case {
      Dims shape;
      DataType dt;
      bool grouped;
    } cases[] = {{{4, 19, 7, 7}, DataType::kF32, true},    {{2, 8, 14, 14}, DataType::kF32, true},
                 {{5, 3, 3, 5}, DataType::kBF16, true},    {{2, 9, 16, 16}, DataType::kF32, true},
                 {{2, 9, 16, 32}, DataType::kBF16, true},  {{2, 9, 17, 17}, DataType::kF32, false},
                 {{3, 21, 7, 7}, DataType::kF16, true},    {{2, 11, 5}, DataType::kF32, true},
                 {{2, 11, 2, 3, 5}, DataType::kBF16, true}};
    for (const Case& k : cases) {
      for (int form = 0; form < 6; ++form) {
        Op op = bn_bwd(k.shape, "NCX", k.dt, DataType::kF32, form != 1,
                       form == 2 || form == 4 ? 1 : 3, 1e-3f);
        apply_form(op, form);
        check(one_op(op),
              dims_to_string(k.shape) + " " + dtype_name(k.dt) + " form " + std::to_string(form),
              k.grouped);
      }
    }
    // Fused producers on either port.
    for (int port : {0, 1}) {
      check(fused_on_port({3, 13, 7, 7}, "NCX", port), "fused on port " + std::to_string(port),
            true);
    }
    // Images padded apart (channels still adjacent): 10x5x5 per image padded to
    // 300 elements in src and diff_dst and to 260 in diff_src.
    Op padded = bn_bwd({3, 10, 5, 5}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    padded.mutable_inputs()[0].strides = {300, 25, 5, 1};
    padded.mutable_inputs()[1].strides = {300, 25, 5, 1};
    padded.mutable_outputs()[0].strides = {260, 25, 5, 1};
    check(one_op(padded), "padded images", true);
    // 300 images: two reduce calls per group.
    check(one_op(bn_bwd({300, 10, 2, 3}, "NCX", DataType::kF32, DataType::kF32, true, 3)),
          "300 images", true);
    // diff_src larger than half the L3 with rows of whole vectors: streaming stores.
    Op big = bn_bwd({33, 512, 16, 16}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    auto conf = jit::make_conf(big, jit::detect_isa());
    ASSERT_TRUE(conf.ok());
    EXPECT_GT(conf->channel_group, 0);
    EXPECT_EQ(conf->streaming_stores, isa == "avx512" && streams(conf->total_elements * 4));
    check(one_op(big), "33x512x16x16", true);
    // The groups and reduce calls are fixed by the shape: same bits for 1, 2 and 4 threads.
    expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({16, 203, 7, 7}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
  }
}

// Long NCX rows of 16-bit data, rows far apart: the reduce prefetches the rows
// kReducePrefetchRows ahead in all but the last rows of a call. Batches of 1
// to 5 (no prefetching rows, then some), padded rows (one call per image),
// fused producers (their operands prefetched too), and the cases that keep
// the plain reduce: f32, one channel (the rows are one stream), short rows.
TEST(JitBackend, LongSixteenBitRowsPrefetchAhead) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    const jit::Isa jit_isa = jit::detect_isa();
    auto check = [&](const Graph& g, const std::string& what, const std::string& want = "") {
      SCOPED_TRACE(isa + " " + what);
      const auto r = compare_with_ref(g, "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
      EXPECT_NE(r.kernel.find(want), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    };
    auto prefetches = [&](const Op& op) {
      auto conf = jit::make_conf(op, jit_isa);
      EXPECT_TRUE(conf.ok()) << conf.status().to_string();
      return conf.ok() && conf->reduce_prefetch_rows;
    };
    for (DataType dt : {DataType::kBF16, DataType::kF16}) {
      for (int64_t n : {1, 2, 3, 5}) {
        for (int form = 0; form < 6; form += 2) {
          // 24x24 16-bit rows are 1152 bytes, past kShortRowBytes; 3 channels.
          Op op = bn_bwd({n, 3, 24, 24}, "NCX", dt, DataType::kF32, form != 1,
                         form == 2 || form == 4 ? 1 : 3, 1e-3f);
          apply_form(op, form);
          EXPECT_TRUE(prefetches(op));
          check(one_op(op), dims_to_string(op.inputs()[0].dims) + " " + dtype_name(dt) + " form " +
                                std::to_string(form));
        }
      }
      for (int port : {0, 1}) {
        check(fused_on_port({4, 5, 23, 29}, "NCX", port, dt),
              std::string("fused on port ") + std::to_string(port) + " " + dtype_name(dt),
              port == 0 ? ":rows+src_" : ":rows+diff_dst_");
      }
    }
    // Rows padded from 40 to 48 elements: one reduce call per (channel, image)
    // over its 30 rows, each call prefetching within its image.
    Op padded = bn_bwd({3, 4, 30, 40}, "NCX", DataType::kBF16, DataType::kF32, true, 3);
    padded.mutable_inputs()[0].strides = {4 * 30 * 48, 30 * 48, 48, 1};
    padded.mutable_inputs()[1].strides = {4 * 30 * 48, 30 * 48, 48, 1};
    EXPECT_FALSE(prefetches(padded));  // 80-byte rows: short
    Op padded_long = bn_bwd({3, 4, 6, 600}, "NCX", DataType::kBF16, DataType::kF32, true, 3);
    padded_long.mutable_inputs()[0].strides = {4 * 6 * 608, 6 * 608, 608, 1};
    padded_long.mutable_inputs()[1].strides = {4 * 6 * 608, 6 * 608, 608, 1};
    EXPECT_TRUE(prefetches(padded_long));
    check(one_op(padded_long), "padded long rows");
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 3, 24, 24}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 1, 24, 24}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 3, 16, 32}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
    expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({6, 40, 28, 28}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
  }
}

// Grouped short rows that do not start on a vector (7x7, 14x14) stream
// diff_src through a 64-byte-aligned bounce block when it is larger than half
// the L3 (AVX-512): blocks whose ends fall inside lines (1568 bytes per group
// of 8 7x7 f32 channels), images that start off a line (203 channels), a last
// group of 3 channels, blocks of whole lines (16 channels of 14x14 f32), and
// a fused producer. Batches are sized from the L3 this host reports.
TEST(JitBackend, GroupedRowsStreamThroughBounceBlock) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "streaming stores are AVX-512";
  const int64_t half_l3 = jit::cache_sizes().l3_bytes / 2;
  const struct {
    int64_t c, h, w;
    DataType dt;
  } cases[] = {{203, 7, 7, DataType::kF32},
               {16, 14, 14, DataType::kF32},
               {203, 14, 14, DataType::kBF16},
               {37, 5, 5, DataType::kF16}};
  int ran = 0;
  for (const auto& k : cases) {
    const int64_t image_bytes = k.c * k.h * k.w * dtype_size(k.dt);
    const int64_t n = half_l3 / image_bytes + 1;
    Op op = bn_bwd({n, k.c, k.h, k.w}, "NCX", k.dt, DataType::kF32, true, 3, 1e-3f);
    const std::string what = dims_to_string({n, k.c, k.h, k.w}) + " " + dtype_name(k.dt);
    auto conf = jit::make_conf(op, jit::Isa::kAvx512);
    ASSERT_TRUE(conf.ok());
    EXPECT_GT(conf->channel_group, 0) << what;
    EXPECT_TRUE(conf->streaming_stores) << what;
    EXPECT_NE(conf->cols % 16, 0) << what;
    const auto r = compare_with_ref(one_op(op), "jit", static_cast<uint64_t>(ran++));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_NE(r.kernel.find("rows_grouped"), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << what << " " << r.report;
  }
  // A fused ReLUBackward on src: the kernel saves r12/r13 next to rbx.
  const int64_t n = half_l3 / (203 * 49 * 4) + 1;
  const auto r = compare_with_ref(fused_on_port({n, 203, 7, 7}, "NCX", 0), "jit", 99);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_NE(r.kernel.find("rows_grouped+src_"), std::string::npos) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << "fused " << r.report;
}

// Runs an f32 NCX batch norm backward of `shape` on the JIT into output
// buffers filled with 0x7f bytes, diff_src `shift` bytes past a line, its
// images `dx_image_stride` elements apart (0: dense); returns each output's
// bytes from its start to the end of the allocation, 64 - shift bytes past the
// buffer the strides address (diff_src's id in *dx_id).
std::map<int64_t, std::vector<char>> run_jit_into(const Dims& shape, int64_t dx_image_stride,
                                                  int shift, int64_t* dx_id = nullptr) {
  Op op = bn_bwd(shape, "NCX", DataType::kF32, DataType::kF32, true, 3);
  if (dx_image_stride > 0)
    op.mutable_outputs()[0].strides = {dx_image_stride, shape[2] * shape[3], shape[3], 1};
  auto cg = CompiledGraph::compile(one_op(op), CompileOptions{"jit"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return {};
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 5, &sources);
  EXPECT_TRUE(inputs.ok());
  if (!inputs.ok()) return {};
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, std::vector<char, oracle::AlignedAllocator<char>>> storage;
  std::map<int64_t, std::pair<void*, size_t>> p;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt : cg->outputs()) {
    const auto bytes = static_cast<size_t>(*lt.buffer_bytes());
    auto& b = storage[lt.id];
    b.assign(bytes + 64, static_cast<char>(0x7f));
    const size_t off = lt.dims.size() == 4 ? static_cast<size_t>(shift) : 0;
    p[lt.id] = {b.data() + off, bytes + 64 - off};
    out[lt.id] = b.data() + off;
  }
  const LogicalTensor& dx = cg->outputs()[0];
  EXPECT_EQ(dx.dims.size(), 4u);
  if (dx_id != nullptr) *dx_id = dx.id;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(out[dx.id]) % 64, static_cast<uintptr_t>(shift));
  EXPECT_TRUE(cg->execute(in, out).ok());
  std::map<int64_t, std::vector<char>> result;
  for (auto& [id, q] : p) {
    const char* d = static_cast<const char*>(q.first);
    result[id].assign(d, d + q.second);
  }
  return result;
}

// The grouped apply's linear blocks (jit::grouped_linear_blocks): each
// image's block of a group computed as one run of vectors over diff_src's
// lines, lanes of adjacent channels blended; with streaming stores (batches
// past half the L3) the lines inside a block stream. Cases: 14x14 f32 and
// bf16 blocks of whole lines; 7x7 f32 blocks starting at 0 and 32 bytes into
// a line, 7x7 bf16 at 0, 16, 32 and 48; a last group of 4 14x14 f32 channels
// (its block ends on a vector); 2x2 rows, 4 channels to a vector, and 3x3
// rows, up to 3, at 0 and 32 bytes. With
// diff_src's images padded to whole lines, last groups of 3 channels, whose
// block ends inside a vector (lanes of up to 4 channels, some missing). Each
// case streaming and cached. Then a fused producer; diff_src 4 bytes off a
// line (per-channel rows instead) and 32 bytes (the groups' phases swapped),
// the same bits; and the padding between padded diff_src images untouched.
TEST(JitBackend, GroupedRowsLinearBlocks) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "the linear blocks are AVX-512";
  const int64_t half_l3 = jit::cache_sizes().l3_bytes / 2;
  const struct {
    int64_t c, h, w;
    DataType dt;
    int64_t dx_image_stride;  // 0: dense
    size_t phases;
  } cases[] = {{16, 14, 14, DataType::kF32, 0, 1},    {20, 14, 14, DataType::kF32, 0, 1},
               {200, 14, 14, DataType::kBF16, 0, 1},  {16, 7, 7, DataType::kF32, 0, 2},
               {32, 7, 7, DataType::kBF16, 0, 4},     {204, 2, 2, DataType::kF32, 0, 1},
               {19, 14, 14, DataType::kF32, 3728, 1}, {203, 14, 14, DataType::kBF16, 39808, 1},
               {19, 14, 14, DataType::kF16, 3744, 1}, {203, 2, 2, DataType::kF32, 816, 1},
               {19, 7, 7, DataType::kF32, 944, 2},    {16, 3, 3, DataType::kF32, 0, 2}};
  int ran = 0;
  auto batch_for = [&](int64_t image_bytes) { return half_l3 / image_bytes + 1; };
  for (const auto& k : cases) {
    for (bool streaming : {true, false}) {
      const int64_t n = streaming ? batch_for(k.c * k.h * k.w * dtype_size(k.dt)) : 3;
      const Dims shape = {n, k.c, k.h, k.w};
      Op op = bn_bwd(shape, "NCX", k.dt, DataType::kF32, true, 3, 1e-3f);
      if (k.dx_image_stride > 0)
        op.mutable_outputs()[0].strides = {k.dx_image_stride, k.h * k.w, k.w, 1};
      const std::string what = dims_to_string(shape) + " " + dtype_name(k.dt) +
                               " diff_src images " + std::to_string(k.dx_image_stride);
      auto conf = jit::make_conf(op, jit::Isa::kAvx512);
      ASSERT_TRUE(conf.ok());
      EXPECT_GT(conf->channel_group, 0) << what;
      EXPECT_EQ(conf->streaming_stores, streaming) << what;
      EXPECT_TRUE(jit::grouped_linear_blocks(*conf)) << what;
      EXPECT_EQ(jit::grouped_linear_phases(*conf).size(), k.phases) << what;
      const auto r = compare_with_ref(one_op(op), "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("rows_grouped"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << what << " " << r.report;
    }
  }
  // Not linear: rows of whole vectors (16x16 f32); 19 dense 14x14 f32
  // channels put images off lines.
  for (const Dims& shape : {Dims{3, 16, 16, 16}, Dims{3, 19, 14, 14}}) {
    auto conf = jit::make_conf(bn_bwd(shape, "NCX", DataType::kF32, DataType::kF32, true, 3),
                               jit::Isa::kAvx512);
    ASSERT_TRUE(conf.ok());
    EXPECT_GT(conf->channel_group, 0) << dims_to_string(shape);
    EXPECT_FALSE(jit::grouped_linear_blocks(*conf)) << dims_to_string(shape);
  }
  for (bool streaming : {true, false}) {
    const Dims fused_shape = {streaming ? batch_for(20 * 196 * 4) : 3, 20, 14, 14};
    const auto r = compare_with_ref(fused_on_port(fused_shape, "NCX", 1), "jit", 98);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_NE(r.kernel.find("rows_grouped+diff_dst_"), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << "fused " << r.report;
  }

  // diff_src 4 or 32 bytes past a line, streaming and cached.
  for (const Dims& shape : {Dims{batch_for(20 * 196 * 4), 20, 14, 14}, Dims{3, 20, 14, 14},
                            Dims{batch_for(16 * 49 * 4), 16, 7, 7}, Dims{3, 16, 7, 7}}) {
    const auto on_line = run_jit_into(shape, 0, 0);
    ASSERT_FALSE(on_line.empty());
    for (int shift : {4, 32}) {
      const auto off_line = run_jit_into(shape, 0, shift);
      for (const auto& [id, bytes] : on_line) {
        const std::vector<char>& other = off_line.at(id);
        const size_t size = bytes.size() - 64;  // the buffer, without the slack past it
        ASSERT_GE(other.size(), size);
        EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + size, other.begin()))
            << dims_to_string(shape) << " shift " << shift << " tensor " << id;
      }
    }
  }
  // The padding between padded diff_src images left as it was (0x7f bytes).
  for (const Dims& shape : {Dims{batch_for(19 * 196 * 4), 19, 14, 14}, Dims{3, 19, 14, 14}}) {
    int64_t dx_id = -1;
    const auto padded = run_jit_into(shape, 3728, 0, &dx_id);
    ASSERT_FALSE(padded.empty());
    const std::vector<char>& dx = padded.at(dx_id);
    const int64_t image = 3728 * 4, rows = 19 * 196 * 4;  // bytes
    ASSERT_EQ(dx.size(), static_cast<size_t>((shape[0] - 1) * image + rows + 64));
    int64_t touched = 0;
    for (int64_t b = rows; b < static_cast<int64_t>(dx.size()); ++b)
      touched += b % image >= rows && dx[static_cast<size_t>(b)] != 0x7f;
    EXPECT_EQ(touched, 0) << dims_to_string(shape) << ": bytes of padding written";
  }
}

TEST(JitBackend, DeclinesWithReasons) {
  auto reason = [](const Op& op) { return compare_with_ref(one_op(op), "jit").status; };
  Op strided_stats = bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  strided_stats.mutable_inputs()[2].strides = {2};
  EXPECT_STATUS_HAS(reason(strided_stats), "the JIT takes dense statistics; input 2 is strided");
  EXPECT_STATUS_HAS(reason(bn_bwd({0, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3)),
                    "empty tensors are left to ref");
  Op relu(0, OpKind::kReLU, "r");
  relu.add_input(testing_util::lt(0, DataType::kF32, {4}))
      .add_output(testing_util::lt(1, DataType::kF32, {4}));
  EXPECT_STATUS_HAS(reason(relu), "no pattern of backend 'jit' is anchored at ReLU");
}

// Strided data runs on the JIT on every ISA path with ref's numbers: padded
// rows and pixels (and a diff_src with strides of its own) walked in place,
// other layouts (a permuted src) staged through per-thread dense buffers.
TEST(JitBackend, StridedTensorsRunInPlaceOrStaged) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const char* fmt : {"NCX", "NXC"}) {
        for (int which = 0; which < 3; ++which) {
          // 0: src and diff_dst padded in the last dim; 1: diff_src padded too;
          // 2: src stored channels-last while the op reads NCX (or the reverse).
          Op op = bn_bwd({3, 5, 6, 7}, fmt, dt, DataType::kF32, true, 3);
          const Dims padded = {5 * 6 * 9, 6 * 9, 9, 1};
          if (which <= 1) {
            op.mutable_inputs()[0].strides = padded;
            op.mutable_inputs()[1].strides = padded;
          }
          if (which == 1) op.mutable_outputs()[0].strides = padded;
          if (which == 2) op.mutable_inputs()[0].strides = {210, 1, 35, 5};  // acdb
          SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + fmt + " case " + std::to_string(which));
          const auto r = compare_with_ref(one_op(op), "jit", static_cast<uint64_t>(ran));
          ASSERT_TRUE(r.status.ok()) << r.status.to_string();
          // Regular strides are walked in place; a permuted src is staged.
          EXPECT_NE(r.kernel.find(which == 2 ? "+staged" : "+strided"), std::string::npos)
              << r.kernel;
          EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          ++ran;
        }
      }
    }
  }
  EXPECT_GE(ran, 18);
}

TEST(JitBackend, KernelsAreGeneratedOnce) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "no generated code on this CPU";
  // A shape no other test uses, so the first compile must generate.
  Graph g = one_op(bn_bwd({2, 16, 5, 37}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  const int64_t before = jit::generated_kernel_sets();
  auto a = CompiledGraph::compile(g, CompileOptions{"jit"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(jit::generated_kernel_sets(), before + 1);
  auto b = CompiledGraph::compile(g, CompileOptions{"jit"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(jit::generated_kernel_sets(), before + 1);
  // Another N with the same row walk reuses the code: N is a runtime argument.
  Graph h = one_op(bn_bwd({7, 16, 5, 37}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  ASSERT_TRUE(CompiledGraph::compile(h, CompileOptions{"jit"}).ok());
  EXPECT_EQ(jit::generated_kernel_sets(), before + 1);
}

}  // namespace
}  // namespace normgrad

namespace normgrad {
namespace {

// Fused producers on every ISA, dtype, layout and port, against ref (which
// runs the producer and the batch norm one after the other).
TEST(JitBackend, FusedReluBackwardAndAdd) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const char* fmt : {"NCX", "NXC"}) {
        for (int variant = 0; variant < 3; ++variant) {  // relu use_dst, relu use_src, add
          for (int port : {0, 1}) {
            const Dims shape = std::string(fmt) == "NCX" ? Dims{3, 17, 5, 7} : Dims{3, 5, 7, 17};
            Op pre(1, variant == 2 ? OpKind::kAdd : OpKind::kReLUBackward, "pre");
            if (variant < 2) pre.set_attr("use_dst", variant == 0);
            pre.add_input(testing_util::lt(30, dt, shape))
                .add_input(testing_util::lt(31, dt, shape));
            pre.add_output(testing_util::lt(20, dt, shape));
            Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
            bn.mutable_inputs()[port].id = 20;
            Graph g;
            ASSERT_TRUE(g.add_op(pre).ok());
            ASSERT_TRUE(g.add_op(bn).ok());
            SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + fmt + " variant " +
                         std::to_string(variant) + " port " + std::to_string(port));
            const auto r = compare_with_ref(g, "jit", static_cast<uint64_t>(ran++));
            ASSERT_TRUE(r.status.ok()) << r.status.to_string();
            EXPECT_EQ(r.kernel.find('+'), r.kernel.rfind('+')) << r.kernel;  // one fused kernel
            EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace normgrad
