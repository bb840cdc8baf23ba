// The results of `normgrad bench` and their written forms: the JSON document
// (docs/cli.md gives its schema) and the SVG chart of GB/s per backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <normgrad/graph/logical_tensor.hpp>
#include "tools/bench_probe.hpp"

namespace normgrad {
namespace cli {

struct BenchResult {
  std::string backend, kernel, reason;
  std::vector<double> ms;
  double compile_ms = 0.0, cached_compile_ms = 0.0;
  double median = 0.0, min = 0.0, max = 0.0, gbps = 0.0, pct = 0.0, ratio = 0.0;
  // Its layout's traffic bound over its median, in % (0: the case has no bound).
  double bound_pct = 0.0;
};

struct BenchCase {
  std::string name, layout, dtype, fused;
  Dims shape;
  double bytes = 0.0;
  // The roofline probes just before and just after the case; its shares
  // divide by the higher.
  double probe_before = 0.0, probe_after = 0.0;
  // The least DRAM traffic of the case's plain layout and of nChw16c
  // (two_pass_traffic), and the time it takes at the higher probe; zero where
  // nothing bounds it (inputs that fit the L3, fused and user graphs).
  TwoPassTraffic plain_traffic, blocked_traffic;
  double plain_bound_ms = 0.0, blocked_bound_ms = 0.0;
  // A phase case (--phases): "reduce" is bounded at the read-only rate, "apply"
  // at the roofline; empty for whole cases.
  std::string phase;
  std::vector<BenchResult> results;
};

// The run-wide probes: the roofline at the start and end and the highest of
// the run, the read-only rate at the start and end (GB/s).
struct RunProbes {
  double roof_start = 0.0, roof_end = 0.0, read_start = 0.0, read_end = 0.0, roofline = 0.0;
  CoreRates core;  // one core alone, at the start
};

nlohmann::ordered_json bench_json(const std::vector<BenchCase>& cases, const HostInfo& host,
                                  const std::string& shapes, int64_t threads, const RunProbes& p);

// Bars of GB/s per backend per case, the run's highest roofline dashed.
std::string svg_chart(const std::vector<BenchCase>& cases, double roofline, int64_t threads);

}  // namespace cli
}  // namespace normgrad
