// The JIT backend against ref on every code path this machine can run
// (AVX-512, AVX2+F16C and the portable C++ path, forced with NORMGRAD_JIT),
// channel and spatial tails, all forms, large offsets, and bitwise equality of
// results across thread counts.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <tuple>

#include <tbb/global_control.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::form_op;
using jit_test::fused_graph;
using jit_test::isas;
using jit_test::IsaScope;
using jit_test::run_with_threads;
using jit_test::streams;
using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

Op make_case(DataType dt, DataType sdt, const std::string& fmt, int rank, int64_t c,
             int64_t spatial_scale, int form) {
  Dims shape = {rank == 2 ? 8 : 2};
  const int64_t spatial[] = {7 * spatial_scale, 3, 5};
  if (fmt == "NCX") shape.push_back(c);
  for (int i = 0; i < rank - 2; ++i) shape.push_back(spatial[i]);
  if (fmt == "NXC") shape.push_back(c);
  return form_op(shape, fmt.c_str(), dt, form, sdt);
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

// NORMGRAD_JIT with a value that is no ISA fails the compile with the
// choices, on the JIT and on auto (never a quiet run on another backend).
TEST(JitBackend, AnUnknownIsaSettingIsRefused) {
  IsaScope scope("bogus");
  const Graph g = one_op(bn_bwd({2, 8, 4, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  for (const char* backend : {"jit", "auto"}) {
    const auto cg = CompiledGraph::compile(g, CompileOptions{backend});
    ASSERT_FALSE(cg.ok()) << backend;
    EXPECT_EQ(cg.status().code(), StatusCode::kInvalidArgument) << backend;
    EXPECT_NE(cg.status().message().find("NORMGRAD_JIT='bogus' is not a JIT ISA: use portable"),
              std::string::npos)
        << cg.status().to_string();
  }
  // ref alone does not read it.
  EXPECT_TRUE(CompiledGraph::compile(g, CompileOptions{"ref"}).ok());
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

TEST(JitBackend, StreamingStoresOnLargeOutputs) {
  // dx larger than half the L3 takes the non-temporal store path (AVX-512 and AVX2); rows
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
    EXPECT_EQ(conf->stream.nt_stores, isa != jit::Isa::kPortable && streams(bytes))
        << dims_to_string(c.shape);
    if (c.shape[0] == n7 || c.shape[0] == n14) {  // the second rule alone
      EXPECT_LE(bytes, l3 / 2) << dims_to_string(c.shape);
      EXPECT_EQ(conf->stream.nt_stores, isa != jit::Isa::kPortable) << dims_to_string(c.shape);
    }
    const auto r = compare_with_ref(one_op(op), "jit", 3);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << dims_to_string(c.shape) << " " << r.report;
  }
}

// The variants are one table: the names, the help string and the backend's
// list come from it, the unknown-name error prints it, and docs/cli.md
// describes every one of them.
TEST(JitBackend, EveryVariantIsListedAndDocumented) {
  const std::string names = jit::jit_variant_names();
  std::ifstream in(std::string(NORMGRAD_EXAMPLES) + "/../../docs/cli.md");
  ASSERT_TRUE(in) << "docs/cli.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::string> list = jit::jit_variant_list();
  EXPECT_GE(list.size(), 14u) << names;
  for (const std::string& name : list) {
    EXPECT_NE(names.find(name), std::string::npos) << name;
    EXPECT_NE(doc.find("`" + name), std::string::npos) << name << " is not in docs/cli.md";
    jit::BnConf conf;
    EXPECT_TRUE(jit::apply_variant(name, &conf).ok()) << name;
  }
  // The backend offers the same list (normgrad tune times it).
  EXPECT_EQ(find_backend("jit")->variants(), list);
  jit::BnConf conf;
  const Status unknown = jit::apply_variant("nope", &conf);
  EXPECT_NE(unknown.message().find(names), std::string::npos) << unknown.to_string();
}

// The forward takes the rows of the same table that change its conf
// (bf16-single-vectors, fwd-channel-blocks, fwd-ungrouped and
// bf16-integer-rounding; jit_forward_groups_test.cpp checks fwd-ungrouped's
// change), ignores the backward's own, and
// refuses what the table does not know.
TEST(JitBackend, ForwardVariantsComeFromTheSameTable) {
  // (pair_vectors, line_walk, avx512_bf16) after the variant, all true before.
  auto forward = [](const std::string& variant, Status* status) {
    jit::FwdConf c;
    c.pair_vectors = true;
    c.line_walk = true;
    c.avx512_bf16 = true;
    *status = jit::apply_forward_variant(variant, &c);
    return std::make_tuple(c.pair_vectors, c.line_walk, c.avx512_bf16);
  };
  Status status;
  EXPECT_EQ(forward("bf16-single-vectors", &status), std::make_tuple(false, true, true));
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(forward("fwd-channel-blocks", &status), std::make_tuple(true, false, true));
  EXPECT_EQ(forward("bf16-integer-rounding", &status), std::make_tuple(true, true, false));
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(forward("nxc-swept-16+fwd-channel-blocks+bf16-single-vectors", &status),
            std::make_tuple(false, false, true));
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(forward("nxc-swept+ncx-no-nt", &status), std::make_tuple(true, true, true));
  EXPECT_TRUE(status.ok()) << status.to_string();
  forward("fwd-channel-blocks+nope", &status);
  EXPECT_NE(status.message().find("unknown JIT variant 'nope'"), std::string::npos)
      << status.to_string();
}

// The JIT declines what it cannot run, with the reason.
TEST(JitBackend, DeclinesWithReasons) {
  auto reason = [](const Op& op) { return compare_with_ref(one_op(op), "jit").status; };
  Op strided_stats = bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  strided_stats.mutable_inputs()[2].strides = {2};
  EXPECT_STATUS_HAS(reason(strided_stats), "the JIT takes dense statistics; mean is strided");
  Op relu(0, OpKind::kReLU, "r");
  relu.add_input(testing_util::lt(0, DataType::kF32, {4}))
      .add_output(testing_util::lt(1, DataType::kF32, {4}));
  EXPECT_STATUS_HAS(reason(relu), "no pattern of backend 'jit' is anchored at ReLU");
}

// An empty batch runs on the JIT itself: diff_gamma and diff_beta are sums
// over no element (0, whatever the buffers held), diff_src has no element.
TEST(JitBackend, EmptyBatchGivesZeroSums) {
  for (const char* fmt : {"NCX", "NXC"}) {
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      const Dims shape = std::string(fmt) == "NCX" ? Dims{0, 3, 4} : Dims{0, 4, 3};
      auto cg = CompiledGraph::compile(one_op(bn_bwd(shape, fmt, dt, DataType::kF32, true, 3)),
                                       CompileOptions{"jit"});
      ASSERT_TRUE(cg.ok()) << cg.status().to_string();
      EXPECT_NE(cg->partitions()[0]->kernel_name().find(":empty"), std::string::npos);
      float stats[3][3] = {{0.1f, 0.2f, 0.3f}, {1.f, 2.f, 3.f}, {1.f, 1.f, 1.f}};
      float dg[3] = {7.f, 7.f, 7.f}, db[3] = {7.f, 7.f, 7.f};
      char none = 0;
      ASSERT_TRUE(cg->execute({{0, &none}, {1, &none}, {2, stats[0]}, {3, stats[1]}, {4, stats[2]}},
                              {{5, &none}, {6, dg}, {7, db}})
                      .ok());
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(dg[c], 0.f);
        EXPECT_EQ(db[c], 0.f);
      }
    }
  }
  // The forward: zero batch statistics, running statistics moved towards
  // them by the momentum (oneDNN's convention), as ref defines the op.
  Op fwd(0, OpKind::kBatchNormForwardTraining, "f");
  fwd.set_attr("epsilon", 1e-5f).set_attr("data_format", std::string("NCX"));
  fwd.set_attr("momentum", 0.25f);
  fwd.add_input(testing_util::lt(0, DataType::kF32, {0, 2, 5}));
  for (int64_t id = 1; id <= 4; ++id) fwd.add_input(testing_util::lt(id, DataType::kF32, {2}));
  fwd.add_output(testing_util::lt(5, DataType::kF32, {0, 2, 5}));
  for (int64_t id = 6; id <= 9; ++id) fwd.add_output(testing_util::lt(id, DataType::kF32, {2}));
  auto cg = CompiledGraph::compile(one_op(fwd), CompileOptions{"jit"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  EXPECT_NE(cg->partitions()[0]->kernel_name().find(":fwd:empty"), std::string::npos);
  float rm[2] = {4.f, 8.f}, rv[2] = {2.f, 6.f}, g[2] = {1.f, 1.f}, b[2] = {0.f, 0.f};
  float orm[2], orv[2], bm[2] = {9.f, 9.f}, bv[2] = {9.f, 9.f};
  char none = 0;
  ASSERT_TRUE(cg->execute({{0, &none}, {1, rm}, {2, rv}, {3, g}, {4, b}},
                          {{5, &none}, {6, orm}, {7, orv}, {8, bm}, {9, bv}})
                  .ok());
  EXPECT_EQ(bm[0], 0.f);
  EXPECT_EQ(bv[1], 0.f);
  EXPECT_FLOAT_EQ(orm[0], 1.f);  // 0.25 * 4 + 0.75 * 0
  EXPECT_FLOAT_EQ(orv[1], 1.5f);
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

// torch's channels_last tensors under NCX ops (as normgrad.capture writes
// them): the JIT walks them as dense NXC, in place, fused with a ReLU or a
// ReLUBackward, with ref's numbers; one tensor of another layout stages.
TEST(JitBackend, ChannelsLastTensorsRunAsNxc) {
  const Dims shape = {3, 5, 6, 7}, cl = {210, 1, 35, 5};
  ASSERT_EQ(channels_last_strides(shape), cl);
  int ran = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      SCOPED_TRACE(isa + " " + dtype_name(dt));
      Op bwd = bn_bwd(shape, "NCX", dt, DataType::kF32, true, 3);
      bwd.mutable_inputs()[0].strides = cl;
      bwd.mutable_inputs()[1].strides = cl;
      bwd.mutable_outputs()[0].strides = cl;
      auto r = compare_with_ref(one_op(bwd), "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("+channels_last"), std::string::npos) << r.kernel;
      EXPECT_EQ(r.kernel.find("+staged"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;

      // The same with a fused ReLUBackward on diff_dst.
      Graph fused;
      Op relu(10, OpKind::kReLUBackward, "relu_bwd");
      LogicalTensor y(20, dt, shape), g(21, dt, shape);
      y.strides = cl;
      g.strides = cl;
      relu.set_attr("use_dst", true).add_input(y).add_input(g).add_output(bwd.inputs()[1]);
      ASSERT_TRUE(fused.add_op(relu).ok());
      ASSERT_TRUE(fused.add_op(bwd).ok());
      r = compare_with_ref(fused, "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find("+diff_dst_relu_bwd"), std::string::npos) << r.kernel;
      EXPECT_NE(r.kernel.find("+channels_last"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;

      // diff_src dense while src is channels last: another layout, staged.
      Op mixed = bwd;
      mixed.mutable_outputs()[0].strides = {};
      r = compare_with_ref(one_op(mixed), "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.kernel.find("+channels_last"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;

      // The forward with its ReLU epilogue.
      Graph fwd;
      Op bn(30, OpKind::kBatchNormForwardTraining, "bn_fwd");
      LogicalTensor x(40, dt, shape), dst(46, dt, shape), out(47, dt, shape);
      x.strides = dst.strides = out.strides = cl;
      bn.set_attr("epsilon", 1e-5f).set_attr("momentum", 0.1f).set_attr("data_format", "NCX");
      bn.add_input(x);
      for (int64_t id = 41; id <= 44; ++id) bn.add_input(LogicalTensor(id, DataType::kF32, {5}));
      bn.add_output(dst);
      for (int64_t id = 50; id <= 53; ++id) bn.add_output(LogicalTensor(id, DataType::kF32, {5}));
      Op act(31, OpKind::kReLU, "relu");
      act.add_input(dst).add_output(out);
      ASSERT_TRUE(fwd.add_op(bn).ok());
      ASSERT_TRUE(fwd.add_op(act).ok());
      r = compare_with_ref(fwd, "jit", static_cast<uint64_t>(ran++));
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_NE(r.kernel.find(":fwd:"), std::string::npos) << r.kernel;
      EXPECT_NE(r.kernel.find("+relu+channels_last"), std::string::npos) << r.kernel;
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
  }
  EXPECT_GE(ran, 12);
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
            const Graph g =
                fused_graph(shape, fmt, variant == 2 ? OpKind::kAdd : OpKind::kReLUBackward, port,
                            dt, variant < 2 ? std::optional<bool>(variant == 0) : std::nullopt);
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

// The driver keeps its per-channel arrays per thread between calls. Calls
// with other channel counts, phases and walks in between must not leave
// anything behind: each result matches ref, and the first graph gives the same
// bits again.
TEST(JitBackend, DriverScratchIsReusedSafely) {
  const Op wide = bn_bwd({1, 7, 7, 2048}, "NXC", DataType::kF32, DataType::kF32, true, 3);
  const Op narrow = bn_bwd({4, 9, 9, 24}, "NXC", DataType::kBF16, DataType::kF32, true, 3);
  const Op rows = bn_bwd({2, 40, 12, 12}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  Op reduce(0, OpKind::kBatchNormBackwardReduce, "r");
  reduce.set_attr("data_format", std::string("NXC"));
  reduce.add_input(testing_util::lt(0, DataType::kF32, {3, 5, 5, 520}))
      .add_input(testing_util::lt(1, DataType::kF32, {3, 5, 5, 520}))
      .add_input(testing_util::lt(2, DataType::kF32, {520}));
  reduce.add_output(testing_util::lt(3, DataType::kF32, {520}))
      .add_output(testing_util::lt(4, DataType::kF32, {520}))
      .add_output(testing_util::lt(5, DataType::kS64, {1}));
  const auto first = run_with_threads(one_op(wide), 1);
  for (const Op* op : std::initializer_list<const Op*>{&narrow, &reduce, &rows, &wide}) {
    SCOPED_TRACE(op->label());
    jit_test::expect_jit_matches_ref(one_op(*op), 17);
  }
  const auto again = run_with_threads(one_op(wide), 1);
  for (const auto& [id, b] : first) EXPECT_EQ(b, again.at(id)) << "tensor " << id;

  // The arrays are the calling thread's: eight threads executing one compiled
  // graph at once, each on its own inputs, get their serial results.
  auto cg = CompiledGraph::compile(one_op(wide), CompileOptions{"jit"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  constexpr int kThreads = 8;
  std::vector<std::map<int64_t, oracle::Buffer>> ins, serial;
  for (int t = 0; t < kThreads; ++t) {
    auto in = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 100 + t, nullptr);
    ASSERT_TRUE(in.ok());
    auto out = testing_util::run_outputs(*cg, *in);
    ASSERT_TRUE(out.ok());
    ins.push_back(std::move(in).value());
    serial.push_back(std::move(out).value());
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        auto out = testing_util::run_outputs(*cg, ins[t]);
        if (!out.ok()) {
          ++mismatches[t];
          continue;
        }
        for (const auto& [id, b] : serial[t]) mismatches[t] += out->at(id).bytes != b.bytes;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(kThreads, 0));
}

}  // namespace
}  // namespace normgrad
