// Helpers shared by the JIT backend's tests: the ISA paths this CPU can run,
// the output forms, runs at a given thread count, and fused producers.
#pragma once

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace jit_test {

using testing_util::bn_bwd;

// The ISAs to test here: each one the CPU has, plus the portable path.
inline std::vector<std::string> isas() {
  std::vector<std::string> v = {"portable"};
  const jit::Isa best = jit::detect_isa("avx512");
  if (best != jit::Isa::kPortable) v.push_back("avx2");
  if (best == jit::Isa::kAvx512) v.push_back("avx512");
  return v;
}

struct IsaScope {
  explicit IsaScope(const std::string& isa) { setenv("NORMGRAD_JIT", isa.c_str(), 1); }
  ~IsaScope() { unsetenv("NORMGRAD_JIT"); }
};

// Forms 3-5 of make_case: frozen statistics, training with diff_src only, inverse std.
inline void apply_form(Op& op, int form) {
  if (form == 3) op.set_attr("is_training", false);
  if (form == 4) op.set_attr("is_training", true);
  if (form == 5) op.set_attr("is_training", true).set_attr("variance_is_inv_std", true);
}

// Runs `g` on the JIT with `threads` threads, capped through oneTBB's
// global_control or, with `through_api`, normgrad::set_num_threads; returns
// every output's bytes.
inline std::map<int64_t, std::vector<char>> run_with_threads(const Graph& g, int threads,
                                                             bool through_api = false) {
  tbb::global_control limit(
      tbb::global_control::max_allowed_parallelism,
      through_api ? tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)
                  : static_cast<size_t>(threads));
  if (through_api) set_num_threads(threads);
  auto cg = CompiledGraph::compile(g, CompileOptions{"jit"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 11, &sources);
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> outs;
  std::map<int64_t, void*> p;
  for (const LogicalTensor& lt : cg->outputs())
    p[lt.id] = outs.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
  EXPECT_TRUE(cg->execute(in, p).ok());
  std::map<int64_t, std::vector<char>> bytes;
  for (auto& [id, b] : outs) bytes[id].assign(b.bytes.begin(), b.bytes.end());
  return bytes;
}

inline void expect_same_bits_for_1_2_4_threads(const Graph& g) {
  const auto one = run_with_threads(g, 1);
  const auto two = run_with_threads(g, 2), four = run_with_threads(g, 4);
  for (const auto& [id, b] : one) {
    EXPECT_EQ(b, two.at(id)) << "tensor " << id;
    EXPECT_EQ(b, four.at(id)) << "tensor " << id;
  }
}

// A ReLUBackward (port 0: src) or an Add (port 1: diff_dst) feeding an f32
// batch-norm backward.
inline Graph fused_on_port(const Dims& shape, const char* fmt, int port,
                           DataType dt = DataType::kF32) {
  Op pre(1, port == 0 ? OpKind::kReLUBackward : OpKind::kAdd, "pre");
  pre.add_input(testing_util::lt(30, dt, shape)).add_input(testing_util::lt(31, dt, shape));
  pre.add_output(testing_util::lt(20, dt, shape));
  Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  bn.mutable_inputs()[port].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(pre).ok());
  EXPECT_TRUE(g.add_op(bn).ok());
  return g;
}

// Whether the AVX-512 JIT streams diff_src of `tensor_bytes`: past half the
// L3, or when src, diff_dst and diff_src together exceed the L3.
inline bool streams(int64_t tensor_bytes) {
  const int64_t l3 = jit::cache_sizes().l3_bytes;
  return tensor_bytes > l3 / 2 || 3 * tensor_bytes > l3;
}

}  // namespace jit_test
}  // namespace normgrad
