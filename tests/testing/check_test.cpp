// The reduction check (tools/cli_check.hpp) on single-channel, long
// reductions, where a sum near zero makes plain relative errors meaningless:
// 100 seeds per backend must pass, and a wrong sum must still fail; and the
// bound it takes for a kernel's running sums.
#include <cmath>

#include <normgrad/graph/json_io.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::one_op;

TEST(CliCheck, SingleChannelLongReductionsPassOnEveryBackendForEverySeed) {
  const struct {
    Dims shape;
    const char* format;
    DataType dt;
  } cases[] = {{{2, 1, 71, 71}, "NCX", DataType::kF32},
               {{8, 56, 56, 1}, "NXC", DataType::kF32},
               {{2, 1, 71, 71}, "NCX", DataType::kBF16}};
  int ran = 0;
  for (const char* backend : {"jit", "dnnl", "ref"}) {
    if (std::string(backend) != "ref" && find_backend(backend) == nullptr) continue;
    for (const auto& c : cases) {
      const Op op = bn_bwd(c.shape, c.format, c.dt, DataType::kF32, true, 3);
      if (std::string(backend) == "dnnl" && !testing_util::dnnl_runs(c.dt)) {
        // oneDNN has no kernel for it on this CPU (asked of oneDNN): a clear refusal.
        const auto r = compare_with_ref(one_op(op), backend, 0);
        EXPECT_TRUE(testing_util::dnnl_refuses_clearly(r.status)) << r.status.to_string();
        ran += 100;
        continue;
      }
      for (uint64_t seed = 0; seed < 100; ++seed) {
        const auto r = compare_with_ref(one_op(op), backend, seed);
        ASSERT_TRUE(r.status.ok()) << backend << ": " << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0)
            << backend << " seed " << seed << " " << dims_to_string(c.shape) << ": " << r.report;
        ++ran;
      }
    }
  }
  EXPECT_GE(ran, 300);
}

TEST(CliCheck, AWrongSumStillFails) {
  // diff_beta off by one part in 1e4 of its terms' size fails both criteria.
  Graph g = one_op(bn_bwd({2, 1, 71, 71}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  ASSERT_TRUE(g.finalize().ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  ASSERT_TRUE(cg.ok());
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 5, &sources);
  ASSERT_TRUE(inputs.ok());
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> want;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt : cg->outputs())
    out[lt.id] = want.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
  ASSERT_TRUE(cg->execute(in, out).ok());
  const int64_t diff_beta = cg->outputs()[2].id;
  oracle::Buffer got = want.at(diff_beta);
  // sum |dy| over 10082 values in [-1, 1) is ~5000: an error of 1 is 2e-4 of it.
  static_cast<float*>(got.data())[0] += 1.0f;
  auto v = oracle::check_output(cg->lowered_graph(), *inputs, diff_beta, got, want.at(diff_beta));
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->pass) << v->error.rel_l2 << " " << v->cond_error << " " << v->cond_limit;
  EXPECT_GT(v->cond_error, v->cond_limit);
  auto same = oracle::check_output(cg->lowered_graph(), *inputs, diff_beta, want.at(diff_beta),
                                   want.at(diff_beta));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->pass);
}

// The batch mean of a dequantized src (terms on the quantizer's lattice,
// whose running f32 sum does not cancel its roundings): from a kernel that
// adds its terms one by one it is held to the bound of any summation order,
// (m - 1) u against its terms, so an error of 10 sqrt(m) u of them passes (a
// running sum of 8960 such terms reached 7); from a blocked kernel the same
// error fails, and one of 1e-2 fails from either. The zero point centres the
// data, so the mean is small next to its terms and the plain relative check
// alone would refuse all of them.
TEST(CliCheck, RunningSumsTakeTheOrderFreeBound) {
  using testing_util::lt;
  const Dims shape = {4, 64, 5, 7, 2};
  Graph g;
  Op dq(1, OpKind::kDequantize, "dq");
  dq.set_attr("qtype", std::string("per_tensor")).set_attr("axis", int64_t{1});
  dq.set_attr("scales", std::vector<float>{0.01f}).set_attr("zps", std::vector<int64_t>{128});
  dq.add_input(lt(10, DataType::kU8, shape)).add_output(lt(11, DataType::kF32, shape));
  ASSERT_TRUE(g.add_op(dq).ok());
  Op bn(2, OpKind::kBatchNormForwardTraining, "bn");
  bn.set_attr("epsilon", 0.1f).set_attr("data_format", std::string("NXC"));
  bn.add_input(lt(11, DataType::kF32, shape));
  for (int64_t id = 12; id <= 15; ++id) bn.add_input(lt(id, DataType::kF32, {2}));
  bn.add_output(lt(20, DataType::kF32, shape));
  for (int64_t id = 21; id <= 24; ++id) bn.add_output(lt(id, DataType::kF32, {2}));
  ASSERT_TRUE(g.add_op(bn).ok());
  ASSERT_TRUE(g.finalize().ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 7, nullptr);
  ASSERT_TRUE(inputs.ok());
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> want;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt_out : cg->outputs())
    out[lt_out.id] = want.emplace(lt_out.id, *oracle::allocate(lt_out)).first->second.data();
  ASSERT_TRUE(cg->execute(in, out).ok());
  const int64_t mean = 23;  // the batch mean (port 3)
  ASSERT_EQ(want.count(mean), 1u);
  // The terms' size: mean |x| of channel 0.
  const auto* q = static_cast<const uint8_t*>(inputs->at(10).data());
  double terms = 0.0;
  const int64_t m = 4 * 64 * 5 * 7;
  for (int64_t i = 0; i < m; ++i) terms += std::fabs((q[2 * i] - 128) * 0.01);
  terms /= static_cast<double>(m);
  ASSERT_GT(terms, 0.0);
  const double u = 5.9604644775390625e-08;
  auto off_by = [&](double relative, oracle::SumOrder order) {
    oracle::Buffer got = want.at(mean);
    static_cast<float*>(got.data())[0] += static_cast<float>(relative * terms);
    auto v = oracle::check_output(cg->lowered_graph(), *inputs, mean, got, want.at(mean), order);
    EXPECT_TRUE(v.ok());
    return v.ok() ? *v : oracle::OutputVerdict{};
  };
  // 10 sqrt(m) u: what oneDNN's running sum reaches on the lattice, past the
  // random-sign bound that blocked sums are held to.
  const double lattice = 10 * std::sqrt(static_cast<double>(m)) * u;
  const auto running = off_by(lattice, oracle::SumOrder::kRunning);
  EXPECT_TRUE(running.pass) << running.cond_error << " " << running.cond_limit;
  EXPECT_NEAR(running.cond_limit, (m - 1) * u, 1e-9);
  const auto blocked = off_by(lattice, oracle::SumOrder::kBlocked);
  EXPECT_FALSE(blocked.pass) << blocked.cond_error << " " << blocked.cond_limit;
  EXPECT_NEAR(blocked.cond_limit, 4 * std::sqrt(static_cast<double>(m)) * u, 1e-9);
  for (oracle::SumOrder order : {oracle::SumOrder::kRunning, oracle::SumOrder::kBlocked}) {
    const auto wrong = off_by(1e-2, order);
    EXPECT_FALSE(wrong.pass) << wrong.cond_error << " " << wrong.cond_limit;
  }
  // The order follows the kernel's name: oneDNN's reference kernels say "ref:".
  EXPECT_EQ(oracle::sum_order_of("ref:any"), oracle::SumOrder::kRunning);
  EXPECT_EQ(oracle::sum_order_of("bnorm_ref:any"), oracle::SumOrder::kRunning);
  EXPECT_EQ(oracle::sum_order_of("bnorm_jit:avx512_core"), oracle::SumOrder::kBlocked);
  EXPECT_EQ(oracle::sum_order_of("jit:avx2:f32:bwd:ncx"), oracle::SumOrder::kBlocked);
}

// A synchronized backward checked in one process (split into Reduce,
// AllReduce and Apply): its mean and variance are the batch's own, as for
// the plain op, and diff_gamma/diff_beta are held to the reduction limit,
// not the data limit.
TEST(CliCheck, ASynchronizedBackwardGetsTrueStatisticsAndTheReductionLimit) {
  auto g = load_graph(std::string(NORMGRAD_EXAMPLES) + "/sync/bn_sync_backward_f32_ncx.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(g->finalize().ok());
  auto cg = CompiledGraph::compile(*g, CompileOptions{"auto"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 3, &sources);
  ASSERT_TRUE(inputs.ok()) << inputs.status().to_string();
  int stats = 0;
  for (const auto& [id, source] : sources) stats += source == "batch-stats";
  EXPECT_EQ(stats, 2);
  int reductions = 0;
  for (const LogicalTensor& t : cg->outputs()) {
    if (t.rank() != 1) continue;
    EXPECT_GT(oracle::reduction_length(cg->lowered_graph(), t.id), 0) << t.id;
    ++reductions;
  }
  EXPECT_EQ(reductions, 2);  // diff_gamma and diff_beta
}

// The suite's limits for 16-bit data outputs reject what benchdnn's would let
// through: a bf16 diff_src scaled by 1.035 (rel L2 3.5e-2, under 3.9e-2), and
// one with its last 300 of 401,408 elements zeroed; the JIT's own result passes.
TEST(OracleLimits, SixteenBitDataLimitsRejectAWrongResult) {
  const Graph g = one_op(bn_bwd({8, 64, 28, 28}, "NCX", DataType::kBF16, DataType::kF32, true, 3));
  auto ref = CompiledGraph::compile(g, CompileOptions{"ref"});
  auto jit = CompiledGraph::compile(g, CompileOptions{"jit"});
  ASSERT_TRUE(ref.ok() && jit.ok());
  auto inputs = oracle::make_inputs(ref->graph(), ref->lowered_graph(), "", 9, nullptr);
  ASSERT_TRUE(inputs.ok());
  auto want = testing_util::run_outputs(*ref, *inputs);
  auto got = testing_util::run_outputs(*jit, *inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  const int64_t dx = 5;
  const oracle::Buffer& w = want->at(dx);
  auto ratio = [&](const oracle::Buffer& b) {
    return std::max(oracle::compare(b, w).rel_l2 / oracle::test_threshold_for(DataType::kBF16, 0),
                    oracle::element_bound_ratio(b, w));
  };
  EXPECT_LE(ratio(got->at(dx)), 1.0);
  const int64_t n = 8 * 64 * 28 * 28;
  oracle::Buffer scaled = w, zeroed = w;
  for (int64_t i = 0; i < n; ++i) {
    store_from_double(scaled.data(), i, DataType::kBF16,
                      1.035 * load_as_double(w.data(), i, DataType::kBF16));
    if (i >= n - 300) store_from_double(zeroed.data(), i, DataType::kBF16, 0.0);
  }
  EXPECT_LE(oracle::compare(scaled, w).rel_l2, oracle::threshold_for(DataType::kBF16, 0));
  EXPECT_GT(ratio(scaled), 1.0);
  EXPECT_GT(ratio(zeroed), 1.0);
  EXPECT_GT(oracle::element_bound_ratio(zeroed, w), 1.0);
}

// The mean and variance a backward reads are its inputs, not the data's:
// cases whose statistics differ from the batch's (frozen statistics, TF's V2,
// a mean from another step) catch a kernel that recomputes them. Every
// backend against ref on the same shifted statistics.
TEST(OracleLimits, StatisticsThatDifferFromTheDataAreUsedAsGiven) {
  int ran = 0;
  for (const char* backend : {"jit", "dnnl"}) {
    if (find_backend(backend) == nullptr) continue;
    for (const char* fmt : {"NCX", "NXC"}) {
      for (bool training : {true, false}) {
        const Dims shape = std::string(fmt) == "NCX" ? Dims{4, 16, 6, 7} : Dims{4, 6, 7, 16};
        Op op = bn_bwd(shape, fmt, DataType::kF32, DataType::kF32, true, 3);
        op.set_attr("is_training", training);
        const Graph g = one_op(op);
        auto cg = CompiledGraph::compile(g, CompileOptions{backend});
        auto ref = CompiledGraph::compile(g, CompileOptions{"ref"});
        ASSERT_TRUE(cg.ok() && ref.ok()) << backend << ": " << cg.status().to_string();
        auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 4, nullptr);
        ASSERT_TRUE(inputs.ok());
        // Statistics 0.3 standard deviations off and a variance 1.7 times the data's.
        oracle::Buffer& mean = inputs->at(2);
        oracle::Buffer& var = inputs->at(3);
        for (int64_t c = 0; c < 16; ++c) {
          const double v = load_as_double(var.data(), c, DataType::kF32);
          store_from_double(mean.data(), c, DataType::kF32,
                            load_as_double(mean.data(), c, DataType::kF32) + 0.3 * std::sqrt(v));
          store_from_double(var.data(), c, DataType::kF32, 1.7 * v);
        }
        auto got = testing_util::run_outputs(*cg, *inputs);
        auto want = testing_util::run_outputs(*ref, *inputs);
        ASSERT_TRUE(got.ok() && want.ok());
        for (const auto& [id, w] : *want) {
          auto v = oracle::check_output(cg->lowered_graph(), *inputs, id, got->at(id), w);
          ASSERT_TRUE(v.ok());
          EXPECT_TRUE(v->pass) << backend << " " << fmt << (training ? " training" : " frozen")
                               << " tensor " << id << " rel_l2 " << v->error.rel_l2;
        }
        // And they matter: the outputs differ from those of the data's own statistics.
        auto exact = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 4, nullptr);
        auto plain = testing_util::run_outputs(*ref, *exact);
        ASSERT_TRUE(plain.ok());
        EXPECT_GT(oracle::compare(plain->at(5), want->at(5)).rel_l2, 1e-2);
        ++ran;
      }
    }
  }
  EXPECT_GE(ran, 4);
}

}  // namespace
}  // namespace normgrad
