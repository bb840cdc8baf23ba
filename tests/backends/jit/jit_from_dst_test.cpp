// BatchNormTrainingBackwardFromDst: ref and the JIT against closed-form values
// (oneDNN's canonical backward case, its dst computed by hand), the JIT
// against ref over dtypes, layouts, walks and activations, the same bits for
// any thread count, and the refusals.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include <normgrad/compile/compiler.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::compare_with_ref;
using testing_util::lt;

// dst 0, diff_dst 1, variance 2, gamma 3, beta 4 [, residual 8] -> diff_src 5,
// diff_gamma 6, diff_beta 7.
Graph from_dst_graph(const Dims& shape, const std::string& fmt, DataType dt, float alpha,
                     float eps = 1e-3f, bool residual = false) {
  const int64_t c = fmt == "NCX" ? shape[1] : shape.back();
  Op op(1, OpKind::kBatchNormTrainingBackwardFromDst, "abn_bwd");
  op.set_attr("epsilon", eps).set_attr("data_format", fmt);
  if (alpha != 1.f) op.set_attr("activation", std::string("leaky_relu")).set_attr("alpha", alpha);
  op.add_input(lt(0, dt, shape)).add_input(lt(1, dt, shape));
  for (int64_t id = 2; id <= 4; ++id) op.add_input(lt(id, DataType::kF32, {c}));
  if (residual) op.add_input(lt(8, dt, shape));
  op.add_output(lt(5, dt, shape));
  op.add_output(lt(6, DataType::kF32, {c})).add_output(lt(7, DataType::kF32, {c}));
  return testing_util::one_op(op);
}

// oneDNN's case (NCX 1x1x2x2, src {1,2,3,4}, diff_dst {.1,.1,.2,.2}, mean 2.5,
// variance 1.25, gamma 2, epsilon 0) seen from dst = gamma (src - mean) s + beta
// with beta = 0.5; leaky_relu(0.25) on top makes dst {.25 y} where y < 0 and
// diff_dst 4x larger there, so the backward is the same.
TEST(FromDst, ClosedFormOnEveryBackend) {
  const double s = 1.0 / std::sqrt(1.25);
  const float src[4] = {1, 2, 3, 4}, dy[4] = {0.1f, 0.1f, 0.2f, 0.2f};
  for (const char* backend : {"ref", "jit"}) {
    for (float alpha : {1.f, 0.25f}) {
      float dst[4], ddst[4];
      for (int i = 0; i < 4; ++i) {
        const double y = 2.0 * (src[i] - 2.5) * s + 0.5;
        dst[i] = static_cast<float>(y < 0 ? alpha * y : y);
        ddst[i] = y < 0 ? dy[i] / alpha : dy[i];
      }
      auto cg = CompiledGraph::compile(
          from_dst_graph({1, 1, 2, 2}, "NCX", DataType::kF32, alpha, 0.f), CompileOptions{backend});
      ASSERT_TRUE(cg.ok()) << cg.status().to_string();
      const float var = 1.25f, gamma = 2.f, beta = 0.5f;
      float dx[4], dgamma, dbeta;
      Status st = cg->execute({{0, dst}, {1, ddst}, {2, &var}, {3, &gamma}, {4, &beta}},
                              {{5, dx}, {6, &dgamma}, {7, &dbeta}});
      ASSERT_TRUE(st.ok()) << st.to_string();
      SCOPED_TRACE(std::string(backend) + " alpha " + std::to_string(alpha));
      const double want[4] = {0.01788854, -0.05366563, 0.05366563, -0.01788854};
      for (int i = 0; i < 4; ++i) EXPECT_NEAR(dx[i], want[i], 1e-6);
      EXPECT_NEAR(dgamma, 0.17888544, 1e-6);
      EXPECT_NEAR(dbeta, 0.6, 1e-6);
    }
  }
}

// Both walks (NCX rows, short and grouped; NXC pixels, in registers,
// channel-swept and channel-blocked), tails, the three dtypes and activations, on each ISA.
TEST(FromDst, JitAgainstRefSweep) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const Dims& shape : {Dims{4, 16, 7, 9}, Dims{3, 5, 33, 2}, Dims{2, 3, 3, 77},
                                Dims{3, 5, 5, 200}, Dims{40, 19}}) {
        const std::string fmt = shape.size() == 2 || shape[3] >= 77 ? "NXC" : "NCX";
        for (int form = 0; form < 4; ++form) {
          // identity, leaky_relu 0.01 and 2.5, leaky_relu 0.01 after a residual add
          const float alpha = form == 0 ? 1.f : form == 2 ? 2.5f : 0.01f;
          SCOPED_TRACE(isa + " " + dtype_name(dt) + " " + fmt + " " + dims_to_string(shape) +
                       " form " + std::to_string(form));
          const auto r = compare_with_ref(from_dst_graph(shape, fmt, dt, alpha, 1e-3f, form == 3),
                                          "jit", static_cast<uint64_t>(ran) + 300);
          ASSERT_TRUE(r.status.ok()) << r.status.to_string();
          EXPECT_EQ(r.kernel.rfind("jit:", 0), 0u) << r.kernel;
          EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          ++ran;
        }
      }
    }
  }
  EXPECT_GE(ran, 60);
}

// The NXC strips (nxc-strips, WalkConf::strips): the inverse activation and
// the residual read per strip, on each ISA.
TEST(FromDst, StripsAgainstRef) {
  int ran = 0;
  for (const std::string& isa : jit_test::isas()) {
    if (isa == "portable") continue;  // the portable path has no strips
    jit_test::IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16}) {
      for (bool residual : {false, true}) {
        SCOPED_TRACE(isa + " " + dtype_name(dt) + (residual ? " residual" : ""));
        const auto r =
            compare_with_ref(from_dst_graph({3, 5, 7, 192}, "NXC", dt, 0.01f, 1e-3f, residual),
                             "jit", static_cast<uint64_t>(ran) + 400, 0.0, "nxc-strips-64");
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_NE(r.kernel.find(":pixels_strips+"), std::string::npos) << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "the JIT generates no code here (CPU or NORMGRAD_JIT)";
}

TEST(FromDst, SameBitsForAnyThreadCount) {
  for (const Dims& shape : {Dims{8, 32, 20, 20}, Dims{8, 20, 20, 96}}) {
    const Graph g = from_dst_graph(shape, shape[3] == 96 ? "NXC" : "NCX", DataType::kF32, 0.01f);
    const auto one = jit_test::run_with_threads(g, 1);
    for (int t : {2, 3}) EXPECT_EQ(one, jit_test::run_with_threads(g, t)) << t;
  }
}

TEST(FromDst, ZeroGammaIsRefusedBeforeAnythingIsWritten) {
  for (const char* backend : {"ref", "jit"}) {
    auto cg = CompiledGraph::compile(from_dst_graph({2, 3, 2, 2}, "NCX", DataType::kF32, 0.1f),
                                     CompileOptions{backend});
    ASSERT_TRUE(cg.ok());
    std::vector<float> data(24, 0.5f), dx(24, -7.f), var(3, 1.f), gamma = {1.f, 1e-13f, 1.f},
                                                                  beta(3, 0.f), dg(3), db(3);
    Status s = cg->execute(
        {{0, data.data()}, {1, data.data()}, {2, var.data()}, {3, gamma.data()}, {4, beta.data()}},
        {{5, dx.data()}, {6, dg.data()}, {7, db.data()}});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << backend;
    EXPECT_NE(s.to_string().find("on channel 1"), std::string::npos) << s.to_string();
    EXPECT_EQ(dx[0], -7.f) << backend;
  }
}

TEST(FromDst, OverlappingOutputIsRefused) {
  auto cg = CompiledGraph::compile(from_dst_graph({2, 3, 2, 2}, "NCX", DataType::kF32, 0.1f),
                                   CompileOptions{});
  ASSERT_TRUE(cg.ok());
  std::vector<float> data(24, 0.5f), dy(25, 0.5f), var(3, 1.f), gamma(3, 1.f), beta(3, 0.f), dg(3),
      db(3);
  // diff_src over dst (not an in-place pair), then one element past diff_dst.
  Status s = cg->execute(
      {{0, data.data()}, {1, dy.data()}, {2, var.data()}, {3, gamma.data()}, {4, beta.data()}},
      {{5, data.data()}, {6, dg.data()}, {7, db.data()}});
  EXPECT_NE(s.to_string().find("output tensor 5 shares memory with input tensor 0"),
            std::string::npos)
      << s.to_string();
  s = cg->execute(
      {{0, data.data()}, {1, dy.data()}, {2, var.data()}, {3, gamma.data()}, {4, beta.data()}},
      {{5, dy.data() + 1}, {6, dg.data()}, {7, db.data()}});
  EXPECT_NE(s.to_string().find("overlapping, not the same buffer"), std::string::npos)
      << s.to_string();
  // The declared pair at the same address runs.
  s = cg->execute(
      {{0, data.data()}, {1, dy.data()}, {2, var.data()}, {3, gamma.data()}, {4, beta.data()}},
      {{5, dy.data()}, {6, dg.data()}, {7, db.data()}});
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace normgrad
