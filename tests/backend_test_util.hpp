// Running a graph on one backend and on ref with the same valid random inputs,
// and comparing every output under benchdnn's per-dtype thresholds.
#pragma once

#include <string>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>
#include <normgrad/testing/partition_check.hpp>
#include "tests/test_util.hpp"
#if NORMGRAD_TEST_WITH_DNNL
#include "tests/backends/onednn_probe.hpp"
#endif

namespace normgrad {
namespace testing_util {

struct Comparison {
  Status status;             // compile or execute failure of the backend under test
  std::string kernel;        // kernel names, "+"-joined
  double worst_ratio = 0.0;  // max over outputs of rel_l2 / threshold
  std::string report;
};

// A graph of one op, added and checked.
// Whether oneDNN itself builds training batch norm, ReLU backward and binary
// add on `dt` data on this CPU; false without the dnnl backend. Where it does not,
// normgrad's dnnl backend must refuse clearly (dnnl_refuses_clearly).
inline bool dnnl_runs(DataType dt) {
#if NORMGRAD_TEST_WITH_DNNL
  auto all = [](DataType d) {
    return onednn_probe::has_batch_norm(d, true) && onednn_probe::has_relu_backward(d) &&
           onednn_probe::has_binary_add(d);
  };
  static const bool bf16 = all(DataType::kBF16);
  static const bool f32 = all(DataType::kF32);
  return dt == DataType::kBF16 ? bf16 : dt == DataType::kF32 && f32;
#else
  (void)dt;
  return false;
#endif
}

// The refusal normgrad's dnnl backend gives where oneDNN has no kernel:
// "oneDNN 2.6 has no bf16 ... it needs AVX-512 [... (status 3)]".
inline bool dnnl_refuses_clearly(const Status& s) {
  return s.code() == StatusCode::kUnimplemented &&
         s.message().find("oneDNN 2.6 has no bf16") != std::string::npos &&
         s.message().find("it needs AVX-512") != std::string::npos &&
         s.message().find("status 3") != std::string::npos;
}

inline Graph one_op(const Op& op) {
  Graph g;
  Status s = g.add_op(op);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return g;
}

using oracle::run_outputs;

// `jit_variant`: CompileOptions::jit_variant for the backend under test.
inline Comparison compare_with_ref(const Graph& graph, const std::string& backend,
                                   uint64_t seed = 1, double data_offset = 0.0,
                                   const std::string& jit_variant = "") {
  Comparison c;
  CompileOptions options{backend};
  options.jit_variant = jit_variant;
  auto cg = CompiledGraph::compile(graph, options);
  if (!cg.ok()) {
    c.status = cg.status();
    return c;
  }
  for (const auto& p : cg->partitions())
    c.kernel += (c.kernel.empty() ? "" : "+") + p->kernel_name();
  auto inputs =
      oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", seed, nullptr, data_offset);
  EXPECT_TRUE(inputs.ok()) << inputs.status().to_string();
  if (!inputs.ok()) return c;
  auto got = run_outputs(*cg, *inputs);
  c.status = got.status();
  if (!c.status.ok()) return c;
  // Each partition judged on its own inputs (testing/partition_check.hpp),
  // and the graph's run the same bits as its partitions one by one.
  std::map<int64_t, oracle::Buffer> values;
  auto checks = oracle::check_partitions(*cg, *inputs, &values, true);
  c.status = checks.status();
  if (!c.status.ok()) return c;
  for (const auto& [id, buf] : *got) {
    auto each = values.find(id);
    if (each == values.end() || inputs->count(id)) continue;
    EXPECT_EQ(buf.bytes, each->second.bytes)
        << "tensor " << id << ": the graph's run differs from its partition's";
  }
  for (const oracle::PartitionOutputCheck& pc : *checks) {
    const oracle::OutputVerdict& v = pc.verdict;
    const oracle::ErrorStats& e = v.error;
    const int64_t id = pc.tensor.id;
    const oracle::Buffer& g = values.at(id);
    // <= 1 passes: the plain relative limit, or (sums) the condition-aware one.
    double ratio = e.nan_mismatch ? 1e9 : e.rel_l2 / v.limit;
    if (v.pass && ratio > 1.0) ratio = v.cond_error / v.cond_limit;
    // 16-bit data outputs: the suite's tighter L2 limit and the per-element bound.
    const DataType dt = pc.tensor.dtype;
    const int64_t m = oracle::reduction_length(cg->lowered_graph(), id);
    if (m == 0 && (dt == DataType::kBF16 || dt == DataType::kF16) && !e.nan_mismatch) {
      ratio = std::max({ratio, e.rel_l2 / oracle::test_threshold_for(dt, 0),
                        oracle::element_bound_ratio(g, *pc.want)});
    }
    c.worst_ratio = std::max(c.worst_ratio, ratio);
    c.report += oracle::describe(pc) + "; ";
  }
  return c;
}

}  // namespace testing_util
}  // namespace normgrad
