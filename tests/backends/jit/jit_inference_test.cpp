// JIT BatchNormInference: against ref (f64) over dtypes, layouts, ranks,
// channel counts and epilogues on each ISA; the walks of larger shapes; an
// int8 chain left whole to oneDNN; what the JIT declines, with reasons.
#include <string>

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

// form: 0 alone, 1 + ReLU, 2 + Add + ReLU, 3 + Add, 4 + LeakyReLU(0.01).
Graph inference_graph(const Dims& shape, const std::string& fmt, DataType dt, int form,
                      DataType stats_dt = DataType::kF32) {
  const int64_t c = fmt == "NCX" ? shape[1] : shape.back();
  Graph g;
  Op bn(1, OpKind::kBatchNormInference, "bn_inf");
  bn.set_attr("epsilon", 1e-3f).set_attr("data_format", fmt);
  bn.add_input(lt(10, dt, shape));
  for (int64_t id = 11; id <= 14; ++id) bn.add_input(lt(id, stats_dt, {c}));
  bn.add_output(lt(20, dt, shape));
  EXPECT_TRUE(g.add_op(bn).ok());
  jit_test::add_forward_epilogue(&g, shape, dt, form == 2 || form == 3,
                                 form == 1 || form == 2 || form == 4,
                                 form == 4 ? std::optional<float>(0.01f) : std::nullopt);
  return g;
}

class JitInferenceIsa : public ::testing::TestWithParam<const char*> {};

TEST_P(JitInferenceIsa, SweepAgainstRef) {
  const std::string isa = GetParam();
  if (const std::string why = jit_test::isa_unavailable(isa); !why.empty()) GTEST_SKIP() << why;
  jit_test::IsaScope scope(isa);
  const int ran = jit_test::for_each_forward_case(
      5, [&](DataType dt, const std::string& fmt, const Dims& shape, int form, int index) {
        const Graph g = inference_graph(shape, fmt, dt, form);
        // Data far from the given mean on the plain form.
        const double offset = form == 0 ? 1e3 : 0.0;
        const auto r = compare_with_ref(g, "jit", 31000 + static_cast<uint64_t>(index), offset);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        // One partition, the JIT's generated code on the ISA asked for.
        EXPECT_EQ(r.kernel.rfind("jit:" + isa + ":"), 0u) << r.kernel;
        EXPECT_NE(r.kernel.find("+inference"), std::string::npos) << r.kernel;
        if (form >= 1) {
          const char* epilogue = form == 3 ? "+add" : form == 4 ? "+leaky_relu" : "+relu";
          EXPECT_NE(r.kernel.find(epilogue), std::string::npos) << r.kernel;
        }
      });
  EXPECT_EQ(ran, 3 * 2 * 4 * 6 * 5);
}

INSTANTIATE_TEST_SUITE_P(Isas, JitInferenceIsa, ::testing::Values("avx512", "avx2", "portable"));

// Long rows, grouped short rows, and many apply blocks of the pixels walk,
// past the cache (streaming stores) and within it.
TEST(JitInference, LargeShapesAgainstRef) {
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const Dims& shape : {Dims{2, 3, 130, 131}, Dims{16, 512, 5, 5}, Dims{4, 29, 31, 67},
                              Dims{3, 5, 7, 1100}, Dims{8, 64, 56, 56}}) {
      const std::string fmt = shape[3] == 67 || shape[3] == 1100 ? "NXC" : "NCX";
      for (int form : {0, 2}) {
        const Graph g = inference_graph(shape, fmt, dt, form);
        SCOPED_TRACE(dims_to_string(shape) + " " + fmt + " form " + std::to_string(form));
        const auto r = compare_with_ref(g, "jit", 77, 0.0);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
      }
    }
  }
}

// The JIT declines what its kernels do not take, with the reason; "auto"
// then runs it elsewhere.
TEST(JitInference, DeclinesWithReasons) {
  const Dims shape = {2, 8, 4, 4};
  EXPECT_STATUS_HAS(
      compare_with_ref(inference_graph(shape, "NCX", DataType::kBF16, 0, DataType::kBF16), "jit")
          .status,
      "takes f32 statistics, not bf16");
  const auto r =
      compare_with_ref(inference_graph(shape, "NCX", DataType::kBF16, 0, DataType::kBF16), "auto");
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.kernel.find("jit:"), std::string::npos) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
}

// Dequantize -> BatchNormInference -> ReLU -> Quantize is oneDNN's int8
// pattern: the JIT's inference patterns leave it whole.
TEST(JitInference, LeavesAnInt8ChainWhole) {
  const Dims shape = {2, 3, 5, 7};
  Graph g;
  Op dq(1, OpKind::kDequantize, "dq");
  dq.set_attr("qtype", std::string("per_tensor"));
  dq.set_attr("scales", std::vector<float>{0.125f}).set_attr("zps", std::vector<int64_t>{0});
  dq.add_input(lt(0, DataType::kU8, shape)).add_output(lt(1, DataType::kF32, shape));
  Op bn(2, OpKind::kBatchNormInference, "bn_inf");
  bn.set_attr("epsilon", 1e-3f).set_attr("data_format", std::string("NCX"));
  bn.add_input(lt(1, DataType::kF32, shape));
  for (int64_t id = 11; id <= 14; ++id) bn.add_input(lt(id, DataType::kF32, {3}));
  bn.add_output(lt(2, DataType::kF32, shape));
  Op relu(3, OpKind::kReLU, "relu");
  relu.add_input(lt(2, DataType::kF32, shape)).add_output(lt(3, DataType::kF32, shape));
  Op q(4, OpKind::kQuantize, "q");
  q.set_attr("qtype", std::string("per_tensor"));
  q.set_attr("scales", std::vector<float>{0.25f}).set_attr("zps", std::vector<int64_t>{0});
  q.add_input(lt(3, DataType::kF32, shape)).add_output(lt(4, DataType::kU8, shape));
  for (const Op* op : {&dq, &bn, &relu, &q}) ASSERT_TRUE(g.add_op(*op).ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{"auto"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  for (const auto& p : cg->partitions())
    EXPECT_NE(p->partition().backend, "jit") << p->partition().pattern;
  if (find_backend("dnnl") != nullptr) {
    ASSERT_EQ(cg->partitions().size(), 1u);
    EXPECT_EQ(cg->partitions()[0]->partition().pattern, "dnnl.int8_bn_chain");
  }
}

}  // namespace
}  // namespace normgrad
