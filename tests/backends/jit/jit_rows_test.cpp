// The JIT's rows walk on short and long NCX rows, against ref: the grouped
// kernels (8 channels per call on AVX-512, image by image), the row-ahead
// prefetch of long 16-bit rows, the apply's prefetch of the next channel, the
// bounce block that streams rows which do not start on a vector, and the
// linear blocks of the grouped apply (their phases within a line, masked
// ends, and padding left untouched), and the last-rows-first apply of large
// channels.
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
  std::map<int64_t, LineVector<char>> storage;
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

// diff_src 4 and 32 bytes past a line: every output the same bytes as with
// diff_src on a line (f32 NCX `shape`, dense). Returns the on-line outputs as
// run_jit_into does (diff_src's id in *dx_id).
std::map<int64_t, std::vector<char>> expect_same_bits_off_line(const Dims& shape,
                                                               int64_t* dx_id = nullptr) {
  const auto on_line = run_jit_into(shape, 0, 0, dx_id);
  EXPECT_FALSE(on_line.empty());
  for (int shift : {4, 32}) {
    const auto off_line = run_jit_into(shape, 0, shift);
    for (const auto& [id, bytes] : on_line) {
      const std::vector<char>& other = off_line.at(id);
      const size_t size = bytes.size() - 64;  // the buffer, without the slack past it
      EXPECT_GE(other.size(), size);
      if (other.size() < size) continue;
      EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + size, other.begin()))
          << dims_to_string(shape) << " shift " << shift << " tensor " << id;
    }
  }
  return on_line;
}

// Runs f32 NCX `shape` with diff_src's images `image_elems` elements apart and
// expects the padding between them left as it was (0x7f bytes); returns
// diff_src's bytes and, in *used, each image's bytes.
std::vector<char> expect_padding_kept(const Dims& shape, int64_t image_elems, int64_t* used) {
  int64_t dx_id = -1;
  const auto padded = run_jit_into(shape, image_elems, 0, &dx_id);
  EXPECT_FALSE(padded.empty());
  if (padded.empty()) return {};
  const std::vector<char>& dx = padded.at(dx_id);
  const int64_t image = image_elems * 4, rows = shape[1] * shape[2] * shape[3] * 4;  // bytes
  EXPECT_EQ(dx.size(), static_cast<size_t>((shape[0] - 1) * image + rows + 64));
  int64_t touched = 0;
  for (int64_t b = rows; b < static_cast<int64_t>(dx.size()); ++b)
    touched += b % image >= rows && dx[static_cast<size_t>(b)] != 0x7f;
  EXPECT_EQ(touched, 0) << dims_to_string(shape) << ": bytes of padding written";
  *used = rows;
  return dx;
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
      EXPECT_GT(conf->walk.channel_group, 0) << what;
      EXPECT_EQ(conf->stream.nt_stores, streaming) << what;
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
    EXPECT_GT(conf->walk.channel_group, 0) << dims_to_string(shape);
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
                            Dims{batch_for(16 * 49 * 4), 16, 7, 7}, Dims{3, 16, 7, 7}})
    expect_same_bits_off_line(shape);
  // The padding between padded diff_src images left as it was.
  for (const Dims& shape : {Dims{batch_for(19 * 196 * 4), 19, 14, 14}, Dims{3, 19, 14, 14}}) {
    int64_t used = 0;
    expect_padding_kept(shape, 3728, &used);
  }
}

// Long rows whose diff_src does not start on a vector stream with each row
// split where diff_src's vectors start (AVX-512, when the three tensors take
// more than a quarter of the L3). 71x71 f32 rows (S = 5041) start at all 16
// phases of a vector; 23x29 16-bit rows at all 16 too. Against ref on every
// ISA path: all six output forms, fused producers on either port, and the
// tensor's last channel, which runs the loop without the next-channel
// prefetch. Then, on AVX-512: diff_src 4 and 32 bytes past a line gives the
// same bits, padded diff_src images keep their padding, and the bits are the
// same for 1, 2 and 4 threads.
TEST(JitBackend, LongRowsStreamRealigned) {
  const int64_t quarter_l3 = jit::cache_sizes().l3_bytes / 4;
  auto batch_for = [&](int64_t image_bytes) { return quarter_l3 / (3 * image_bytes) + 1; };
  const struct {
    int64_t c, h, w;
    DataType dt;
  } cases[] = {
      {3, 71, 71, DataType::kF32}, {2, 23, 29, DataType::kBF16}, {3, 23, 29, DataType::kF16}};
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    const RefCheck check(isa, 300, &ran);
    for (const auto& k : cases) {
      const Dims shape = {batch_for(k.c * k.h * k.w * dtype_size(k.dt)), k.c, k.h, k.w};
      for (int form = 0; form < 6; ++form) {
        const Op op = form_op(shape, "NCX", k.dt, form);
        const jit::BnConf conf = conf_for(op);
        EXPECT_EQ(conf.stream.nt_stores, isa != "portable");  // AVX2 streams its aligned rows
        EXPECT_EQ(conf.walk.channel_group, 0);
        EXPECT_NE(conf.walk.cols % 16, 0);
        check(one_op(op),
              dims_to_string(shape) + " " + dtype_name(k.dt) + " form " + std::to_string(form));
      }
      check_fused_rows(check, shape, k.dt);
    }
  }
  if (jit::detect_isa() != jit::Isa::kAvx512)
    GTEST_SKIP() << "the fused rows above ran on every ISA; the off-line diff_src part needs "
                    "the AVX-512 rows kernels";
  const Dims shape = {batch_for(3 * 71 * 71 * 4), 3, 71, 71};
  int64_t dense_id = -1;
  const auto dense_outputs = expect_same_bits_off_line(shape, &dense_id);
  ASSERT_FALSE(dense_outputs.empty());
  // diff_src's images 3 * 5041 + 5 elements apart: each row at its own phase,
  // and each image the same bytes as the dense diff_src's.
  const int64_t image_elems = 3 * 5041 + 5;
  int64_t rows = 0;
  const std::vector<char> dx = expect_padding_kept(shape, image_elems, &rows);
  ASSERT_FALSE(dx.empty());
  const std::vector<char>& dense = dense_outputs.at(dense_id);
  int64_t differ = 0;
  for (int64_t i = 0; i < shape[0]; ++i) {
    differ += !std::equal(dense.begin() + i * rows, dense.begin() + (i + 1) * rows,
                          dx.begin() + i * image_elems * 4);
  }
  EXPECT_EQ(differ, 0) << "images of padded diff_src unlike the dense one's";
  expect_same_bits_for_1_2_4_threads(
      one_op(bn_bwd(shape, "NCX", DataType::kF32, DataType::kF32, true, 3)));
}

}  // namespace
}  // namespace normgrad
