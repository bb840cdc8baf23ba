// The timing core of `normgrad bench` (internal): one case's columns
// compiled, given the same inputs, timed interleaved and summarised.
//
// A case is one graph (a preset layer or a user's file) and its columns: the
// backends asked for, the JIT's named variants, the unfused sequence of a
// fused case, the backward from dst, and oneDNN's pre-blocked kernel. The
// command (cli_bench.cpp) plans the cases, probes the memory around each and
// reports; this file runs one.
#pragma once

#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>
#include "tools/bench_report.hpp"

namespace normgrad {
namespace cli {

struct BenchOptions {
  std::string graph_path;
  std::string shapes = "small";
  bool shard_batch = false;
  std::vector<std::string> backends = {"jit", "dnnl"};
  std::vector<std::string> dts = {"f32"};
  std::vector<std::string> layouts = {"NCX", "NXC"};
  std::vector<std::string> fused = {"none"};
  std::string dir = "bwd";  // bwd: BatchNormTrainingBackward; fwd: BatchNormForwardTraining
  bool phases = false;      // also time the backward's reduce and apply apart
  std::vector<std::string> jit_variants;  // extra JIT columns, one per named variant
  // The backward from dst (InPlace-ABN, leaky_relu 0.01) on the JIT as column jit-from-dst.
  bool from_dst = false;
  int64_t threads = 0, iters = 10, warmup = 2;
  bool cold = false;
  std::string json_out, svg_out;
};

// Compiles and times every column of `cr` on `graph` (interleaved, medians
// over opt.iters runs), filling cr.results; a column that cannot run keeps
// its reason. An error is what stops the whole case (allocation, inputs).
Status run_bench_case(const BenchOptions& opt, BenchCase& cr, const Graph& graph);

}  // namespace cli
}  // namespace normgrad
