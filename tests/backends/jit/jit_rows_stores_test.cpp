// The JIT's rows walk where its stores land: diff_src off a line gives the
// same bytes as on a line, the grouped apply's linear blocks (their phases
// within a line, masked ends) leave the padding between images untouched,
// and long rows stream realigned.
#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

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
