// The JIT forward's grouped rows walk (NCX rows of up to kShortRowBytes, a
// group of adjacent channels per call, image by image): against ref on each
// ISA for row lengths around the vector and the group (tails, rows shorter
// than a vector, a short last group, several chunks of images), with every
// epilogue, data far from zero, the streaming apply and its bounce buffer; the same bits for
// any thread count; and the fwd-ungrouped variant, which keeps the
// one-channel walk. (The synchronized forward's parts, Reduce and Apply,
// take the same walk in tests/backends/sync/sync_forward_test.cpp.)
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::compare_with_ref;
using testing_util::lt;

bool grouped_here(int64_t spatial, DataType dt) {
  return spatial * static_cast<int64_t>(dtype_size(dt)) <= jit::kShortRowBytes;
}

// Row lengths: shorter than a vector (2, 9), one AVX-512 vector (16), the
// ResNet-50 rows (5x5, 7x7, 10x10, 14x14), kShortRowBytes of f32 exactly
// (16x16), and 13x21 = 273 (past it in f32, grouped in 16-bit data).
const std::vector<std::pair<int64_t, int64_t>> kRows = {
    {1, 2}, {3, 3}, {4, 4}, {5, 5}, {7, 7}, {10, 10}, {14, 14}, {16, 16}, {13, 21}};

TEST(JitForwardGroups, MatchRefOnEachIsa) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;  // the portable path walks channel by channel
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const auto& [h, w] : kRows) {
        // 5: a short group on both ISAs; 8: whole groups; 11: one of each on AVX-512.
        for (int64_t c : {5, 8, 11}) {
          // 37 images: several statistics chunks (7x7: 16 images a chunk on
          // AVX-512, 9 on AVX2), and a run of rows past one chunk's terms.
          const int64_t n = ran % 2 == 0 ? 3 : 37;
          const int epilogue = ran % 4;  // none, ReLU, LeakyReLU, Add + ReLU
          const Dims shape = {n, c, h, w};
          const Graph g = jit_test::forward_graph(shape, epilogue, "NCX", dt);
          SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + dims_to_string(shape) + " epilogue " +
                       std::to_string(epilogue));
          // Data 1e4 sigma from zero where nothing clips it (no epilogue).
          const double offset = epilogue == 0 ? 1e4 : 0.0;
          const auto r = compare_with_ref(g, "jit", 900 + static_cast<uint64_t>(ran), offset);
          ASSERT_TRUE(r.status.ok()) << r.status.to_string();
          EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
          const bool grouped = r.kernel.find(":fwd:rows_grouped") != std::string::npos;
          EXPECT_EQ(grouped, grouped_here(h * w, dt)) << r.kernel;
          ++ran;
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

// fwd-ungrouped keeps one channel per call on the same shapes, also against ref.
TEST(JitForwardGroups, UngroupedVariantWalksChannelByChannel) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  int ran = 0;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const Dims& shape : {Dims{37, 11, 7, 7}, Dims{4, 5, 14, 14}}) {
      const Graph g = jit_test::forward_graph(shape, 3, "NCX", dt);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dims_to_string(shape));
      const auto r =
          compare_with_ref(g, "jit", 950 + static_cast<uint64_t>(ran++), 0.0, "fwd-ungrouped");
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      EXPECT_NE(r.kernel.find(":fwd:rows+add+relu"), std::string::npos) << r.kernel;
    }
  }
  // The variant's conf: one channel a call, chunks of whole rows to kFwdRowPiece.
  jit::FwdConf c;
  c.spatial = 49;
  c.channel_group = jit::kRowGroupAvx512;
  c.chunk_rows = 16;
  ASSERT_TRUE(jit::apply_forward_variant("fwd-ungrouped", &c).ok());
  EXPECT_EQ(c.channel_group, 0);
  EXPECT_EQ(c.chunk_rows, jit::kFwdRowPiece / 49);
}

// Rows of whole lines (8x8 f32, 16x16 bf16) in tensors past a quarter of
// the cache model's L3 (at most 32 MiB) take the streaming apply: every row
// starts on a line, so each vector store is a whole line or half of one.
TEST(JitForwardGroups, StreamingApply) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  for (const auto& [shape, dt] :
       {std::pair{Dims{40, 256, 8, 8}, DataType::kF32}, {Dims{20, 256, 16, 16}, DataType::kBF16}}) {
    SCOPED_TRACE(dims_to_string(shape));
    const Graph g = jit_test::forward_graph(shape, 1, "NCX", dt);
    const auto r = compare_with_ref(g, "jit", 960);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    EXPECT_NE(r.kernel.find(":fwd:rows_grouped+relu"), std::string::npos) << r.kernel;
    // Streamed exactly when src and dst exceed a quarter of the cache model's
    // L3 (the data buffers start on lines).
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    const bool past =
        2 * elements * static_cast<int64_t>(dtype_size(dt)) > jit::cache_sizes().l3_bytes / 4;
    EXPECT_EQ(r.kernel.find("+nt") != std::string::npos, past) << r.kernel;
  }
}

// Rows off lines in tensors past a quarter of the cache model's L3 stream
// through the bounce buffer under fwd-bounce: 7x7 and 14x14 (the ResNet-50
// rows), 3x3 (36 bytes, several rows to a line; AVX-512 only, as the AVX2
// copy takes rows of 128 bytes or more) and 5x7 f32 (140 bytes), with a
// short last group, every epilogue, and bf16 pairs on AVX2. Against ref,
// and bit for bit against fwd-no-bounce (the same arithmetic with ordinary
// stores). By default AVX2 takes the buffer for rows of 256 bytes or more,
// AVX-512 never.
TEST(JitForwardGroups, BounceBufferStreamsRowsOffLines) {
  const jit::Isa here = jit::detect_isa();
  if (here == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  struct Case {
    Dims shape;
    DataType dt;
    int epilogue;
  };
  const Case cases[] = {
      {{32, 701, 7, 7}, DataType::kF32, 1},  {{32, 1403, 7, 7}, DataType::kBF16, 0},
      {{8, 701, 14, 14}, DataType::kF32, 3}, {{8, 1403, 14, 14}, DataType::kBF16, 2},
      {{16, 2005, 5, 7}, DataType::kF32, 0}, {{32, 1403, 7, 7}, DataType::kF16, 3},
      {{32, 3701, 3, 3}, DataType::kF32, 1}};
  uint64_t seed = 970;
  for (const Case& k : cases) {
    const int64_t row_bytes = k.shape[2] * k.shape[3] * static_cast<int64_t>(dtype_size(k.dt));
    if (here != jit::Isa::kAvx512 && row_bytes < 128) continue;
    const Graph g = jit_test::forward_graph(k.shape, k.epilogue, "NCX", k.dt);
    SCOPED_TRACE(std::string(dtype_name(k.dt)) + " " + dims_to_string(k.shape));
    const auto r = compare_with_ref(g, "jit", seed++, k.epilogue == 0 ? 1e4 : 0.0, "fwd-bounce");
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    EXPECT_NE(r.kernel.find("+nt_bounce"), std::string::npos) << r.kernel;
    const auto inputs = jit_test::inputs_for(g, seed);
    std::string with, without, by_default;
    const auto a = jit_test::run_jit(g, "fwd-bounce", inputs, &with);
    const auto b = jit_test::run_jit(g, "fwd-no-bounce", inputs, &without);
    jit_test::run_jit(g, "", inputs, &by_default);
    EXPECT_EQ(without.find("+nt"), std::string::npos) << without;
    const bool bounces = here == jit::Isa::kAvx2 && row_bytes >= jit::kFwdAvx2BounceRowBytes;
    EXPECT_EQ(by_default.find("+nt_bounce") != std::string::npos, bounces) << by_default;
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [id, buf] : a) EXPECT_TRUE(buf.bytes == b.at(id).bytes) << "tensor " << id;
  }
}

TEST(JitForwardGroups, SameBitsForAnyThreadCount) {
  if (jit::detect_isa() == jit::Isa::kPortable)
    GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    jit_test::expect_same_bits_for_1_2_4_threads(
        jit_test::forward_graph({33, 21, 7, 7}, 3, "NCX", dt));
  }
}

}  // namespace
}  // namespace normgrad
