// Hardening: resource limits, aliasing outputs, NaN isolation per channel and
// concurrent execution and compilation on every backend.
#include <cmath>
#include <limits>
#include <thread>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/limits.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

struct LimitsScope {
  explicit LimitsScope(const ResourceLimits& l) : saved(resource_limits()) {
    set_resource_limits(l);
  }
  ~LimitsScope() { set_resource_limits(saved); }
  ResourceLimits saved;
};

TEST(Hardening, TwentyGigabyteTensorIsRefusedBeforeAllocation) {
  Graph g;
  // 5.4e9 f32 elements: about 20 GB per data tensor.
  ASSERT_TRUE(
      g.add_op(bn_bwd({64, 64, 1152, 1152}, "NCX", DataType::kF32, DataType::kF32, true, 3)).ok());
  EXPECT_STATUS_HAS(g.finalize(), "over the limit of 4294967296 (NORMGRAD_MAX_TENSOR_BYTES)");
  ResourceLimits small;
  small.max_tensor_bytes = 1 << 20;
  small.max_total_bytes = 3 << 20;
  LimitsScope scope(small);
  Graph h;
  ASSERT_TRUE(
      h.add_op(bn_bwd({4, 64, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3)).ok());
  EXPECT_STATUS_HAS(h.finalize(), "over the limit of 3145728 (NORMGRAD_MAX_TOTAL_BYTES)");
}

TEST(Hardening, GraphSizeLimits) {
  ResourceLimits l;
  l.max_ops = 1;
  LimitsScope scope(l);
  Graph g;
  Op a(0, OpKind::kReLU, "a"), b(1, OpKind::kReLU, "b");
  a.add_input(lt(0, DataType::kF32, {4})).add_output(lt(1, DataType::kF32, {4}));
  b.add_input(lt(1, DataType::kF32, {4})).add_output(lt(2, DataType::kF32, {4}));
  ASSERT_TRUE(g.add_op(a).ok());
  ASSERT_TRUE(g.add_op(b).ok());
  EXPECT_STATUS_HAS(g.finalize(), "over the limit of 1 (NORMGRAD_MAX_OPS)");
  l.max_ops = 100;
  l.max_json_bytes = 10;
  set_resource_limits(l);
  EXPECT_STATUS_HAS(graph_from_json("{\"graph\": []}"), "the limit is");
}

TEST(Hardening, AliasingOutputsAreRefused) {
  Graph g;
  Op r(0, OpKind::kReLU, "r");
  LogicalTensor out = lt(1, DataType::kF32, {4, 4});
  out.strides = {1, 1};  // element (i, j) and (j, i) share an address
  r.add_input(lt(0, DataType::kF32, {4, 4})).add_output(out);
  ASSERT_TRUE(g.add_op(r).ok());
  EXPECT_STATUS_HAS(g.finalize(), "has overlapping strides 1x1");
  // A broadcast input (stride 0) is fine.
  Graph h;
  Op s(0, OpKind::kReLU, "s");
  LogicalTensor in = lt(0, DataType::kF32, {4, 4});
  in.strides = {0, 1};
  s.add_input(in).add_output(lt(1, DataType::kF32, {4, 4}));
  ASSERT_TRUE(h.add_op(s).ok());
  EXPECT_TRUE(h.finalize().ok());
}

// The backends built into this library that run `dt`.
std::vector<std::string> backends_for(DataType dt) {
  std::vector<std::string> v = {"ref"};
  if (find_backend("jit")) v.push_back("jit");
  // oneDNN only where it builds the kernel on this CPU (DnnlBackend's sweeps
  // check the refusal elsewhere).
  if (find_backend("dnnl") && testing_util::dnnl_runs(dt)) v.push_back("dnnl");
  return v;
}

// A NaN in channel 1's src poisons channel 1's outputs only.
TEST(Hardening, NanStaysInItsChannel) {
  for (const char* fmt : {"NCX", "NXC"}) {
    for (const std::string& backend : backends_for(DataType::kF32)) {
      const Dims shape = std::string(fmt) == "NCX" ? Dims{2, 3, 4, 4} : Dims{2, 4, 4, 3};
      Graph g;
      ASSERT_TRUE(g.add_op(bn_bwd(shape, fmt, DataType::kF32, DataType::kF32, true, 3)).ok());
      auto cg = CompiledGraph::compile(g, CompileOptions{backend});
      ASSERT_TRUE(cg.ok()) << backend << ": " << cg.status().to_string();
      std::map<int64_t, std::string> sources;
      auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 2, &sources);
      ASSERT_TRUE(inputs.ok());
      float* x = static_cast<float*>(inputs->at(0).data());
      const int64_t nan_at =
          std::string(fmt) == "NCX" ? 16 + 5 : 5 * 3 + 1;  // an element of channel 1
      x[nan_at] = std::numeric_limits<float>::quiet_NaN();
      std::map<int64_t, const void*> in;
      for (auto& [id, b] : *inputs) in[id] = b.data();
      std::map<int64_t, oracle::Buffer> outs;
      std::map<int64_t, void*> p;
      for (const LogicalTensor& t : cg->outputs())
        p[t.id] = outs.emplace(t.id, *oracle::allocate(t)).first->second.data();
      ASSERT_TRUE(cg->execute(in, p).ok());
      const float* dx = static_cast<const float*>(p[5]);
      const float* dg = static_cast<const float*>(p[6]);
      EXPECT_TRUE(std::isnan(dg[1])) << fmt << " " << backend;
      EXPECT_FALSE(std::isnan(dg[0]) || std::isnan(dg[2])) << fmt << " " << backend;
      for (int64_t i = 0; i < 96; ++i) {
        const int64_t c = std::string(fmt) == "NCX" ? (i / 16) % 3 : i % 3;
        EXPECT_EQ(std::isnan(dx[i]), c == 1) << fmt << " " << backend << " element " << i;
      }
    }
  }
}

// NaN and Inf in any input of the backward, the forward and the backward from
// dst, in every data dtype, on every backend that runs it: the poisoned
// channel's outputs are non-finite exactly where ref's are, every other
// channel stays finite, and ref's outputs on the clean inputs are all finite.
Op poisoned_case_op(int kind, const Dims& shape, const char* fmt, DataType dt) {
  const int64_t c = std::string(fmt) == "NCX" ? shape[1] : shape.back();
  if (kind == 0) return bn_bwd(shape, fmt, dt, DataType::kF32, true, 3);
  if (kind == 1) {
    Op op(0, OpKind::kBatchNormForwardTraining, "fwd");
    op.set_attr("epsilon", 1e-3f)
        .set_attr("momentum", 0.1f)
        .set_attr("data_format", std::string(fmt));
    op.add_input(lt(0, dt, shape));
    for (int i = 1; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {c}));
    op.add_output(lt(5, dt, shape));
    for (int i = 6; i <= 9; ++i) op.add_output(lt(i, DataType::kF32, {c}));
    return op;
  }
  Op op(0, OpKind::kBatchNormTrainingBackwardFromDst, "from_dst");
  op.set_attr("epsilon", 1e-3f).set_attr("data_format", std::string(fmt));
  op.set_attr("activation", std::string("leaky_relu")).set_attr("alpha", 0.1f);
  op.add_input(lt(0, dt, shape)).add_input(lt(1, dt, shape));
  for (int i = 2; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {c}));
  op.add_output(lt(5, dt, shape));
  op.add_output(lt(6, DataType::kF32, {c})).add_output(lt(7, DataType::kF32, {c}));
  return op;
}

// The channel of element i of a buffer of `desc` (dense): per-channel vectors
// are indexed by channel, data tensors by their layout.
int64_t channel_of(const LogicalTensor& desc, const char* fmt, int64_t i) {
  if (desc.dims.size() == 1) return i;
  if (std::string(fmt) == "NXC") return i % desc.dims.back();
  int64_t inner = 1;
  for (size_t d = 2; d < desc.dims.size(); ++d) inner *= desc.dims[d];
  return (i / inner) % desc.dims[1];
}

TEST(Hardening, NanAndInfStayInTheirChannelEverywhere) {
  int ran = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      for (const char* fmt : {"NCX", "NXC"}) {
        const Dims shape = std::string(fmt) == "NCX" ? Dims{2, 3, 4, 5} : Dims{2, 4, 5, 3};
        const Graph g = testing_util::one_op(poisoned_case_op(kind, shape, fmt, dt));
        auto ref = CompiledGraph::compile(g, CompileOptions{"ref"});
        ASSERT_TRUE(ref.ok()) << ref.status().to_string();
        auto clean = oracle::make_inputs(ref->graph(), ref->lowered_graph(), "", 6, nullptr);
        ASSERT_TRUE(clean.ok());
        auto clean_out = testing_util::run_outputs(*ref, *clean);
        ASSERT_TRUE(clean_out.ok());
        for (const auto& [id, b] : *clean_out) {
          for (int64_t i = 0; i < *b.desc.element_count(); ++i) {
            ASSERT_TRUE(std::isfinite(load_as_double(b.data(), i, b.desc.dtype)))
                << "ref gave a non-finite output from finite inputs: kind " << kind << " "
                << dtype_name(dt) << " " << fmt << " tensor " << id << " element " << i;
          }
        }
        for (const std::string& backend : backends_for(dt)) {
          auto cg = CompiledGraph::compile(g, CompileOptions{backend});
          if (!cg.ok()) {  // oneDNN has no backward from dst; the JIT and ref take every case
            ASSERT_EQ(backend, "dnnl") << cg.status().to_string();
            ASSERT_EQ(cg.status().code(), StatusCode::kUnimplemented) << cg.status().to_string();
            continue;
          }
          for (int port = 0; port < 5; ++port) {
            for (double poison : {std::nan(""), static_cast<double>(INFINITY)}) {
              auto inputs = *clean;
              oracle::Buffer& b = inputs.at(port);
              // The last element of channel 1 (the entry, for per-channel inputs).
              int64_t at = -1;
              for (int64_t i = 0; i < *b.desc.element_count(); ++i)
                if (channel_of(b.desc, fmt, i) == 1) at = i;
              store_from_double(b.data(), at, b.desc.dtype, poison);
              auto got = testing_util::run_outputs(*cg, inputs);
              auto want = testing_util::run_outputs(*ref, inputs);
              if (!want.ok()) {  // a rule of the op (FromDst's gamma): refused alike
                EXPECT_EQ(want.status().code(), StatusCode::kInvalidArgument)
                    << want.status().to_string();
                EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument)
                    << backend << ": " << got.status().to_string();
                ++ran;
                continue;
              }
              ASSERT_TRUE(got.ok())
                  << backend << " kind " << kind << " " << dtype_name(dt) << " " << fmt << " port "
                  << port << " poison " << poison << ": " << got.status().to_string();
              for (const auto& [id, w] : *want) {
                const oracle::Buffer& o = got->at(id);
                for (int64_t i = 0; i < *w.desc.element_count(); ++i) {
                  const bool fg = std::isfinite(load_as_double(o.data(), i, o.desc.dtype));
                  const bool fw = std::isfinite(load_as_double(w.data(), i, w.desc.dtype));
                  const int64_t ch = channel_of(w.desc, fmt, i);
                  ASSERT_EQ(fg, fw) << backend << " kind " << kind << " " << dtype_name(dt) << " "
                                    << fmt << " port " << port << " poison " << poison << " tensor "
                                    << id << " element " << i;
                  if (ch != 1) {
                    ASSERT_TRUE(fw)
                        << "ref leaked the poison to channel " << ch << ": kind " << kind << " "
                        << dtype_name(dt) << " " << fmt << " port " << port << " poison " << poison
                        << " at " << at << " tensor " << id << " element " << i;
                  }
                }
              }
              ++ran;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(ran, 3 * 3 * 2 * 5 * 2 * 2);  // ref and the JIT at least
}

// Many threads at once compiling and running different problems (shapes,
// dtypes, layouts, forward and backward) through the kernel caches, the
// thread pool and the per-thread scratch: each result is the bits the same
// problem gives when run alone.
TEST(Hardening, ManyThreadsCompileAndRunDifferentProblemsAtOnce) {
  struct Case {
    int kind;  // 0 backward, 1 forward
    Dims shape;
    const char* fmt;
    DataType dt;
  };
  const std::vector<Case> cases = {
      {0, {4, 24, 9, 9}, "NCX", DataType::kF32},
      {0, {4, 9, 9, 24}, "NXC", DataType::kBF16},
      {1, {2, 40, 7, 7}, "NCX", DataType::kF16},
      {1, {2, 7, 7, 40}, "NXC", DataType::kF32},
      {0, {3, 5, 33}, "NCX", DataType::kF16},
      {1, {8, 64}, "NXC", DataType::kBF16},
      {0, {2, 7, 6, 5, 130}, "NXC", DataType::kF32},
      {1, {1, 3, 50, 50}, "NCX", DataType::kBF16},
      // Large enough for the thread pool (the small ones run on one thread).
      {0, {8, 64, 28, 28}, "NCX", DataType::kF32},
      {1, {4, 28, 28, 128}, "NXC", DataType::kBF16}};
  auto run_case = [&](const Case& k, std::map<int64_t, oracle::Buffer>* out) -> Status {
    const Graph g = testing_util::one_op(poisoned_case_op(k.kind, k.shape, k.fmt, k.dt));
    NG_ASSIGN_OR_RETURN(CompiledGraph cg, CompiledGraph::compile(g, CompileOptions{"auto"}));
    NG_ASSIGN_OR_RETURN(auto inputs,
                        oracle::make_inputs(cg.graph(), cg.lowered_graph(), "", 11, nullptr));
    NG_ASSIGN_OR_RETURN(*out, testing_util::run_outputs(cg, inputs));
    return ok_status();
  };
  std::vector<std::map<int64_t, oracle::Buffer>> alone(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) ASSERT_TRUE(run_case(cases[k], &alone[k]).ok()) << k;
  constexpr int kThreads = 8, kRounds = 6;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const size_t k = static_cast<size_t>(t * 3 + r * 5) % cases.size();
        std::map<int64_t, oracle::Buffer> out;
        const Status s = run_case(cases[k], &out);
        if (!s.ok()) {
          failures[static_cast<size_t>(t)] = "case " + std::to_string(k) + ": " + s.to_string();
          return;
        }
        for (const auto& [id, b] : alone[k]) {
          if (out.at(id).bytes != b.bytes) {
            failures[static_cast<size_t>(t)] =
                "case " + std::to_string(k) + " tensor " + std::to_string(id) + " differs";
            return;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], "") << t;
}

// One compiled graph executed from 8 threads at once, each with its own buffers,
// gives the serial bits; and compiling from several threads at once works.
TEST(Hardening, EightThreadsGiveTheSerialBitsOnEveryBackend) {
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (const std::string& backend : backends_for(dt)) {
      SCOPED_TRACE(backend + " " + dtype_name(dt));
      Graph g;
      ASSERT_TRUE(g.add_op(bn_bwd({4, 24, 20, 20}, "NXC", dt, DataType::kF32, true, 3)).ok());
      std::vector<std::thread> compilers;
      std::vector<int> compiled_ok(4, 0);
      for (int t = 0; t < 4; ++t) {
        compilers.emplace_back(
            [&, t] { compiled_ok[t] = CompiledGraph::compile(g, CompileOptions{backend}).ok(); });
      }
      for (auto& th : compilers) th.join();
      EXPECT_EQ(compiled_ok, std::vector<int>(4, 1));
      auto cg = CompiledGraph::compile(g, CompileOptions{backend});
      ASSERT_TRUE(cg.ok());
      std::map<int64_t, std::string> sources;
      auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 8, &sources);
      std::map<int64_t, const void*> in;
      for (auto& [id, b] : *inputs) in[id] = b.data();
      auto run_once = [&](std::map<int64_t, oracle::Buffer>& outs) {
        std::map<int64_t, void*> p;
        for (const LogicalTensor& t : cg->outputs())
          p[t.id] = outs.emplace(t.id, *oracle::allocate(t)).first->second.data();
        return cg->execute(in, p);
      };
      std::map<int64_t, oracle::Buffer> serial;
      ASSERT_TRUE(run_once(serial).ok());
      std::vector<std::map<int64_t, oracle::Buffer>> results(8);
      std::vector<Status> status(8);
      std::vector<std::thread> threads;
      for (int t = 0; t < 8; ++t)
        threads.emplace_back([&, t] { status[t] = run_once(results[t]); });
      for (auto& th : threads) th.join();
      for (int t = 0; t < 8; ++t) {
        ASSERT_TRUE(status[t].ok()) << status[t].to_string();
        for (const auto& [id, b] : serial)
          EXPECT_EQ(results[t].at(id).bytes, b.bytes) << "thread " << t;
      }
    }
  }
}

}  // namespace
}  // namespace normgrad
