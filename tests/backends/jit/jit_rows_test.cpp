// The JIT's rows walk on short and long NCX rows, against ref: the grouped
// kernels (8 channels per call on AVX-512, image by image), the row-ahead
// prefetch of long 16-bit rows, the apply's prefetch of the next channel, the
// bounce block that streams rows which do not start on a vector, and the
// last-rows-first apply of large channels (the stores' placement:
// jit_rows_stores_test.cpp).
#include <algorithm>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::check_fused_rows;
using jit_test::conf_for;
using jit_test::expect_same_bits_for_1_2_4_threads;
using jit_test::form_op;
using jit_test::fused_on_port;
using jit_test::isas;
using jit_test::IsaScope;
using jit_test::RefCheck;
using jit_test::streams;
using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

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
        const Op op = form_op(k.shape, "NCX", k.dt, form);
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
    EXPECT_GT(conf->walk.channel_group, 0);
    EXPECT_EQ(conf->stream.nt_stores, isa != "portable" && streams(conf->total_elements * 4));
    check(one_op(big), "33x512x16x16", true);
    // The groups and reduce calls are fixed by the shape: same bits for 1, 2 and 4 threads.
    expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({16, 203, 7, 7}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
  }
}

// Long NCX rows of 16-bit data (and of f32 on AVX2), rows far apart: the
// reduce prefetches the rows kReducePrefetchRows ahead in all but the last
// rows of a call. Batches of 1 to 5 (no prefetching rows, then some), padded
// rows (one call per image), fused producers (their operands prefetched too),
// and the cases that keep the plain reduce: f32 on AVX-512, one channel (the
// rows are one stream), short rows.
TEST(JitBackend, LongRowsPrefetchAhead) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    const RefCheck check(isa, 0, &ran);
    auto prefetches = [](const Op& op) { return conf_for(op).prefetch.reduce_rows; };
    for (DataType dt : {DataType::kBF16, DataType::kF16}) {
      for (int64_t n : {1, 2, 3, 5}) {
        for (int form = 0; form < 6; form += 2) {
          // 24x24 16-bit rows are 1152 bytes, past kShortRowBytes; 3 channels.
          const Op op = form_op({n, 3, 24, 24}, "NCX", dt, form);
          EXPECT_TRUE(prefetches(op));
          check(one_op(op), dims_to_string(op.inputs()[0].dims) + " " + dtype_name(dt) + " form " +
                                std::to_string(form));
        }
      }
      check_fused_rows(check, {4, 5, 23, 29}, dt);
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
    const Op f32_rows = bn_bwd({5, 3, 24, 24}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    EXPECT_EQ(prefetches(f32_rows), jit::detect_isa() == jit::Isa::kAvx2);
    check(one_op(f32_rows), "f32 rows");
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 1, 24, 24}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 3, 16, 32}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
    expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({6, 40, 28, 28}, "NCX", DataType::kBF16, DataType::kF32, true, 3)));
  }
}

// Rows of at least kNextChannelPrefetchRowBytes, one channel per call: the
// apply prefetches the next channel's rows, and the tensor's last channel
// takes the copy of the loop without the prefetches. Three channels run
// serially, so both copies compute: f32 and 16-bit rows, batches of 1 to 3,
// the output forms, fused producers (the fused kernels, whose operands are
// prefetched too, against ref), channels
// padded apart (walked in place), and the cases that do without: shorter
// rows, one channel, padded rows (a call per image) and staged tensors.
TEST(JitBackend, ApplyPrefetchesNextChannel) {
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    const RefCheck check(isa, 100, &ran);
    auto prefetches = [](const Op& op) { return conf_for(op).prefetch.next_channel; };
    const struct {
      Dims shape;
      DataType dt;
    } on[] = {{{1, 3, 32, 32}, DataType::kF32}, {{2, 3, 32, 33}, DataType::kF32},
              {{3, 3, 40, 40}, DataType::kF32}, {{2, 3, 32, 64}, DataType::kBF16},
              {{3, 3, 33, 64}, DataType::kF16}, {{5, 3, 28, 28}, DataType::kF32},  // 3136-byte rows
              {{5, 3, 28, 28}, DataType::kBF16}};  // 1568 bytes: the shortest rows not grouped
    for (const auto& c : on) {
      for (int form = 0; form < 6; ++form) {
        const Op op = form_op(c.shape, "NCX", c.dt, form);
        EXPECT_TRUE(prefetches(op));
        check(one_op(op),
              dims_to_string(c.shape) + " " + dtype_name(c.dt) + " form " + std::to_string(form));
      }
    }
    for (DataType dt : {DataType::kF32, DataType::kBF16})
      check_fused_rows(check, {2, 3, 32, 64}, dt);
    // Channels 1100 elements apart (1024 used): the next channel's rows are
    // channel_stride on, not cols.
    Op apart = bn_bwd({2, 3, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    for (int port : {0, 1}) apart.mutable_inputs()[port].strides = {3 * 1100, 1100, 32, 1};
    EXPECT_TRUE(prefetches(apart));
    check(one_op(apart), "channels padded apart");
    // Without: grouped rows (14x14 f32), one channel, rows padded from 1024
    // to 1040 elements (a call per image), channels padded within their rows
    // (staged), and the staged kernels themselves.
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 3, 14, 14}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
    EXPECT_FALSE(
        prefetches(bn_bwd({5, 1, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
    Op padded = bn_bwd({2, 3, 2, 1024}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    for (int port : {0, 1})
      padded.mutable_inputs()[port].strides = {3 * 2 * 1040, 2 * 1040, 1040, 1};
    EXPECT_FALSE(prefetches(padded));
    check(one_op(padded), "padded rows");
    Op staged = bn_bwd({2, 3, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    staged.mutable_inputs()[0].strides = {3 * 32 * 40, 32 * 40, 40, 1};  // src only: staged
    EXPECT_FALSE(prefetches(staged));
    check(one_op(staged), "staged");
    const jit::BnConf dense =
        conf_for(bn_bwd({2, 3, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3));
    EXPECT_TRUE(dense.prefetch.next_channel);
    EXPECT_FALSE(jit::staged_conf(dense).prefetch.next_channel);
    expect_same_bits_for_1_2_4_threads(
        one_op(bn_bwd({6, 24, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3)));
  }
}

// Channels whose src and diff_dst exceed a quarter of the L2: the apply takes
// the rows last first, kReverseApplyCallBytes per call, so the last call of a
// channel may be short, and only the first rows' call prefetches the next
// channel. Shapes are sized from the L2 this host reports: rows of one call
// each and rows several to a call with a partial last call, f32 and 16-bit,
// every output form, fused producers, channels padded apart (walked in place),
// and bits that do not depend on the thread count. Channels that fit, padded
// rows (a call per image) and staged tensors keep one forward call. The JIT
// reverses only on an L2 of kReverseApplyMinL2Bytes; the test forces it with
// the ncx-reverse-apply variant, so every host runs the reversed kernels.
TEST(JitBackend, LargeChannelsApplyLastRowsFirst) {
  const int64_t quarter_l2 = jit::cache_sizes().l2_bytes / 4;
  const bool by_default = jit::cache_sizes().l2_bytes >= jit::kReverseApplyMinL2Bytes;
  const std::string reverse = "ncx-reverse-apply";
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    const RefCheck check(isa, 400, &ran, reverse);
    auto rows_per_call = [&](const Op& op) {
      const int64_t rows = conf_for(op, reverse).stream.reverse_rows;
      EXPECT_EQ(conf_for(op).stream.reverse_rows, by_default ? rows : 0);
      return rows;
    };
    // One long row per image: 3 rows of over a sixth of a quarter L2 each.
    const int64_t long_cols = quarter_l2 / 24 + 37;
    const Op long_rows = form_op({3, 3, 1, long_cols}, "NCX", DataType::kF32, 0);
    EXPECT_EQ(rows_per_call(long_rows), 1);
    check(one_op(long_rows), "long rows");
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      // Rows of 1000 elements: 5 f32 rows or 9 16-bit rows per call, and a
      // batch that is no multiple of either.
      const int64_t es = dtype_size(dt);
      const int64_t step = (jit::kReverseApplyCallBytes + 1000 * es - 1) / (1000 * es);
      int64_t n = quarter_l2 / (2 * 1000 * es) + 2;
      while (n % step == 0) ++n;
      for (int form = 0; form < 6; ++form) {
        const Op op = form_op({n, 3, 10, 100}, "NCX", dt, form);
        // Form 2 (frozen, diff_src only) reduces nothing, so no rows are cached.
        EXPECT_EQ(rows_per_call(op), form == 2 ? 0 : step) << "form " << form;
        check(one_op(op),
              std::to_string(n) + " images " + dtype_name(dt) + " form " + std::to_string(form));
      }
      if (dt != DataType::kF16) check_fused_rows(check, {n, 2, 10, 100}, dt);
      Op apart = bn_bwd({n, 3, 10, 100}, "NCX", dt, DataType::kF32, true, 3);
      for (int port : {0, 1}) apart.mutable_inputs()[port].strides = {3 * 1100, 1100, 100, 1};
      EXPECT_EQ(rows_per_call(apart), step);
      check(one_op(apart), std::string("channels padded apart ") + dtype_name(dt));
    }
    EXPECT_EQ(
        rows_per_call(bn_bwd({4, 3, 10, 100}, "NCX", DataType::kF32, DataType::kF32, true, 3)), 0);
    Op padded = bn_bwd({3, 3, 2, long_cols}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    for (int port : {0, 1})
      padded.mutable_inputs()[port].strides = {3 * 2 * (long_cols + 16), 2 * (long_cols + 16),
                                               long_cols + 16, 1};
    EXPECT_EQ(rows_per_call(padded), 0);
    Op staged = bn_bwd({3, 3, 1, long_cols}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    staged.mutable_inputs()[0].strides = {3 * 2 * long_cols, 2 * long_cols, long_cols, 1};
    EXPECT_EQ(rows_per_call(staged), 0);
    check(one_op(staged), "staged");
    const Op many =
        bn_bwd({quarter_l2 / 8000 + 3, 4, 10, 100}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    EXPECT_EQ(rows_per_call(many), 5);
    expect_same_bits_for_1_2_4_threads(one_op(many), reverse);
  }
}

// The rows walk's bench variants (reversed or forward apply, no next-channel
// prefetch, an added reduce prefetch, ordinary stores, and combinations): each
// changes the conf as it says, on channels large enough for the reversed
// apply and the prefetches, and every output still matches ref.
TEST(JitBackend, NcxVariantsMatchRef) {
  const int64_t quarter_l2 = jit::cache_sizes().l2_bytes / 4;
  uint64_t seed = 900;
  const std::string variants[] = {"ncx-reverse-apply",
                                  "ncx-reverse-apply+ncx-forward-apply",
                                  "ncx-reverse-apply+ncx-no-next-channel",
                                  "ncx-reduce-prefetch",
                                  "ncx-no-nt",
                                  "ncx-reduce-prefetch+ncx-no-nt"};
  auto has = [](const std::string& variant, const char* part) {
    return variant.find(part) != std::string::npos;
  };
  for (const std::string& variant : variants) {
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      const int64_t n = quarter_l2 / (2 * 1000 * dtype_size(dt)) + 3;
      for (int form : {0, 1, 4}) {
        SCOPED_TRACE(variant + " " + dtype_name(dt) + " form " + std::to_string(form));
        const Op op = form_op({n, 3, 10, 100}, "NCX", dt, form);
        const jit::BnConf conf = conf_for(op, variant);
        const bool reversed = has(variant, "reverse") && !has(variant, "forward");
        EXPECT_EQ(conf.stream.reverse_rows > 0, reversed);
        EXPECT_TRUE(!has(variant, "reduce-prefetch") || conf.prefetch.reduce_rows);
        EXPECT_TRUE(!has(variant, "no-nt") || !conf.stream.nt_stores);
        const auto r = compare_with_ref(one_op(op), "jit", ++seed, 0.0, variant);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_NE(r.kernel.find(":rows"), std::string::npos) << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      }
    }
    // A row of 9000 f32 per image: one row per call, next-channel prefetches
    // unless the variant turns them off.
    const Op op = bn_bwd({5, 4, 90, 100}, "NCX", DataType::kF32, DataType::kF32, true, 3);
    EXPECT_EQ(conf_for(op, variant).prefetch.next_channel, !has(variant, "no-next-channel"))
        << variant;
    const auto r = compare_with_ref(one_op(op), "jit", ++seed, 0.0, variant);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  }
  CompileOptions bad{"jit"};
  bad.jit_variant = "ncx-forward-apply+nope";
  EXPECT_FALSE(
      CompiledGraph::compile(one_op(form_op({2, 3, 4, 5}, "NCX", DataType::kF32, 0)), bad).ok());
}

// Grouped short rows that do not start on a vector (7x7, 14x14) stream
// diff_src through a 64-byte-aligned bounce block when it is larger than half
// the L3 and the linear blocks (AVX-512) cannot take it (diff_src's images
// not whole lines apart), on AVX-512 and AVX2 (rows of 512 bytes or more):
// blocks whose ends fall inside lines (1568 bytes per group of 8 7x7 f32
// channels), images that start off a line (203 channels), a last group of 3
// channels, blocks of whole lines (16 channels of 14x14 f32) in images
// padded to 3140 elements, bf16 (in pairs on AVX2), f16, and a fused
// producer. Batches are sized from the L3 this
// host reports.
void grouped_rows_through_bounce_block(jit::Isa isa) {
  const int64_t half_l3 = jit::cache_sizes().l3_bytes / 2;
  struct Case {
    int64_t c, h, w;
    DataType dt;
    int64_t dx_image_stride;  // 0: dense
  };
  // AVX2 bounces rows of 512 bytes or more only.
  const std::vector<Case> cases = isa == jit::Isa::kAvx512
                                      ? std::vector<Case>{{203, 7, 7, DataType::kF32, 0},
                                                          {16, 14, 14, DataType::kF32, 3140},
                                                          {203, 14, 14, DataType::kBF16, 0},
                                                          {37, 5, 5, DataType::kF16, 0}}
                                      : std::vector<Case>{{203, 15, 15, DataType::kF32, 0},
                                                          {16, 14, 14, DataType::kF32, 3140},
                                                          {203, 17, 17, DataType::kBF16, 0},
                                                          {37, 17, 17, DataType::kF16, 0}};
  int ran = 0;
  for (const auto& k : cases) {
    const int64_t image_bytes = k.c * k.h * k.w * dtype_size(k.dt);
    const int64_t n = half_l3 / image_bytes + 1;
    Op op = bn_bwd({n, k.c, k.h, k.w}, "NCX", k.dt, DataType::kF32, true, 3, 1e-3f);
    if (k.dx_image_stride > 0)
      op.mutable_outputs()[0].strides = {k.dx_image_stride, k.h * k.w, k.w, 1};
    const std::string what = std::string(jit::isa_name(isa)) + " " +
                             dims_to_string({n, k.c, k.h, k.w}) + " " + dtype_name(k.dt);
    auto conf = jit::make_conf(op, isa);
    ASSERT_TRUE(conf.ok());
    EXPECT_GT(conf->walk.channel_group, 0) << what;
    EXPECT_TRUE(conf->stream.nt_stores) << what;
    EXPECT_NE(conf->walk.cols % (isa == jit::Isa::kAvx512 ? 16 : 8), 0) << what;
    EXPECT_GT(jit::bounce_block_bytes(*conf), 0) << what;
    EXPECT_FALSE(jit::grouped_linear_blocks(*conf)) << what;
    const auto r = compare_with_ref(one_op(op), "jit", static_cast<uint64_t>(ran++));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_EQ(r.kernel.find(std::string("jit:") + jit::isa_name(isa)), 0u) << r.kernel;
    EXPECT_NE(r.kernel.find("rows_grouped"), std::string::npos) << r.kernel;
    EXPECT_LE(r.worst_ratio, 1.0) << what << " " << r.report;
  }
  // A fused ReLUBackward on src: the kernel saves r12/r13 (next to rbx on AVX-512).
  const int64_t hw = isa == jit::Isa::kAvx512 ? 7 : 15;
  const int64_t n = half_l3 / (203 * hw * hw * 4) + 1;
  const auto r = compare_with_ref(fused_on_port({n, 203, hw, hw}, "NCX", 0), "jit", 99);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_NE(r.kernel.find("rows_grouped+src_"), std::string::npos) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << "fused " << r.report;
}

TEST(JitBackend, GroupedRowsStreamThroughBounceBlock) {
  if (jit::detect_isa() != jit::Isa::kAvx512) GTEST_SKIP() << "the JIT runs no AVX-512 here";
  grouped_rows_through_bounce_block(jit::Isa::kAvx512);
}

TEST(JitBackend, GroupedRowsStreamThroughBounceBlockOnAvx2) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "the JIT runs no AVX2 here";
  IsaScope scope("avx2");
  grouped_rows_through_bounce_block(jit::Isa::kAvx2);
}

}  // namespace
}  // namespace normgrad
