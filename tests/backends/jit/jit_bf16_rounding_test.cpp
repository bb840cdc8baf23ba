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

using jit_test::bf16_to_float;
using jit_test::conf_for;
using jit_test::form_op;
using jit_test::forward_graph;
using jit_test::inputs_for;
using jit_test::IsaScope;
using jit_test::run_jit;
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

std::vector<Graph> graphs(const Dims& shape, const char* fmt) {
  std::vector<Graph> g;
  for (int form : {0, 1, 4}) g.push_back(one_op(form_op(shape, fmt, DataType::kBF16, form)));
  g.push_back(forward_graph(shape, 0, fmt));  // gamma 13, beta 14
  return g;
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
        if (g.ops().front().kind() == OpKind::kBatchNormTrainingBackward) {
          // The variant reaches the conf: the integer path, not the instruction.
          EXPECT_FALSE(conf_for(g.ops().front(), s.variant).avx512_bf16);
          EXPECT_EQ(conf_for(g.ops().front()).avx512_bf16,
                    *s.variant && jit::cpu_has_avx512_bf16());
        }
        const auto r = compare_with_ref(g, "jit", ++seed, 0.0, s.variant);
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_EQ(r.kernel.find(std::string("jit:") + s.isa + ":bf16"), 0u) << r.kernel;
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        if (!*s.variant || !jit::cpu_has_avx512_bf16()) continue;
        // vcvtneps2bf16 rounds to nearest even as the integer code does; it
        // also flushes denormals, which batch-norm outputs here never are.
        const auto inputs = inputs_for(g, seed);
        std::string kernels;
        const auto integer = run_jit(g, s.variant, inputs, &kernels);
        const auto hardware = run_jit(g, "", inputs, &kernels);
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
            const auto got = run_jit(g, s.variant, inputs, &kernel);
            EXPECT_EQ(kernel.find(std::string("jit:") + s.isa + ":bf16"), 0u) << kernel;
            auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
            ASSERT_TRUE(cg.ok());
            const auto ran = oracle::run_outputs(*cg, inputs);
            ASSERT_TRUE(ran.ok());
            const auto& want = *ran;
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
