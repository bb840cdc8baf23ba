// The AVX2 bf16 applies of the NCX rows walks, backward and forward, 16
// elements per step (the even and odd words of one 32-byte load, merged back
// into one 32-byte store): against ref, bit for bit against the
// vector-at-a-time kernels they replace (`bf16-single-vectors`), over every
// way a row ends (pairs, one vector left, a tail), grouped and long rows,
// streamed rows on and off a 32-byte boundary, the forward's epilogues, and
// NaN, infinities and overflow through the rounding. Then the 16-bit NXC
// forward apply that walks each pixel's row whole (bf16 and f16), against
// the channel blocks it replaced. Then the NXC backward in pairs
// (pixel_pairs): both kernels, the sums and coefficients in pair order,
// the split phases and the strips, and the cases that keep single vectors.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::bf16_to_float;
using jit_test::conf_for;
using jit_test::form_op;
using jit_test::forward_graph;
using jit_test::inputs_for;
using jit_test::IsaScope;
using jit_test::run_jit;
using jit_test::streams;
using testing_util::compare_with_ref;
using testing_util::one_op;

constexpr int64_t kDiffDst = 1, kVariance = 3, kGamma = 4, kDiffSrc = 5;

uint16_t float_to_bf16(float f) {  // round to nearest even; finite inputs only
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Runs `g` on `inputs` in pairs (the default) and vector at a time
// (bf16-single-vectors), expects every output's bits equal, and returns the
// pairs' outputs.
std::map<int64_t, oracle::Buffer> run_pairs_and_singles(
    const Graph& g, const std::map<int64_t, oracle::Buffer>& inputs, std::string* kernel) {
  std::string single_kernel;
  auto pairs = run_jit(g, "", inputs, kernel);
  const auto singles = run_jit(g, "bf16-single-vectors", inputs, &single_kernel);
  EXPECT_EQ(pairs.size(), singles.size());
  for (const auto& [id, b] : pairs) {
    EXPECT_TRUE(singles.count(id) && b.bytes == singles.at(id).bytes) << "tensor " << id;
  }
  return pairs;
}

// Row lengths for every way cols_loop_pairs ends a row: one pair, a pair and
// a vector, and a tail, the unrolled loop, and grouped (<= 512 bf16) and long
// rows.
const int64_t kRowLengths[] = {16, 24, 27, 32, 37, 48, 49, 61, 196, 784, 1000};

TEST(JitAvx2Bf16, PairsMatchRefAndTheSingleVectorBits) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  IsaScope scope("avx2");
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  uint64_t seed = 4100;
  std::vector<Dims> shapes;
  for (int64_t s : kRowLengths) shapes.push_back({2, 3, 1, s});
  // Streamed: rows of 784 (1568 bytes, every row on 32 bytes) and of 1000
  // (2000 bytes: every other row 16 bytes off, which takes ordinary stores).
  for (int64_t s : {784, 1000}) shapes.push_back({l3 / (12 * 4 * s * 2) + 2, 4, 1, s});
  for (const Dims& shape : shapes) {
    for (int form : {0, 1, 4}) {
      SCOPED_TRACE("cols " + std::to_string(shape[3]) + " n " + std::to_string(shape[0]) +
                   " form " + std::to_string(form));
      const Op op = form_op(shape, "NCX", DataType::kBF16, form);
      const jit::BnConf conf = conf_for(op);
      EXPECT_TRUE(conf.stream.pair_vectors);
      EXPECT_FALSE(conf_for(op, "bf16-single-vectors").stream.pair_vectors);
      EXPECT_EQ(conf.stream.nt_stores, streams(shape[0] * 4 * shape[3] * 2));
      const Graph g = one_op(op);
      const auto r = compare_with_ref(g, "jit", ++seed);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.kernel.find("jit:avx2:bf16/"), 0u) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      std::string kernel;
      run_pairs_and_singles(g, inputs_for(g, seed), &kernel);
    }
  }
}

// Frozen statistics (diff_src = diff_dst * gamma / sqrt(variance + eps),
// elementwise): NaN, infinities, values that overflow bf16 once scaled, and
// ordinary values, in every lane position of the pairs and the tail. NaN
// stays NaN, infinities keep their sign, overflow rounds to infinity, the
// rest is the closed form within a bf16 step, and every bit is the single
// vectors' kernel's. A NaN gamma makes a whole channel NaN.
TEST(JitAvx2Bf16, PairsRoundNanInfinityAndOverflow) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  IsaScope scope("avx2");
  for (int64_t s : kRowLengths) {
    SCOPED_TRACE("cols " + std::to_string(s));
    const Dims shape = {2, 3, 1, s};
    const Graph g = one_op(form_op(shape, "NCX", DataType::kBF16, 3));
    auto inputs = inputs_for(g, 77 + static_cast<uint64_t>(s));
    const int64_t n = 2 * 3 * s;
    auto* dy = reinterpret_cast<uint16_t*>(inputs.at(kDiffDst).data());
    auto* var = reinterpret_cast<float*>(inputs.at(kVariance).data());
    auto* gamma = reinterpret_cast<float*>(inputs.at(kGamma).data());
    for (int c = 0; c < 3; ++c) {
      var[c] = 0.25f;  // a scale of about 2: the largest bf16 values overflow
      gamma[c] = 1.f;
    }
    // Channel 2's gamma a NaN whose payload fills the low 16 bits: rounding
    // it as a number would carry into the sign and store -0.
    const uint32_t nan_bits = 0x7fffffffu;
    std::memcpy(&gamma[2], &nan_bits, sizeof nan_bits);
    for (int64_t i = 0; i < n; ++i) {
      switch (i % 7) {
        case 1:
          dy[i] = static_cast<uint16_t>(0x7fc0 | (i & 0x3f));
          break;  // quiet NaN
        case 3:
          dy[i] = static_cast<uint16_t>(0x7f81 + (i & 0x3e));
          break;  // signalling NaN
        case 4:
          dy[i] = i % 2 ? 0x7f80 : 0xff80;
          break;  // +-infinity
        case 6:
          dy[i] = 0x7f7f;
          break;  // bf16's largest
        default:
          break;  // random
      }
    }
    std::string kernel;
    const auto pairs = run_pairs_and_singles(g, inputs, &kernel);
    ASSERT_EQ(pairs.count(kDiffSrc), 1u);
    EXPECT_EQ(kernel.find("jit:avx2:bf16/"), 0u) << kernel;
    const auto* dx = reinterpret_cast<const uint16_t*>(pairs.at(kDiffSrc).bytes.data());
    const double scale = 1.0 / std::sqrt(0.25 + 1e-3);
    for (int64_t i = 0; i < n; ++i) {
      const float in = bf16_to_float(dy[i]), got = bf16_to_float(dx[i]);
      const double want = static_cast<double>(in) * scale;
      if (std::isnan(in) || i / s % 3 == 2) {
        EXPECT_TRUE(std::isnan(got)) << i;
      } else if (std::isinf(want) || std::fabs(want) > 3.3961e38) {
        EXPECT_TRUE(std::isinf(got) && (got > 0) == (want > 0)) << i << " got " << got;
      } else {
        const float w = bf16_to_float(float_to_bf16(static_cast<float>(want)));
        EXPECT_LE(std::fabs(got - w), std::fabs(w) * (1.0 / 128) + 1e-30) << i;
      }
    }
  }
}

// The forward's applies in pairs, NCX rows and NXC pixels: ref, the single
// vectors' bits, and a NaN gamma whose payload fills the low 16 bits
// (channel 2 all NaN).
TEST(JitAvx2Bf16, ForwardPairsMatchRefAndTheSingleVectorBits) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  IsaScope scope("avx2");
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  std::vector<std::pair<Dims, const char*>> shapes;
  for (int64_t s : kRowLengths) shapes.push_back({{2, 3, 1, s}, "NCX"});
  // Streamed: rows of whole lines, src and dst past a quarter of the L3.
  shapes.push_back({{l3 / (4 * 4 * 1024 * 2 * 2) + 2, 4, 1, 1024}, "NCX"});
  // NXC: channels in pairs of vectors (16), a vector left (24, 40), a tail
  // (20, 37, 100), and streamed pixels of whole lines.
  for (int64_t c : {16, 20, 24, 37, 40, 100, 256}) shapes.push_back({{3, 5, 7, c}, "NXC"});
  shapes.push_back({{l3 / (4 * 256 * 2 * 2 * 8) + 2, 2, 4, 256}, "NXC"});
  uint64_t seed = 5100;
  for (const auto& [shape, fmt] : shapes) {
    const bool ncx = std::string(fmt) == "NCX";
    const int64_t c = ncx ? shape[1] : shape[3], inner = ncx ? shape[3] : 1;
    for (int epilogue = 0; epilogue < 4; ++epilogue) {
      SCOPED_TRACE(std::string(fmt) + " " + dims_to_string(shape) + " epilogue " +
                   std::to_string(epilogue));
      const Graph g = forward_graph(shape, epilogue, fmt);
      const auto r = compare_with_ref(g, "jit", ++seed);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.kernel.find(ncx ? "jit:avx2:bf16:fwd:rows" : "jit:avx2:bf16:fwd:pixels"), 0u)
          << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      auto inputs = inputs_for(g, seed);
      const uint32_t nan_bits = 0x7fffffffu;
      std::memcpy(static_cast<float*>(inputs.at(13).data()) + 2, &nan_bits, sizeof nan_bits);
      std::string kernel;
      const auto pairs = run_pairs_and_singles(g, inputs, &kernel);
      ASSERT_EQ(pairs.count(epilogue == 0 ? 20 : 40), 1u);
      const int64_t out = epilogue == 0 ? 20 : 40;
      const auto* y = reinterpret_cast<const uint16_t*>(pairs.at(out).bytes.data());
      for (int64_t i = 0; i < shape[0] * shape[1] * shape[2] * shape[3]; ++i) {
        if (i / inner % c == 2) {
          ASSERT_TRUE(std::isnan(bf16_to_float(y[i]))) << i;
        }
      }
    }
  }
}

// ForwardLinesMatchRefAndTheChannelBlockBits (below) under one ISA.
void forward_lines_against_blocks(const std::string& isa) {
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  std::vector<Dims> shapes;
  for (int64_t c : {32, 64, 96, 2048}) shapes.push_back({2, 3, 5, c});
  shapes.push_back({l3 / (4 * 256 * 2 * 2 * 8) + 2, 2, 4, 256});  // streamed
  uint64_t seed = 6100;
  for (DataType dt : {DataType::kBF16, DataType::kF16}) {
    for (const Dims& shape : shapes) {
      for (int epilogue = 0; epilogue < 4; ++epilogue) {
        SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + dims_to_string(shape) + " epilogue " +
                     std::to_string(epilogue));
        const Graph g = forward_graph(shape, epilogue, "NXC", dt);
        const auto r = compare_with_ref(g, "jit", ++seed);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_EQ(r.kernel.find("jit:" + isa + ":" + dtype_name(dt) + ":fwd:pixels_lines"), 0u)
            << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        const auto inputs = inputs_for(g, seed);
        // bf16-single-vectors changes only AVX2's pairs.
        for (const char* lines : {"", "bf16-single-vectors"}) {
          if (*lines && isa != "avx2") continue;
          std::string kernel, blocks_kernel;
          const auto y = run_jit(g, lines, inputs, &kernel);
          const auto b = run_jit(g, std::string(lines) + (*lines ? "+" : "") + "fwd-channel-blocks",
                                 inputs, &blocks_kernel);
          EXPECT_NE(kernel.find("pixels_lines"), std::string::npos) << kernel;
          EXPECT_EQ(blocks_kernel.find("pixels_lines"), std::string::npos) << blocks_kernel;
          ASSERT_EQ(y.size(), b.size());
          for (const auto& [id, buf] : y) {
            EXPECT_TRUE(b.count(id) && buf.bytes == b.at(id).bytes) << lines << " tensor " << id;
          }
        }
      }
    }
  }
}

// The 16-bit NXC forward apply that walks each pixel's row whole, a line of
// dst per step (pixels_lines, C a multiple of 32), on AVX2 and AVX-512
// where the host has them: against ref and bit for bit against the channel
// blocks it replaced (`fwd-channel-blocks`), bf16 in pairs (AVX2) and vector
// at a time (with a residual, `bf16-single-vectors`, AVX-512) and f16, every
// epilogue, rows of one line to 64 (2048 channels), and streamed.
TEST(JitAvx2Bf16, ForwardLinesMatchRefAndTheChannelBlockBits) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;
    IsaScope scope(isa);
    forward_lines_against_blocks(isa);
  }
}

// The NXC backward in pairs: channel counts of one pair, an odd number of
// pairs and many, pixel counts that leave a group short, a case past the
// streaming threshold, the three output forms, frozen statistics, data far
// from its mean; against ref and bit for bit against single vectors, and
// the same bits for 1 and 2 threads.
TEST(JitAvx2Bf16, PixelPairsMatchRefAndTheSingleVectorBits) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  IsaScope scope("avx2");
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  uint64_t seed = 5200;
  std::vector<Dims> shapes = {{1, 1, 3, 16}, {2, 3, 5, 48}, {3, 7, 7, 64}, {1, 5, 3, 1024}};
  shapes.push_back({l3 / (4 * 2 * 14 * 14 * 512) + 1, 14, 14, 512});  // streamed
  for (const Dims& shape : shapes) {
    for (int form : {0, 1, 3, 4}) {
      SCOPED_TRACE("NXC " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + "x" +
                   std::to_string(shape[2]) + "x" + std::to_string(shape[3]) + " form " +
                   std::to_string(form));
      const Op op = form_op(shape, "NXC", DataType::kBF16, form);
      EXPECT_TRUE(jit::pixel_pairs(conf_for(op)));
      EXPECT_FALSE(jit::pixel_pairs(conf_for(op, "bf16-single-vectors")));
      const Graph g = one_op(op);
      const auto r = compare_with_ref(g, "jit", ++seed);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("jit:avx2:bf16/f32:pixels+pairs"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      std::string kernel;
      run_pairs_and_singles(g, inputs_for(g, seed), &kernel);
      if (form == 0) {
        EXPECT_EQ(jit_test::run_with_threads(g, 1), jit_test::run_with_threads(g, 2));
        // The strips take the same kernels a strip of 32 channels at a time.
        if (shape[3] % 64 == 0)
          jit_test::expect_jit_matches_ref(g, ++seed, "avx2", "pixels_strips+pairs",
                                           "nxc-strips-32");
      }
    }
  }
  // Whole pairs only, and no fused producer (whose loads are per vector).
  EXPECT_FALSE(jit::pixel_pairs(conf_for(form_op({2, 3, 3, 24}, "NXC", DataType::kBF16, 0))));
  EXPECT_FALSE(jit::pixel_pairs(conf_for(form_op({2, 3, 3, 32}, "NXC", DataType::kF32, 0))));
}

// The synchronized backward's halves in pairs: the reduce's sums leave in
// channel order, and the apply lays the given sums' coefficients in pairs.
TEST(JitAvx2Bf16, PixelPairsSplitPhasesMatchRef) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT needs AVX2 here";
  IsaScope scope("avx2");
  const Dims data = {2, 6, 5, 96};
  Op reduce(0, OpKind::kBatchNormBackwardReduce, "r");
  reduce.set_attr("data_format", std::string("NXC"));
  reduce.add_input(testing_util::lt(0, DataType::kBF16, data))
      .add_input(testing_util::lt(1, DataType::kBF16, data))
      .add_input(testing_util::lt(2, DataType::kF32, {96}));
  reduce.add_output(testing_util::lt(3, DataType::kF32, {96}))
      .add_output(testing_util::lt(4, DataType::kF32, {96}))
      .add_output(testing_util::lt(5, DataType::kS64, {1}));
  jit_test::expect_jit_matches_ref(one_op(reduce), 5301, "avx2", "pixels+pairs");
  Op apply(0, OpKind::kBatchNormBackwardApply, "a");
  apply.set_attr("data_format", std::string("NXC")).set_attr("epsilon", 1e-3f);
  apply.add_input(testing_util::lt(0, DataType::kBF16, data))
      .add_input(testing_util::lt(1, DataType::kBF16, data));
  for (int64_t id = 2; id <= 5; ++id) apply.add_input(testing_util::lt(id, DataType::kF32, {96}));
  apply.add_input(testing_util::lt(6, DataType::kS64, {1}))
      .add_input(testing_util::lt(7, DataType::kF32, {96}));
  apply.add_output(testing_util::lt(8, DataType::kBF16, data))
      .add_output(testing_util::lt(9, DataType::kF32, {96}))
      .add_output(testing_util::lt(10, DataType::kF32, {96}));
  jit_test::expect_jit_matches_ref(one_op(apply), 5302, "avx2", "pixels+pairs");
}

}  // namespace
}  // namespace normgrad
