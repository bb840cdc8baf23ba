// Helpers shared by the JIT backend's tests: the ISA paths this CPU can run,
// the output forms, runs at a given thread count, fused producers, and runs
// of bf16 graphs under a variant.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace jit_test {

using testing_util::bn_bwd;

// The ISAs to test here: each one the JIT runs on this CPU under the
// NORMGRAD_JIT cap the test process got (NORMGRAD_JIT=avx2 emulates an AVX2
// host), plus the portable path.
inline std::vector<std::string> isas() {
  std::vector<std::string> v = {"portable"};
  const jit::Isa best = jit::detect_isa();
  if (best != jit::Isa::kPortable) v.push_back("avx2");
  if (best == jit::Isa::kAvx512) v.push_back("avx512");
  return v;
}

// Why `isa` ("avx512", "avx2" or "portable") cannot run here, or "" when it
// can: a test skips with this reason rather than pass on another path.
inline std::string isa_unavailable(const std::string& isa) {
  const jit::Isa here = jit::detect_isa();
  if ((isa == "avx512" && here != jit::Isa::kAvx512) ||
      (isa == "avx2" && here == jit::Isa::kPortable))
    return std::string("the JIT runs ") + jit::isa_name(here) +
           " here (CPU or NORMGRAD_JIT), not " + isa;
  return "";
}

// A batch-norm data shape in `fmt` ("NCX" or "NXC"): batch n, c channels,
// rank - 2 spatial dims (s0, 3, 5).
inline Dims bn_data_shape(const std::string& fmt, int rank, int64_t c, int64_t n, int64_t s0) {
  Dims shape = {n};
  const int64_t spatial[] = {s0, 3, 5};
  if (fmt == "NCX") shape.push_back(c);
  for (int i = 0; i < rank - 2; ++i) shape.push_back(spatial[i]);
  if (fmt == "NXC") shape.push_back(c);
  return shape;
}

// The forward sweeps' cases: f32, bf16 and f16, NCX and NXC, ranks 2 to 5,
// channel counts from 1 to 251, `forms` forms of each, in that order; `run`
// gets each case and its index. Returns the number of cases.
inline int for_each_forward_case(
    int forms,
    const std::function<void(DataType, const std::string&, const Dims&, int, int)>& run) {
  int ran = 0;
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (const char* fmt : {"NCX", "NXC"}) {
      for (int rank = 2; rank <= 5; ++rank) {
        for (int64_t c : {1, 3, 16, 17, 64, 251}) {
          for (int form = 0; form < forms; ++form) {
            const Dims shape = bn_data_shape(fmt, rank, c, rank == 2 ? 40 : 3, 37);
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + fmt + " " + dims_to_string(shape) +
                         " form " + std::to_string(form));
            run(dt, fmt, shape, form, ran++);
          }
        }
      }
    }
  }
  return ran;
}

// What the forward epilogue adds after a batch norm whose dst is tensor 20:
// an Add of tensor 30 (into 31), then a ReLU, or a LeakyReLU when `alpha` is
// given (into 40).
inline void add_forward_epilogue(Graph* g, const Dims& shape, DataType dt, bool residual, bool relu,
                                 std::optional<float> alpha = std::nullopt) {
  using testing_util::lt;
  int64_t y = 20;
  if (residual) {
    Op add(2, OpKind::kAdd, "add");
    add.add_input(lt(y, dt, shape)).add_input(lt(30, dt, shape)).add_output(lt(31, dt, shape));
    EXPECT_TRUE(g->add_op(add).ok());
    y = 31;
  }
  if (relu) {
    Op act(3, alpha ? OpKind::kLeakyReLU : OpKind::kReLU, alpha ? "leaky_relu" : "relu");
    if (alpha) act.set_attr("alpha", *alpha);
    act.add_input(lt(y, dt, shape)).add_output(lt(40, dt, shape));
    EXPECT_TRUE(g->add_op(act).ok());
  }
}

// NORMGRAD_JIT set to `isa` for a scope, and put back as it was after.
struct IsaScope {
  explicit IsaScope(const std::string& isa) {
    const char* old = std::getenv("NORMGRAD_JIT");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("NORMGRAD_JIT", isa.c_str(), 1);
  }
  ~IsaScope() {
    if (had_)
      setenv("NORMGRAD_JIT", old_.c_str(), 1);
    else
      unsetenv("NORMGRAD_JIT");
  }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  bool had_ = false;
  std::string old_;
};

// Forms 3-5 of make_case: frozen statistics, training with diff_src only, inverse std.
inline void apply_form(Op& op, int form) {
  if (form == 3) op.set_attr("is_training", false);
  if (form == 4) op.set_attr("is_training", true);
  if (form == 5) op.set_attr("is_training", true).set_attr("variance_is_inv_std", true);
}

// A batch-norm backward of `shape` in output form `form` (0-5; epsilon 1e-3):
// form 1 without gamma, forms 2 and 4 diff_src only, 3-5 as apply_form says.
inline Op form_op(const Dims& shape, const char* fmt, DataType dt, int form,
                  DataType sdt = DataType::kF32) {
  Op op = bn_bwd(shape, fmt, dt, sdt, form != 1, form == 2 || form == 4 ? 1 : 3, 1e-3f);
  apply_form(op, form);
  return op;
}

// What the kernel name of a rows kernel fused on port 0 (src) or 1 (diff_dst) holds.
inline const char* fused_rows_feature(int port) {
  return port == 0 ? ":rows+src_" : ":rows+diff_dst_";
}

// Runs `g` on the JIT with `threads` threads, capped through oneTBB's
// global_control or, with `through_api`, normgrad::set_num_threads, under
// `jit_variant` when given; returns every output's bytes.
inline std::map<int64_t, std::vector<char>> run_with_threads(const Graph& g, int threads,
                                                             bool through_api = false,
                                                             const std::string& jit_variant = "") {
  tbb::global_control limit(
      tbb::global_control::max_allowed_parallelism,
      through_api ? tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)
                  : static_cast<size_t>(threads));
  if (through_api) set_num_threads(threads);
  std::map<int64_t, std::vector<char>> bytes;
  CompileOptions options{"jit"};
  options.jit_variant = jit_variant;
  auto cg = CompiledGraph::compile(g, options);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return bytes;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 11, nullptr);
  EXPECT_TRUE(inputs.ok()) << inputs.status().to_string();
  if (!inputs.ok()) return bytes;
  auto outs = testing_util::run_outputs(*cg, *inputs);
  EXPECT_TRUE(outs.ok()) << outs.status().to_string();
  if (!outs.ok()) return bytes;
  for (auto& [id, b] : *outs) bytes[id].assign(b.bytes.begin(), b.bytes.end());
  return bytes;
}

inline void expect_same_bits_for_1_2_4_threads(const Graph& g,
                                               const std::string& jit_variant = "") {
  const auto one = run_with_threads(g, 1, false, jit_variant);
  const auto two = run_with_threads(g, 2, false, jit_variant);
  const auto four = run_with_threads(g, 4, false, jit_variant);
  for (const auto& [id, b] : one) {
    EXPECT_EQ(b, two.at(id)) << "tensor " << id;
    EXPECT_EQ(b, four.at(id)) << "tensor " << id;
  }
}

// body(trace, dt, fmt, shape, k) for every ISA the host runs, dtype, layout
// and shape (walks the sizes choose: grouped and single rows, pixels,
// swept and blocked), k counting the cases.
inline void each_case(
    const std::function<void(const std::string&, DataType, const char*, const Dims&, int)>& body) {
  int k = 0;
  for (const std::string& isa : isas()) {
    IsaScope scope(isa);
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const char* fmt : {"NCX", "NXC"}) {
        for (const Dims& nchw :
             {Dims{3, 17, 5, 7}, Dims{2, 40, 33, 33}, Dims{2, 256, 7, 7}, Dims{2, 1024, 3, 3}}) {
          const Dims shape =
              std::string(fmt) == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
          body(isa + " " + dtype_name(dt) + " " + fmt + " " + dims_to_string(shape), dt, fmt, shape,
               k++);
        }
      }
    }
  }
}

// A producer of `kind` (ReLUBackward, with use_dst when given, or Add)
// feeding port `port` (0: src, 1: diff_dst) of a batch-norm backward with f32
// statistics.
inline Graph fused_graph(const Dims& shape, const char* fmt, OpKind kind, int port, DataType dt,
                         std::optional<bool> use_dst = std::nullopt) {
  Op pre(1, kind, "pre");
  if (use_dst) pre.set_attr("use_dst", *use_dst);
  pre.add_input(testing_util::lt(30, dt, shape)).add_input(testing_util::lt(31, dt, shape));
  pre.add_output(testing_util::lt(20, dt, shape));
  Op bn = bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  bn.mutable_inputs()[port].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(pre).ok());
  EXPECT_TRUE(g.add_op(bn).ok());
  return g;
}

// A ReLUBackward (port 0: src) or an Add (port 1: diff_dst) feeding an f32
// batch-norm backward.
inline Graph fused_on_port(const Dims& shape, const char* fmt, int port,
                           DataType dt = DataType::kF32) {
  return fused_graph(shape, fmt, port == 0 ? OpKind::kReLUBackward : OpKind::kAdd, port, dt);
}

// Both fused producers (a ReLUBackward on src, an Add on diff_dst) of an NCX
// batch norm of `shape` in `dt`, each through check(graph, what, the fused
// rows kernel's name part).
template <typename Check>
void check_fused_rows(const Check& check, const Dims& shape, DataType dt) {
  for (int port : {0, 1}) {
    check(fused_on_port(shape, "NCX", port, dt),
          std::string("fused on port ") + std::to_string(port) + " " + dtype_name(dt),
          fused_rows_feature(port));
  }
}

// Runs `g` on the JIT against ref (inputs from `seed`): the JIT must take it,
// on `isa`'s code when one is given, with `feature` in its kernel name, and
// every output within its tolerance.
inline void expect_jit_matches_ref(const Graph& g, uint64_t seed, const std::string& isa = "",
                                   const std::string& feature = "",
                                   const std::string& jit_variant = "") {
  const auto r = testing_util::compare_with_ref(g, "jit", seed, 0.0, jit_variant);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  if (!isa.empty()) {
    EXPECT_EQ(r.kernel.find("jit:" + isa + ":"), 0u) << r.kernel;
  }
  EXPECT_NE(r.kernel.find(feature), std::string::npos) << r.kernel;
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
}

// check(graph, what[, feature]) for a test that sweeps the ISAs:
// expect_jit_matches_ref on `isa` (with `jit_variant` when given), traced with
// `what`, each call on the next seed from `seed_base` (the counter runs on
// across the ISAs of the test).
class RefCheck {
 public:
  RefCheck(std::string isa, uint64_t seed_base, int* ran, std::string jit_variant = "")
      : isa_(std::move(isa)), variant_(std::move(jit_variant)), seed_base_(seed_base), ran_(ran) {}
  void operator()(const Graph& g, const std::string& what, const std::string& feature = "") const {
    SCOPED_TRACE(isa_ + " " + what);
    expect_jit_matches_ref(g, seed_base_ + static_cast<uint64_t>((*ran_)++), isa_, feature,
                           variant_);
  }

 private:
  std::string isa_;
  std::string variant_;
  uint64_t seed_base_;
  int* ran_;
};

// The JIT's conf for `op` on the ISA that NORMGRAD_JIT selects, under
// `jit_variant` when given; a conf that fails is a test failure (and gives a
// default conf, every choice off).
inline jit::BnConf conf_for(const Op& op, const std::string& jit_variant = "") {
  auto conf = jit::make_conf(op, jit::detect_isa());
  EXPECT_TRUE(conf.ok()) << conf.status().to_string();
  if (!conf.ok()) return jit::BnConf{};
  const Status s = jit::apply_variant(jit_variant, &*conf);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return *conf;
}

// Whether the AVX-512 JIT streams diff_src of `tensor_bytes`: past half the
// L3, or when src, diff_dst and diff_src together exceed the L3.
inline bool streams(int64_t tensor_bytes) {
  return 3 * tensor_bytes > jit::cache_sizes().l3_bytes / 4;
}

// A bf16 word as f32.
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Compiles `g` on the JIT under `variant` and runs it on `inputs`; returns
// every output and the kernel names.
inline std::map<int64_t, oracle::Buffer> run_jit(const Graph& g, const std::string& variant,
                                                 const std::map<int64_t, oracle::Buffer>& inputs,
                                                 std::string* kernel) {
  CompileOptions options{"jit"};
  options.jit_variant = variant;
  auto cg = CompiledGraph::compile(g, options);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return {};
  for (const auto& p : cg->partitions()) *kernel += p->kernel_name();
  auto outs = oracle::run_outputs(*cg, inputs);
  EXPECT_TRUE(outs.ok()) << outs.status().to_string();
  return outs.ok() ? *outs : std::map<int64_t, oracle::Buffer>{};
}

// The inputs ref's compile of `g` makes from `seed`.
inline std::map<int64_t, oracle::Buffer> inputs_for(const Graph& g, uint64_t seed) {
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  if (!cg.ok()) return {};
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", seed, nullptr);
  EXPECT_TRUE(inputs.ok()) << inputs.status().to_string();
  return inputs.ok() ? *inputs : std::map<int64_t, oracle::Buffer>{};
}

// A BatchNormForwardTraining of `shape` (`dt` in `fmt`, f32 statistics,
// gamma and beta), then nothing (epilogue 0), a ReLU (1), a LeakyReLU(0.01)
// (2) or an Add and a ReLU (3, which keeps the vector at a time).
inline Graph forward_graph(const Dims& shape, int epilogue, const char* fmt = "NCX",
                           DataType dt = DataType::kBF16) {
  using testing_util::lt;
  const DataType f32 = DataType::kF32;
  const int64_t c = std::string(fmt) == "NCX" ? shape[1] : shape.back();
  Graph g;
  Op bn(1, OpKind::kBatchNormForwardTraining, "bn");
  bn.set_attr("epsilon", 1e-3f).set_attr("data_format", fmt);
  bn.add_input(lt(10, dt, shape)).add_input(lt(11, f32, {c})).add_input(lt(12, f32, {c}));
  bn.add_input(lt(13, f32, {c})).add_input(lt(14, f32, {c}));
  bn.add_output(lt(20, dt, shape));
  for (int64_t id = 21; id <= 24; ++id) bn.add_output(lt(id, f32, {c}));
  EXPECT_TRUE(g.add_op(bn).ok());
  int64_t y = 20;
  if (epilogue == 3) {
    Op add(2, OpKind::kAdd, "add");
    add.add_input(lt(y, dt, shape)).add_input(lt(30, dt, shape)).add_output(lt(31, dt, shape));
    EXPECT_TRUE(g.add_op(add).ok());
    y = 31;
  }
  if (epilogue != 0) {
    Op act(3, epilogue == 2 ? OpKind::kLeakyReLU : OpKind::kReLU, "act");
    if (epilogue == 2) act.set_attr("alpha", 0.01f);
    act.add_input(lt(y, dt, shape)).add_output(lt(40, dt, shape));
    EXPECT_TRUE(g.add_op(act).ok());
  }
  return g;
}

}  // namespace jit_test
}  // namespace normgrad
