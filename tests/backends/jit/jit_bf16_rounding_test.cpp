// The integer bf16 rounding of the JIT's stores (AVX2, and AVX-512 without
// avx512_bf16, which `bf16-integer-rounding` forces on CPUs that have it):
// against ref backward and forward on both ISAs, bit for bit against
// vcvtneps2bf16 where the CPU has it, and NaN whose payload fills the low
// 16 bits in every f32 input, which the rounding would carry into the sign
// (storing -0 or infinity) if the driver handed it to a kernel as it is.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"

namespace normgrad {
namespace {

using jit_test::form_op;
using jit_test::IsaScope;
using testing_util::compare_with_ref;
using testing_util::one_op;

// The ISAs whose integer rounding this host can run: AVX2 always (when the
// JIT runs at all), AVX-512 under the variant when the CPU has it.
struct Setting {
  const char* isa;
  const char* variant;
};

std::vector<Setting> settings() {
  std::vector<Setting> s;
  if (jit::detect_isa() == jit::Isa::kPortable) return s;
  s.push_back({"avx2", ""});
  if (jit::detect_isa() == jit::Isa::kAvx512) s.push_back({"avx512", "bf16-integer-rounding"});
  return s;
}

std::vector<std::pair<Dims, const char*>> shapes() {
  std::vector<std::pair<Dims, const char*>> s;
  for (int64_t cols : {16, 37, 784}) s.push_back({{2, 5, 1, cols}, "NCX"});
  for (int64_t c : {16, 37, 64}) s.push_back({{3, 5, 7, c}, "NXC"});
  return s;
}

// A BatchNormForwardTraining in bf16 with f32 statistics, gamma (13) and beta (14).
Graph forward_graph(const Dims& shape, const char* fmt) {
  using testing_util::lt;
  const DataType f32 = DataType::kF32, bf16 = DataType::kBF16;
  const int64_t c = std::string(fmt) == "NCX" ? shape[1] : shape.back();
  Graph g;
  Op bn(1, OpKind::kBatchNormForwardTraining, "bn");
  bn.set_attr("epsilon", 1e-3f).set_attr("data_format", fmt);
  bn.add_input(lt(10, bf16, shape)).add_input(lt(11, f32, {c})).add_input(lt(12, f32, {c}));
  bn.add_input(lt(13, f32, {c})).add_input(lt(14, f32, {c}));
  bn.add_output(lt(20, bf16, shape));
  for (int64_t id = 21; id <= 24; ++id) bn.add_output(lt(id, f32, {c}));
  EXPECT_TRUE(g.add_op(bn).ok());
  return g;
}

std::vector<Graph> graphs(const Dims& shape, const char* fmt) {
  std::vector<Graph> g;
  for (int form : {0, 1, 4}) g.push_back(one_op(form_op(shape, fmt, DataType::kBF16, form)));
  g.push_back(forward_graph(shape, fmt));
  return g;
}

std::map<int64_t, oracle::Buffer> run(const Graph& g, const std::string& backend,
                                      const std::string& variant,
                                      const std::map<int64_t, oracle::Buffer>& inputs,
                                      std::string* kernel = nullptr) {
  CompileOptions options{backend};
  options.jit_variant = variant;
  auto cg = CompiledGraph::compile(g, options);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return {};
  for (const auto& p : cg->partitions())
    if (kernel != nullptr) *kernel += p->kernel_name();
  auto outs = oracle::run_outputs(*cg, inputs);
  EXPECT_TRUE(outs.ok()) << outs.status().to_string();
  return outs.ok() ? *outs : std::map<int64_t, oracle::Buffer>{};
}

std::map<int64_t, oracle::Buffer> inputs_for(const Graph& g, uint64_t seed) {
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return {};
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", seed, nullptr);
  EXPECT_TRUE(inputs.ok()) << inputs.status().to_string();
  return inputs.ok() ? *inputs : std::map<int64_t, oracle::Buffer>{};
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(JitBf16Rounding, IntegerRoundingMatchesRefAndTheHardwareBits) {
  if (settings().empty()) GTEST_SKIP() << "the JIT needs AVX2 here";
  uint64_t seed = 9100;
  for (const Setting& s : settings()) {
    IsaScope scope(s.isa);
    for (const auto& [shape, fmt] : shapes()) {
      for (const Graph& g : graphs(shape, fmt)) {
        SCOPED_TRACE(std::string(s.isa) + " " + fmt + " " + dims_to_string(shape) + " " +
                     g.ops().front().label());
        const auto r = compare_with_ref(g, "jit", ++seed, 0.0, s.variant);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_EQ(r.kernel.find(std::string("jit:") + s.isa + ":bf16"), 0u) << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        if (!*s.variant || !jit::cpu_has_avx512_bf16()) continue;
        // vcvtneps2bf16 rounds to nearest even as the integer code does; it
        // also flushes denormals, which batch-norm outputs here never are.
        const auto inputs = inputs_for(g, seed);
        const auto integer = run(g, "jit", s.variant, inputs);
        const auto hardware = run(g, "jit", "", inputs);
        for (const auto& [id, b] : hardware) {
          ASSERT_EQ(integer.count(id), 1u);
          if (b.desc.dtype != DataType::kBF16) continue;
          const auto* h = reinterpret_cast<const uint16_t*>(b.bytes.data());
          const auto* i = reinterpret_cast<const uint16_t*>(integer.at(id).bytes.data());
          int64_t differ = 0, n = static_cast<int64_t>(b.bytes.size() / 2);
          for (int64_t k = 0; k < n; ++k)
            differ += h[k] != i[k] && std::fabs(bf16_to_float(h[k])) >= FLT_MIN;
          EXPECT_EQ(differ, 0) << "tensor " << id << " of " << n;
        }
      }
    }
  }
}

// Per channel, a NaN with every payload bit set (positive and negative) in
// each f32 input the op reads: mean, variance and gamma of the backward,
// gamma and beta of the forward. Every element where ref gives NaN is NaN,
// and the rest is ref's within the limits.
TEST(JitBf16Rounding, NanPayloadsInEveryF32InputStayNan) {
  if (settings().empty()) GTEST_SKIP() << "the JIT needs AVX2 here";
  uint64_t seed = 9500;
  for (const Setting& s : settings()) {
    IsaScope scope(s.isa);
    for (const auto& [shape, fmt] : shapes()) {
      for (const Graph& g : graphs(shape, fmt)) {
        const Op& op = g.ops().front();
        const bool forward = op.kind() == OpKind::kBatchNormForwardTraining;
        const std::vector<size_t> ports =
            forward ? std::vector<size_t>{3, 4} : std::vector<size_t>{2, 3, 4};
        for (size_t port : ports) {
          if (port >= op.inputs().size()) continue;  // no gamma
          for (uint32_t bits : {0x7fffffffu, 0xffffffffu}) {
            SCOPED_TRACE(std::string(s.isa) + " " + fmt + " " + dims_to_string(shape) + " " +
                         op.label() + " port " + std::to_string(port) + " bits " +
                         std::to_string(bits));
            auto inputs = inputs_for(g, ++seed);
            auto* stat = static_cast<float*>(inputs.at(op.inputs()[port].id).data());
            std::memcpy(&stat[1], &bits, sizeof bits);
            std::memcpy(&stat[3], &bits, sizeof bits);
            std::string kernel;
            const auto got = run(g, "jit", s.variant, inputs, &kernel);
            EXPECT_EQ(kernel.find(std::string("jit:") + s.isa + ":bf16"), 0u) << kernel;
            const auto want = run(g, "ref", "", inputs);
            auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
            ASSERT_TRUE(cg.ok());
            const int64_t data_out = op.outputs()[0].id;
            const auto& w = want.at(data_out);
            const auto* y = reinterpret_cast<const uint16_t*>(got.at(data_out).bytes.data());
            int64_t nans = 0, lost = 0;
            for (size_t k = 0; k < w.bytes.size() / 2; ++k) {
              const bool want_nan =
                  std::isnan(bf16_to_float(reinterpret_cast<const uint16_t*>(w.bytes.data())[k]));
              nans += want_nan;
              lost += want_nan && !std::isnan(bf16_to_float(y[k]));
            }
            EXPECT_GT(nans, 0);  // the case tests what it says
            EXPECT_EQ(lost, 0) << "of " << nans << " NaN";
            auto v =
                oracle::check_output(cg->lowered_graph(), inputs, data_out, got.at(data_out), w);
            ASSERT_TRUE(v.ok());
            EXPECT_EQ(v->error.nan_mismatch, 0);
            EXPECT_TRUE(v->pass) << v->error.rel_l2 << " > " << v->limit;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace normgrad
