// JIT batch-norm forward training: against ref (f64) over dtypes, layouts,
// ranks, channel counts and epilogues; the same bits for any thread count;
// statistics that do not cancel on offset or constant channels.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include <normgrad/backends/backend.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/data_type.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::compare_with_ref;
using testing_util::lt;

// form: 0 affine, 1 no gamma/beta, 2 affine + ReLU, 3 affine + Add + ReLU, 4 affine + Add,
// 5 affine + LeakyReLU(0.01), 6 affine + Add + LeakyReLU(2.5).
Graph fwd_graph(const Dims& shape, const std::string& fmt, DataType dt, int form,
                float eps = 1e-3f) {
  const int64_t c = fmt == "NCX" ? shape[1] : shape.back();
  Graph g;
  Op bn(1, OpKind::kBatchNormForwardTraining, "bn");
  bn.set_attr("epsilon", eps).set_attr("data_format", fmt).set_attr("momentum", 0.25f);
  bn.add_input(lt(10, dt, shape)).add_input(lt(11, DataType::kF32, {c}));
  bn.add_input(lt(12, DataType::kF32, {c}));
  if (form != 1) bn.add_input(lt(13, DataType::kF32, {c})).add_input(lt(14, DataType::kF32, {c}));
  bn.add_output(lt(20, dt, shape));
  for (int64_t id = 21; id <= 24; ++id) bn.add_output(lt(id, DataType::kF32, {c}));
  EXPECT_TRUE(g.add_op(bn).ok());
  jit_test::add_forward_epilogue(&g, shape, dt, form == 3 || form == 4 || form == 6,
                                 form == 2 || form == 3 || form >= 5,
                                 form == 5   ? std::optional<float>(0.01f)
                                 : form == 6 ? std::optional<float>(2.5f)
                                             : std::nullopt);
  return g;
}

// The generated code on each ISA and the portable path (NORMGRAD_JIT).
class JitForwardIsa : public ::testing::TestWithParam<const char*> {};

TEST_P(JitForwardIsa, SweepAgainstRef) {
  const std::string isa = GetParam();
  if (const std::string why = jit_test::isa_unavailable(isa); !why.empty()) GTEST_SKIP() << why;
  jit_test::IsaScope scope(isa);
  const int ran = jit_test::for_each_forward_case(
      7, [&](DataType dt, const std::string& fmt, const Dims& shape, int form, int index) {
        const Graph g = fwd_graph(shape, fmt, dt, form);
        const double offset = form == 0 ? 1e3 : 0.0;  // statistics on offset data
        // Seeds: the ReLU/Add forms keep theirs (7000 + their own count); LeakyReLU's follow.
        const uint64_t seed = form < 5 ? 7000 + static_cast<uint64_t>(index / 7 * 5 + form)
                                       : 20000 + static_cast<uint64_t>(index);
        const auto r = compare_with_ref(g, "jit", seed, offset);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        // One fused kernel for BN and its epilogue.
        EXPECT_EQ(r.kernel.rfind("jit:"), 0u) << r.kernel;  // one partition, on the JIT
        // On the ISA asked for, every dtype (bf16 rounds by integer arithmetic
        // where vcvtneps2bf16 is missing).
        EXPECT_EQ(r.kernel.rfind("jit:" + isa + ":", 0), 0u) << r.kernel;
        EXPECT_NE(r.kernel.find(":fwd:"), std::string::npos) << r.kernel;
        if (form >= 2) {
          const char* epilogue = form == 4 ? "+add" : form >= 5 ? "+leaky_relu" : "+relu";
          EXPECT_NE(r.kernel.find(epilogue), std::string::npos) << r.kernel;
        }
      });
  EXPECT_EQ(ran, 3 * 2 * 4 * 6 * 7);
}

INSTANTIATE_TEST_SUITE_P(Isas, JitForwardIsa, ::testing::Values("avx512", "avx2", "portable"));

// Long rows (pieces of kFwdRowPiece), short rows in several chunks of whole
// rows per channel, and many pixel chunks and apply calls.
TEST(JitForward, LargeShapesAgainstRef) {
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const Dims& shape :
         {Dims{2, 3, 130, 131}, Dims{50, 5, 11, 13}, Dims{4, 29, 31, 67}, Dims{3, 5, 7, 1100}}) {
      const std::string fmt = shape[3] == 67 || shape[3] == 1100 ? "NXC" : "NCX";
      const Graph g = fwd_graph(shape, fmt, dt, 3);
      SCOPED_TRACE(dims_to_string(shape) + " " + fmt);
      const auto r = compare_with_ref(g, "jit", 99, 0.0);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
  }
}

struct FwdRun {
  std::vector<float> y, mean, var;
};

// Runs the single-op forward on `x` (f32) on `backend` with gamma 1, beta 0.
FwdRun run_forward(const Dims& shape, const std::string& fmt, const std::vector<float>& x,
                   const std::string& backend) {
  const int64_t c = fmt == "NCX" ? shape[1] : shape.back();
  const Graph g = fwd_graph(shape, fmt, DataType::kF32, 0, 1e-5f);
  auto cg = CompiledGraph::compile(g, CompileOptions{backend});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  FwdRun r;
  r.y.assign(x.size(), 0.f);
  r.mean.assign(static_cast<size_t>(c), 0.f);
  r.var.assign(static_cast<size_t>(c), 0.f);
  std::vector<float> ones(static_cast<size_t>(c), 1.f), zeros(static_cast<size_t>(c), 0.f);
  std::vector<float> rm(static_cast<size_t>(c)), rv(static_cast<size_t>(c));
  Status s = cg->execute({{10, x.data()},
                          {11, zeros.data()},
                          {12, ones.data()},
                          {13, ones.data()},
                          {14, zeros.data()}},
                         {{20, r.y.data()},
                          {21, rm.data()},
                          {22, rv.data()},
                          {23, r.mean.data()},
                          {24, r.var.data()}});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

TEST(JitForward, SameBitsForAnyThreadCount) {
  for (const char* fmt : {"NCX", "NXC"}) {
    const Dims shape = std::string(fmt) == "NCX" ? Dims{16, 24, 30, 30} : Dims{16, 30, 30, 24};
    std::vector<float> x(16 * 24 * 900);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(3.f, 2.f);
    for (float& v : x) v = dist(rng);
    set_num_threads(1);
    const FwdRun one = run_forward(shape, fmt, x, "jit");
    for (int t : {2, 3, 4}) {
      set_num_threads(t);
      const FwdRun r = run_forward(shape, fmt, x, "jit");
      EXPECT_EQ(0, std::memcmp(r.mean.data(), one.mean.data(), one.mean.size() * 4)) << fmt << t;
      EXPECT_EQ(0, std::memcmp(r.var.data(), one.var.data(), one.var.size() * 4)) << fmt << t;
      EXPECT_EQ(0, std::memcmp(r.y.data(), one.y.data(), one.y.size() * 4)) << fmt << t;
    }
    set_num_threads(0);
  }
}

// A channel of constant 1e7 normalises to 0 (E[x^2] - E[x]^2 gives var != 0
// there and dst of +-1), and data at an offset of 1e4 sigma keeps its mean and
// variance to 1e-6 relative against a float64 two-pass computation.
TEST(JitForward, StatisticsDoNotCancel) {
  for (const char* fmt : {"NCX", "NXC"}) {
    const int64_t n = 8, c = 5, hw = 33 * 33;
    const Dims shape = std::string(fmt) == "NCX" ? Dims{n, c, 33, 33} : Dims{n, 33, 33, c};
    std::vector<float> x(static_cast<size_t>(n * c * hw));
    std::mt19937 rng(11);
    std::normal_distribution<double> dist(0.0, 1.0);
    auto at = [&](int64_t i, int64_t ch, int64_t p) -> float& {
      return std::string(fmt) == "NCX" ? x[static_cast<size_t>((i * c + ch) * hw + p)]
                                       : x[static_cast<size_t>((i * hw + p) * c + ch)];
    };
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t p = 0; p < hw; ++p) {
        at(i, 0, p) = 1e7f;                                               // constant
        at(i, 1, p) = static_cast<float>(1e4 + dist(rng));                // offset 1e4 sigma
        at(i, 2, p) = static_cast<float>(3e5 * 0.01 + 0.01 * dist(rng));  // offset, small sigma
        at(i, 3, p) = static_cast<float>(dist(rng));                      // plain
        at(i, 4, p) = static_cast<float>(-2e4 + 2.0 * dist(rng));         // negative offset
      }
    }
    const FwdRun r = run_forward(shape, fmt, x, "jit");
    std::vector<double> means(static_cast<size_t>(c)), vars(static_cast<size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      double mean = 0.0, var = 0.0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < hw; ++p) mean += at(i, ch, p);
      mean /= static_cast<double>(n * hw);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < hw; ++p) var += (at(i, ch, p) - mean) * (at(i, ch, p) - mean);
      var /= static_cast<double>(n * hw);
      means[static_cast<size_t>(ch)] = mean;
      vars[static_cast<size_t>(ch)] = var;
      SCOPED_TRACE(std::string(fmt) + " channel " + std::to_string(ch));
      // Relative to the mean, or to sigma where the mean is near 0.
      EXPECT_LE(std::abs(r.mean[static_cast<size_t>(ch)] - mean),
                1e-6 * std::max(std::abs(mean), std::sqrt(var)));
      if (ch == 0) {
        EXPECT_EQ(r.var[0], 0.f);
      } else {
        EXPECT_LE(std::abs(r.var[static_cast<size_t>(ch)] - var), 1e-6 * var);
      }
    }
    // var = 0: x - mean is exactly 0, so dst is beta = 0, not +-1.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t p = 0; p < hw; ++p) {
        const size_t k = std::string(fmt) == "NCX" ? static_cast<size_t>((i * c) * hw + p)
                                                   : static_cast<size_t>((i * hw + p) * c);
        ASSERT_EQ(r.y[k], 0.f);
      }
    }
    // dst keeps the mean's part below its f32 rounding (hi + lo): without it
    // channel 2 (ulp(3000) / 2 = 1.2e-4 of mean, sigma 0.01) would be off by
    // up to 1.2e-2, channels 1 and 4 by up to 5e-4.
    for (int64_t ch = 1; ch < c; ++ch) {
      const double inv = 1.0 / std::sqrt(vars[static_cast<size_t>(ch)] + 1e-5);
      double worst = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t p = 0; p < hw; ++p) {
          const size_t k = std::string(fmt) == "NCX" ? static_cast<size_t>((i * c + ch) * hw + p)
                                                     : static_cast<size_t>((i * hw + p) * c + ch);
          const double want =
              (static_cast<double>(at(i, ch, p)) - means[static_cast<size_t>(ch)]) * inv;
          worst = std::max(worst, std::abs(r.y[k] - want) / std::max(1.0, std::abs(want)));
        }
      }
      EXPECT_LE(worst, 2e-6) << fmt << " channel " << ch;
    }
  }
}

TEST(JitForward, FusedPartition) {
  const Dims shape = {2, 8, 4, 4};
  Graph g = fwd_graph(shape, "NCX", DataType::kF32, 2);
  auto cg = CompiledGraph::compile(g, CompileOptions{"auto"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  ASSERT_EQ(cg->partitions().size(), 1u);
  EXPECT_EQ(cg->partitions()[0]->partition().pattern, "jit.bn_fwd_epilogue");
}

}  // namespace
}  // namespace normgrad
