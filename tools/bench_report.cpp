// The bench's JSON document and SVG chart (tools/bench_report.hpp).
#include "tools/bench_report.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace normgrad {
namespace cli {

nlohmann::ordered_json bench_json(const std::vector<BenchCase>& cases, const HostInfo& host,
                                  const std::string& shapes, int64_t threads, const RunProbes& p) {
  nlohmann::ordered_json j;
  j["host"] = {{"cpu_model", host.cpu_model},
               {"logical_cpus", host.logical_cpus},
               {"l1d_bytes", host.l1d_bytes},
               {"l2_bytes", host.l2_bytes},
               {"l3_bytes", host.l3_bytes},
               {"model_l3_bytes", host.model_l3_bytes},
               {"isa", host.isa},
               {"roofline_start_gbps", p.roof_start},
               {"roofline_end_gbps", p.roof_end},
               {"read_only_start_gbps", p.read_start},
               {"read_only_end_gbps", p.read_end}};
  j["shapes"] = shapes;
  j["threads"] = threads;
  j["roofline_gbps"] = p.roofline;
  j["roofline_start_gbps"] = p.roof_start;
  j["roofline_end_gbps"] = p.roof_end;
  j["read_only_start_gbps"] = p.read_start;
  j["read_only_end_gbps"] = p.read_end;
  j["one_core_gbps"] = {
      {"reads", p.core.reads}, {"writes", p.core.writes}, {"mixed", p.core.mixed}};
  j["cases"] = nlohmann::ordered_json::array();
  for (const BenchCase& c : cases) {
    nlohmann::ordered_json cj;
    cj["name"] = c.name;
    cj["shape"] = c.shape;
    cj["layout"] = c.layout;
    cj["dtype"] = c.dtype;
    cj["fused"] = c.fused;
    if (!c.phase.empty()) cj["phase"] = c.phase;
    cj["bytes_min"] = c.bytes;
    cj["roofline_before_gbps"] = c.probe_before;
    cj["roofline_after_gbps"] = c.probe_after;
    if (c.plain_bound_ms > 0) {
      cj["bound_ms"] = {{c.layout, c.plain_bound_ms}, {"nChw16c", c.blocked_bound_ms}};
      cj["bound_passes"] = {{c.layout, c.plain_traffic.passes},
                            {"nChw16c", c.blocked_traffic.passes}};
    }
    cj["results"] = nlohmann::ordered_json::array();
    for (const BenchResult& r : c.results) {
      nlohmann::ordered_json rj;
      rj["backend"] = r.backend;
      rj["median_ms"] = r.median;
      rj["min_ms"] = r.min;
      rj["max_ms"] = r.max;
      rj["gbps"] = r.gbps;
      rj["roofline_pct"] = r.pct;
      rj["compile_ms"] = r.compile_ms;
      rj["cached_compile_ms"] = r.cached_compile_ms;
      if (r.ratio > 0) rj["ratio_vs_dnnl"] = r.ratio;  // none where oneDNN was not timed
      if (r.bound_pct > 0) rj["bound_pct"] = r.bound_pct;
      rj["kernel"] = r.kernel;
      if (!r.reason.empty()) rj["unsupported"] = r.reason;
      cj["results"].push_back(rj);
    }
    j["cases"].push_back(cj);
  }
  return j;
}

std::string svg_chart(const std::vector<BenchCase>& cases, double roofline, int64_t threads) {
  std::vector<std::string> backends;
  for (const auto& c : cases) {
    for (const auto& r : c.results) {
      if (std::find(backends.begin(), backends.end(), r.backend) == backends.end())
        backends.push_back(r.backend);
    }
  }
  const char* colors[] = {"#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"};
  double top = roofline * 1.15;
  for (const auto& c : cases) {
    for (const auto& r : c.results) top = std::max(top, r.gbps * 1.1);
  }
  if (top <= 0) top = 1;
  const double bar = 14, gap = 26, left = 60, plot_h = 320, top_pad = 50;
  const double group = bar * static_cast<double>(backends.size()) + gap;
  const double width = left + group * static_cast<double>(cases.size()) + 40;
  const double height = top_pad + plot_h + 150;
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  s << "<text x='" << left
    << "' y='20' font-size='14'>normgrad bench: batch-norm backward, GB/s of minimal traffic ("
    << threads << " threads)</text>\n";
  auto y_of = [&](double v) { return top_pad + plot_h - plot_h * v / top; };
  for (int t = 0; t <= 5; ++t) {
    const double v = top * t / 5.0;
    s << "<line x1='" << left << "' x2='" << width - 20 << "' y1='" << y_of(v) << "' y2='"
      << y_of(v) << "' stroke='#ddd'/>\n<text x='" << left - 6 << "' y='" << y_of(v) + 4
      << "' text-anchor='end'>" << v << "</text>\n";
  }
  s << "<text x='14' y='" << top_pad + plot_h / 2 << "' transform='rotate(-90 14 "
    << top_pad + plot_h / 2 << ")' text-anchor='middle'>GB/s</text>\n";
  if (roofline > 0) {
    s << "<line x1='" << left << "' x2='" << width - 20 << "' y1='" << y_of(roofline) << "' y2='"
      << y_of(roofline) << "' stroke='black' stroke-dasharray='6,3'/>\n<text x='" << width - 22
      << "' y='" << y_of(roofline) - 4 << "' text-anchor='end'>roofline " << roofline
      << " GB/s</text>\n";
  }
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const double x0 = left + gap / 2 + group * static_cast<double>(ci);
    for (const auto& r : cases[ci].results) {
      const size_t bi = static_cast<size_t>(std::find(backends.begin(), backends.end(), r.backend) -
                                            backends.begin());
      const double x = x0 + bar * static_cast<double>(bi);
      if (r.gbps > 0) {
        s << "<rect x='" << x << "' y='" << y_of(r.gbps) << "' width='" << bar - 2 << "' height='"
          << top_pad + plot_h - y_of(r.gbps) << "' fill='" << colors[bi % 6] << "'><title>"
          << r.backend << ": " << r.gbps << " GB/s, " << r.median << " ms</title></rect>\n";
      } else {
        s << "<text x='" << x + 5 << "' y='" << top_pad + plot_h - 4
          << "' font-size='9' fill='#999'>x</text>\n";
      }
    }
    const double lx = x0 + bar * static_cast<double>(backends.size()) / 2;
    s << "<text x='" << lx << "' y='" << top_pad + plot_h + 12 << "' transform='rotate(40 " << lx
      << " " << top_pad + plot_h + 12 << ")' font-size='10'>" << cases[ci].name << "</text>\n";
  }
  for (size_t bi = 0; bi < backends.size(); ++bi) {
    const double x = left + 120 * static_cast<double>(bi);
    s << "<rect x='" << x << "' y='32' width='10' height='10' fill='" << colors[bi % 6]
      << "'/><text x='" << x + 14 << "' y='41'>" << backends[bi] << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace cli
}  // namespace normgrad
