// `normgrad bench`: backends side by side on batch-norm backward, interleaved in
// one process, next to an in-run bandwidth roofline; table, JSON and SVG.
#include <algorithm>
#include <chrono>
#include <cmath>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tools/bench_graphs.hpp"
#include "tools/bench_probe.hpp"
#include "tools/bench_report.hpp"
#include "tools/cli.hpp"
#include "tools/cli_args.hpp"
#include "tools/cli_knobs.hpp"
#include "tools/cli_shard.hpp"

namespace normgrad {
namespace cli {

// The test oracle's pieces, used unqualified below.
using oracle::allocate;
using oracle::Buffer;
using oracle::compare;
using oracle::ErrorStats;
using oracle::make_inputs;
namespace {

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

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) v.push_back(item);
  }
  return v;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A timed unit: one backend's compiled graph, or a blocked column. Each has
// its own copy of the inputs (the same values), as the blocked columns have
// their own tensors: on shared inputs, a backend would find them in the L3
// whenever the backend before it had just read them, and on layers that fit
// the L3 that favours whichever backend follows another on the same buffers.
struct Runner {
  BenchResult result;
  std::unique_ptr<CompiledGraph> graph;
  std::unique_ptr<BlockedRunner> blocked;
  std::map<int64_t, Buffer> inputs;
  std::map<int64_t, const void*> in_ptrs;
  std::map<int64_t, Buffer> outputs;
  std::map<int64_t, void*> out_ptrs;
};

double run_once(Runner& r) {
  if (r.blocked) return r.blocked->run_once();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = r.graph->execute(r.in_ptrs, r.out_ptrs);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) r.result.reason = s.to_string();
  return ms;
}

// --cold: the runner's own tensors out of every cache level.
void evict(const Runner& r) {
  if (r.blocked) {
    r.blocked->evict();
    return;
  }
  for (const auto& [id, b] : r.inputs) evict_lines(b.data(), b.bytes.size());
  for (const auto& [id, b] : r.outputs) evict_lines(b.data(), b.bytes.size());
}

Status run_case(const BenchOptions& opt, BenchCase& cr, const Graph& graph) {
  std::vector<Runner> runners;
  const Graph* lowered = nullptr;
  // Fused cases also time the unfused sequence (passes off, each op on the
  // fastest backend that takes it), to show what fusion saves.
  std::vector<std::string> columns = opt.backends;
  if (cr.fused != "none") columns.push_back("unfused");
  // --jit-variant: the JIT again under each named variant, "jit[NAME]".
  for (const std::string& v : opt.jit_variants) columns.push_back("jit[" + v + "]");
  // --from-dst: BatchNormTrainingBackwardFromDst of the same shape, its own graph and inputs.
  const bool from_dst = opt.from_dst && opt.dir == "bwd" && cr.fused == "none" && cr.phase.empty();
  std::optional<Graph> from_dst_graph;
  if (from_dst) {
    const Dims& s = cr.shape;
    const Dims nchw = cr.layout == "NCX" ? s : Dims{s[0], s[3], s[1], s[2]};
    from_dst_graph = make_from_dst_graph(nchw, cr.layout, *parse_dtype(cr.dtype), 0.01f);
    columns.push_back("jit-from-dst");
  }
  for (const std::string& b : columns) {
    Runner r;
    r.result.backend = b;
    const bool variant = b.rfind("jit[", 0) == 0;
    const bool own_graph = b == "jit-from-dst";
    CompileOptions options{b == "unfused" ? "auto" : variant || own_graph ? "jit" : b};
    options.optimize = b != "unfused";
    if (variant) options.jit_variant = b.substr(4, b.size() - 5);
    const auto t0 = std::chrono::steady_clock::now();
    auto cg = CompiledGraph::compile(own_graph ? *from_dst_graph : graph, options);
    r.result.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!cg.ok()) {
      r.result.reason = cg.status().message();
      runners.push_back(std::move(r));
      continue;
    }
    const auto t1 = std::chrono::steady_clock::now();
    auto again = CompiledGraph::compile(own_graph ? *from_dst_graph : graph, options);
    r.result.cached_compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    if (!again.ok()) {  // the first compile went through: a second one must too
      r.result.reason = "the cached compile failed: " + again.status().message();
      runners.push_back(std::move(r));
      continue;
    }
    r.graph = std::make_unique<CompiledGraph>(std::move(cg).value());
    for (const auto& p : r.graph->partitions())
      r.result.kernel += (r.result.kernel.empty() ? "" : "+") + p->kernel_name();
    for (const LogicalTensor& lt : r.graph->outputs()) {
      NG_ASSIGN_OR_RETURN(Buffer buf, allocate(lt));
      r.out_ptrs[lt.id] = r.outputs.emplace(lt.id, std::move(buf)).first->second.data();
    }
    if (own_graph) {
      NG_ASSIGN_OR_RETURN(r.inputs,
                          make_inputs(r.graph->graph(), r.graph->lowered_graph(), "", 1, nullptr));
    } else if (!lowered) {
      lowered = &r.graph->lowered_graph();
    }
    runners.push_back(std::move(r));
  }
  const bool want_blocked = std::any_of(opt.backends.begin(), opt.backends.end(),
                                        [](const std::string& b) {
                                          const BackendEntry* e = find_backend_entry(b);
                                          return e != nullptr && e->baseline;
                                        }) &&
                            opt.dir == "bwd" && cr.fused == "none" && cr.shape.size() == 4 &&
                            cr.dtype != "f16";
  // dnnl-blocked: the kernel alone on pre-blocked tensors; dnnl-reorder: the
  // same with the reorders from and to the case's plain layout timed.
  for (const bool reorders : want_blocked ? std::vector<bool>{false, true} : std::vector<bool>{}) {
    Runner r;
    r.result.backend = reorders ? "dnnl-reorder" : "dnnl-blocked";
    const Dims& s = cr.shape;
    const Dims nchw = cr.layout == "NCX" ? s : Dims{s[0], s[3], s[1], s[2]};
    auto blocked = BlockedRunner::make(nchw[0], nchw[1], nchw[2], nchw[3], *parse_dtype(cr.dtype),
                                       reorders ? cr.layout : "");
    if (blocked.ok()) {
      r.blocked = std::move(blocked).value();
      r.result.kernel =
          r.blocked->impl() + (reorders ? " (" + cr.layout + " -> nChw16c -> " + cr.layout + ")"
                                        : std::string(" (nChw16c)"));
    } else {
      r.result.reason = blocked.status().message();
    }
    runners.push_back(std::move(r));
  }
  if (!lowered) {
    for (Runner& r : runners) cr.results.push_back(r.result);
    return ok_status();
  }
  const CompiledGraph* any = nullptr;
  auto shares_inputs = [](const Runner& r) {
    return r.graph && r.result.backend != "jit-from-dst";
  };
  for (Runner& r : runners) {
    if (shares_inputs(r) && !any) any = r.graph.get();
  }
  NG_ASSIGN_OR_RETURN(auto inputs, make_inputs(any->graph(), any->lowered_graph(), "", 1, nullptr));
  // A copy per backend (see Runner); the last one takes the originals.
  Runner* last = nullptr;
  for (Runner& r : runners) {
    if (!shares_inputs(r)) continue;
    if (last) last->inputs = inputs;
    last = &r;
  }
  last->inputs = std::move(inputs);
  for (Runner& r : runners) {
    for (auto& [id, b] : r.inputs) r.in_ptrs[id] = b.data();
  }
  auto active = [](const Runner& r) { return (r.graph || r.blocked) && r.result.reason.empty(); };
  for (int64_t w = 0; w < opt.warmup; ++w) {
    for (Runner& r : runners) {
      if (active(r)) run_once(r);
    }
  }
  // Interleaved, so drift hits every backend alike, and in a balanced order
  // (williams_order), so each runs right after every other equally often:
  // oneDNN's OpenMP threads spin after a call (libgomp's default wait
  // policy) and on a 2-core host take a core from whatever runs next; in a
  // fixed order the column after a oneDNN one measured 5-20% slower than the
  // same kernel elsewhere in the row, and 2.5x on a 0.04 ms case under a
  // plain rotation, which keeps each column after the same one.
  std::vector<size_t> live;
  for (size_t i = 0; i < runners.size(); ++i) {
    if (active(runners[i])) live.push_back(i);
  }
  const auto nr = static_cast<int64_t>(live.size());
  for (int64_t it = 0; it < opt.iters; ++it) {
    for (int64_t k : williams_order(nr, it)) {
      Runner& r = runners[live[static_cast<size_t>(k)]];
      if (!active(r)) continue;  // its run failed: the reason stands, no more timings
      if (opt.cold) {
        flush_caches();
        evict(r);
      }
      r.result.ms.push_back(run_once(r));
    }
  }
  double dnnl_median = 0.0;
  for (Runner& r : runners) {
    BenchResult& b = r.result;
    if (!b.ms.empty() && b.reason.empty()) {
      b.median = median_of(b.ms);
      b.min = *std::min_element(b.ms.begin(), b.ms.end());
      b.max = *std::max_element(b.ms.begin(), b.ms.end());
      b.gbps = cr.bytes / (b.median * 1e-3) / 1e9;
      const BackendEntry* e = find_backend_entry(b.backend);
      if (e != nullptr && e->baseline) dnnl_median = b.median;
    }
  }
  for (Runner& r : runners) {
    if (dnnl_median > 0 && r.result.median > 0) r.result.ratio = dnnl_median / r.result.median;
    cr.results.push_back(r.result);
  }
  return ok_status();
}

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  BenchOptions opt;
  CLI::App app(
      "Backends side by side on batch-norm backward layers, interleaved, next to an in-run "
      "bandwidth roofline (docs/performance.md).",
      "normgrad bench");
  std::string backends = "jit,dnnl", dts = "f32", layouts = "NCX,NXC", fused = "none";
  app.add_option("graph", opt.graph_path, "a graph to time instead of the built-in shapes");
  app.add_option("--shapes", opt.shapes, "resnet50, small or cached")
      ->check(CLI::IsMember({"resnet50", "small", "cached"}));
  app.add_option("--backends", backends, "comma-separated: " + joined(known_backend_names()))
      ->check(list_of(known_backend_names()));
  app.add_option("--dt", dts, "comma-separated: f32, bf16, f16")
      ->check(list_of({"f32", "bf16", "f16"}));
  app.add_option("--layouts", layouts, "comma-separated: NCX, NXC")->check(list_of({"NCX", "NXC"}));
  app.add_option("--fused", fused, "comma-separated: none, relu, add")
      ->check(list_of({"none", "relu", "add"}));
  app.add_option("--dir", opt.dir,
                 "bwd (BatchNormTrainingBackward) or fwd (BatchNormForwardTraining; relu and add "
                 "fuse ReLU and Add+ReLU after it)")
      ->check(CLI::IsMember({"bwd", "fwd"}));
  std::string variants;
  app.add_option("--jit-variant", variants,
                 "comma-separated JIT variants timed as extra columns jit[NAME], interleaved with "
                 "the rest: default (the JIT's own choice, a control) or a named variant, A+B "
                 "for both (docs/cli.md lists them; an unknown name prints the list)");
  app.add_flag("--from-dst", opt.from_dst,
               "also time BatchNormTrainingBackwardFromDst (leaky_relu 0.01) on the JIT, column "
               "jit-from-dst, interleaved with the backward it replaces");
  app.add_flag("--phases", opt.phases,
               "also time the backward's two phases apart on the JIT (BatchNormBackwardReduce, "
               "BatchNormBackwardApply), each against its own bound");
  app.add_option("--threads", opt.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--iters", opt.iters, "timed runs per case (median)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", opt.warmup, "untimed runs first")->check(CLI::Range(0, 1000000));
  app.add_flag("--cold", opt.cold, "flush the caches before every run");
  app.add_flag("--shard-batch", opt.shard_batch,
               "under mpirun: each layer synchronized over the processes (docs/scale-out.md)");
  app.add_option("--json", opt.json_out, "write the results as JSON");
  app.add_option("--svg", opt.svg_out, "write a chart");
  bool compile_time = false;
  std::string compile_ops = "1000,10000,100000",
              compile_shapes = "chain,ladder,fan-out,folds,resnet";
  app.add_flag("--compile", compile_time,
               "time the compiler instead (load, passes, partitioning, compile; us per op) on "
               "generated graphs");
  app.add_option("--compile-ops", compile_ops,
                 "with --compile: comma-separated graph sizes in ops (default 1000,10000,100000)");
  app.add_option("--compile-shapes", compile_shapes,
                 "with --compile: comma-separated: chain, ladder, fan-out, folds, resnet")
      ->check(list_of({"chain", "ladder", "fan-out", "folds", "resnet"}));
  if (int rc = parse_args(app, argv); rc >= 0) return rc;
  if (compile_time) {
    std::vector<int64_t> sizes;
    for (const std::string& n : split_list(compile_ops)) {
      char* end = nullptr;
      const long long v = std::strtoll(n.c_str(), &end, 10);
      if (end == n.c_str() || *end != '\0' || v < 2 || v > 10000000) {
        std::cerr << "normgrad bench: --compile-ops takes sizes from 2 to 10000000, got '" << n
                  << "'\n";
        return 2;
      }
      sizes.push_back(v);
    }
    return bench_compile(sizes, split_list(compile_shapes), opt.graph_path, opt.json_out);
  }
  if (opt.shard_batch) {
    // What the sharded run does not do is refused, not ignored.
    for (const char* o : {"graph", "--fused", "--cold", "--json", "--svg", "--warmup"}) {
      if (app.count(o) > 0) {
        std::cerr << "normgrad bench: " << o << " is not used with --shard-batch\n";
        return 2;
      }
    }
    if (app.count("--backends") > 0 && split_list(backends).size() != 1) {
      std::cerr << "normgrad bench: --shard-batch takes one backend in --backends\n";
      return 2;
    }
    if (app.count("--backends") == 0) backends = "auto";
  }
  opt.backends = split_list(backends);
  opt.dts = split_list(dts);
  opt.layouts = split_list(layouts);
  opt.fused = split_list(fused);
  opt.jit_variants = split_list(variants);
  std::vector<std::pair<std::string, Dims>> shapes;
  if (opt.shapes == "cached") {
    // Cache-resident problems (1.6 and 1.6 MB of src + diff_dst in f32): the
    // limit is instructions, not DRAM, so a slow-memory host cannot hide an
    // inefficient kernel. GB/s here is on cached data, not a DRAM roofline share.
    shapes = {{"1x256x28x28", {1, 256, 28, 28}}, {"4x512x14x14", {4, 512, 14, 14}}};
  } else if (opt.shapes == "resnet50" || opt.shapes == "small") {
    if (opt.shapes == "resnet50") {
      shapes = {{"32x64x112x112", {32, 64, 112, 112}},
                {"32x256x56x56", {32, 256, 56, 56}},
                {"32x512x28x28", {32, 512, 28, 28}},
                {"32x1024x14x14", {32, 1024, 14, 14}},
                {"32x2048x7x7", {32, 2048, 7, 7}}};
    }
    shapes.push_back({"1x32x28x28", {1, 32, 28, 28}});
    shapes.push_back({"2x192x71x71", {2, 192, 71, 71}});
  }
  for (const std::string& l : opt.layouts) {
    if (l != "NCX" && l != "NXC")
      return std::cerr << "normgrad bench: layouts are NCX and NXC\n", 2;
  }
  for (const std::string& f : opt.fused) {
    if (f != "none" && f != "relu" && f != "add")
      return std::cerr << "normgrad bench: --fused takes none, relu, add\n", 2;
  }
  std::unique_ptr<tbb::global_control> limit;
  const int64_t threads =
      opt.threads > 0 ? opt.threads : static_cast<int64_t>(tbb::this_task_arena::max_concurrency());
  limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                static_cast<size_t>(threads));
  set_backend_threads(static_cast<int>(threads));

  if (opt.shard_batch)
    return bench_sharded(shapes, opt.dts, opt.layouts, opt.backends[0], opt.iters, threads);

  constexpr int64_t kProbeFloats = int64_t{64} << 20;  // 256 MiB per array, far beyond the L3
  StreamProbe probe(kProbeFloats);
  const double roof_start = probe.measure(4);
  const double read_start = probe.measure_read_only(4);
  double last_probe = roof_start;
  const HostInfo host = host_info();
  {
    std::cout << "host: " << host.cpu_model << ", " << host.logical_cpus << " logical CPUs, L1d "
              << host.l1d_bytes / 1024 << " KiB, L2 " << host.l2_bytes / 1024 << " KiB, L3 "
              << host.l3_bytes / 1024 << " KiB (cache model " << host.model_l3_bytes / 1024
              << " KiB), " << host.isa << "\n";
  }
  std::cout << std::fixed << std::setprecision(2) << "roofline (2 reads + 1 streaming write, "
            << threads << " threads): " << roof_start << " GB/s at start; 2 reads alone "
            << read_start << " GB/s (a reduction pass's pattern)\n";
  std::vector<BenchCase> cases;
  // No ratio where oneDNN was not timed or declined (it would read x0.00).
  auto format_ratio = [](double ratio) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << ratio;
    return os.str();
  };
  auto report = [&](const BenchCase& cr) {
    std::cout << "\n"
              << cr.name << "  (" << cr.bytes / 1e6 << " MB minimal traffic; roofline "
              << cr.probe_before << " GB/s before, " << cr.probe_after << " after)\n";
    if (cr.plain_bound_ms > 0) {
      std::cout << "  bound at the probe's rate: " << cr.layout << " " << cr.plain_bound_ms
                << " ms (" << cr.plain_traffic.passes << " tensor passes), nChw16c "
                << cr.blocked_bound_ms << " ms (" << cr.blocked_traffic.passes << ")\n";
    }
    for (const BenchResult& r : cr.results) {
      if (r.median <= 0) {
        std::cout << "  " << std::left << std::setw(13) << r.backend << "  declined: " << r.reason
                  << "\n";
        continue;
      }
      std::cout << "  " << std::left << std::setw(13) << r.backend << std::right << std::setw(9)
                << r.median << " ms  [" << r.min << ", " << r.max << "]  " << std::setw(7) << r.gbps
                << " GB/s  " << std::setw(5) << r.pct << (r.pct > 100 ? "%*" : "% ")
                << "of roofline  "
                << (r.ratio > 0 ? "x" + format_ratio(r.ratio) + " vs dnnl  " : std::string())
                << (r.bound_pct > 0
                        ? std::to_string(static_cast<int>(r.bound_pct + 0.5)) + "% of its bound  "
                        : std::string())
                << "compile " << r.compile_ms << "/" << r.cached_compile_ms << " ms  " << r.kernel
                << "\n";
    }
    // A share of the DRAM roofline above 100% is not an error; say why where it shows.
    const bool above = std::any_of(cr.results.begin(), cr.results.end(),
                                   [](const BenchResult& r) { return r.pct > 100; });
    if (above && cr.bytes <= 2.0 * static_cast<double>(host.l3_bytes)) {
      std::cout << "  * above 100%: this case's " << cr.bytes / 1e6 << " MB largely stay in the "
                << "caches (L3 " << host.l3_bytes / 1e6 << " MB), which the DRAM probe does not "
                << "bound; \"% of its bound\" is the DRAM-sized cases' figure\n";
    } else if (above) {
      std::cout << "  * above 100%: the host gave this case more bandwidth than the probe "
                << "measured before and after it (shared memory bandwidth varies)\n";
    }
  };
  // Probes on both sides of every case: its shares divide by the higher of
  // the two, the bandwidth the host gave while the case ran.
  auto run_and_report = [&](BenchCase& cr, const Graph& g, const BenchOptions& o) -> Status {
    cr.probe_before = last_probe;
    NG_RETURN_IF_ERROR(run_case(o, cr, g));
    cr.probe_after = last_probe = probe.measure(2);
    const double roof = std::max(cr.probe_before, cr.probe_after);
    for (BenchResult& r : cr.results) r.pct = roof > 0 && r.gbps > 0 ? 100.0 * r.gbps / roof : 0.0;
    if (roof > 0) {
      // A reduce phase only reads: its bound is at the read-only rate.
      const double rate = cr.phase == "reduce" ? read_start : roof;
      cr.plain_bound_ms = cr.plain_traffic.bytes / rate / 1e6;
      cr.blocked_bound_ms = cr.blocked_traffic.bytes / roof / 1e6;
    }
    for (BenchResult& r : cr.results) {
      const bool blocked = r.backend == "dnnl-blocked";
      const double bound = blocked ? cr.blocked_bound_ms : cr.plain_bound_ms;
      if (bound > 0 && r.median > 0 && r.backend != "dnnl-reorder")
        r.bound_pct = 100.0 * bound / r.median;
    }
    report(cr);
    return ok_status();
  };
  if (!opt.graph_path.empty()) {
    // A user's graph: minimal traffic is every graph input and output read or written once.
    auto loaded = load_graph(opt.graph_path);
    if (!loaded.ok())
      return std::cerr << "normgrad bench: " << loaded.status().to_string() << "\n", 2;
    Graph g = std::move(loaded).value();
    if (Status s = g.finalize(); !s.ok())
      return std::cerr << "normgrad bench: " << s.to_string() << "\n", 2;
    BenchCase cr;
    cr.name = opt.graph_path;
    // A multi-op graph is not one of the presets' fusions: "graph" (and no blocked column).
    cr.fused = g.ops().size() == 1 ? "none" : "graph";
    for (const Op& op : g.ops()) {
      if (op.kind() == OpKind::kBatchNormTrainingBackward && cr.shape.empty()) {
        const LogicalTensor& src = BatchNormTrainingBackwardPorts(op).src();
        cr.shape = src.dims;
        cr.dtype = dtype_name(src.dtype);
        auto fmt = op.attr_string("data_format");
        cr.layout = fmt.ok() ? *fmt : "NXC";
      }
    }
    for (const LogicalTensor& lt : g.graph_inputs())
      cr.bytes += static_cast<double>(*lt.buffer_bytes());
    for (const LogicalTensor& lt : g.graph_outputs())
      cr.bytes += static_cast<double>(*lt.buffer_bytes());
    if (Status s = run_and_report(cr, g, opt); !s.ok()) {
      std::cerr << "normgrad bench: " << cr.name << ": " << s.to_string() << "\n";
      return 2;
    }
    cases.push_back(std::move(cr));
    shapes.clear();
  }
  for (const auto& [name, nchw] : shapes) {
    for (const std::string& dts : opt.dts) {
      auto dt = parse_dtype(dts);
      if (!dt.ok()) return std::cerr << "normgrad bench: " << dt.status().message() << "\n", 2;
      for (const std::string& layout : opt.layouts) {
        for (const std::string& fused : opt.fused) {
          BenchCase cr;
          cr.layout = layout;
          cr.dtype = dts;
          cr.fused = fused;
          cr.shape = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
          const bool fwd = opt.dir == "fwd";
          cr.name = name + " " + layout + " " + dts + (fwd ? " fwd" : "") +
                    (fused == "none" ? "" : " +" + fused);
          const double elems = static_cast<double>(nchw[0] * nchw[1] * nchw[2] * nchw[3]);
          // Minimal traffic: bwd reads src and diff_dst and writes diff_src (and
          // a fused producer's second input); fwd reads src and writes dst (and
          // reads the residual).
          const double passes = fwd ? (fused == "add" ? 3.0 : 2.0) : (fused == "none" ? 3.0 : 4.0);
          cr.bytes = elems * static_cast<double>(dtype_size(*dt)) * passes;
          if (fused == "none" && !fwd) {
            const int64_t esize = static_cast<int64_t>(dtype_size(*dt));
            const int64_t spatial = nchw[2] * nchw[3];
            cr.plain_traffic =
                two_pass_traffic(layout, nchw[0], nchw[1], spatial, esize, host.model_l3_bytes);
            cr.blocked_traffic =
                two_pass_traffic("nChw16c", nchw[0], nchw[1], spatial, esize, host.model_l3_bytes);
          }
          Graph g = fwd ? make_forward_graph(nchw, layout, *dt, fused)
                        : make_graph(nchw, layout, *dt, fused);
          if (Status s = run_and_report(cr, g, opt); !s.ok()) {
            std::cerr << "normgrad bench: " << cr.name << ": " << s.to_string() << "\n";
            return 2;
          }
          const BenchCase whole = cr;
          cases.push_back(std::move(cr));
          if (!opt.phases || fwd || fused != "none") continue;
          // The two phases apart, on the JIT: reduce 2 tensor passes, apply 3,
          // where the data exceeds the cache model's L3 (else no bound).
          for (const bool reduce : {true, false}) {
            BenchCase pc;
            pc.layout = layout;
            pc.dtype = dts;
            pc.fused = "none";
            pc.shape = whole.shape;
            pc.phase = reduce ? "reduce" : "apply";
            pc.name = whole.name + " " + pc.phase;
            const double tensor = elems * static_cast<double>(dtype_size(*dt));
            pc.bytes = tensor * (reduce ? 2.0 : 3.0);
            if (2.0 * tensor > static_cast<double>(host.model_l3_bytes))
              pc.plain_traffic = {pc.bytes, reduce ? 2.0 : 3.0};
            BenchOptions jit_only = opt;
            jit_only.backends = {"jit"};
            Status s = run_and_report(pc, make_phase_graph(nchw, layout, *dt, reduce), jit_only);
            if (!s.ok()) {
              std::cerr << "normgrad bench: " << pc.name << ": " << s.to_string() << "\n";
              return 2;
            }
            cases.push_back(std::move(pc));
          }
        }
      }
    }
  }
  const double roof_end = probe.measure(4);
  const double read_end = probe.measure_read_only(4);
  // The chart's line: the most the machine gave during this run. Each case's
  // share was taken against its own probes (run_and_report).
  double roofline = std::max(roof_start, roof_end);
  for (const BenchCase& c : cases) roofline = std::max({roofline, c.probe_before, c.probe_after});
  std::cout << "\nroofline at end: " << roof_end << " GB/s (start " << roof_start << ", highest "
            << roofline
            << "); each case's share divides by the higher of its two probes; 2 reads alone "
            << read_end << " GB/s at end\n";
  if (!opt.json_out.empty()) {
    const RunProbes probes{roof_start, roof_end, read_start, read_end, roofline};
    std::ofstream(opt.json_out) << bench_json(cases, host, opt.shapes, threads, probes).dump(2)
                                << "\n";
    std::cout << "wrote " << opt.json_out << "\n";
  }
  if (!opt.svg_out.empty()) {
    std::ofstream(opt.svg_out) << svg_chart(cases, roofline, threads);
    std::cout << "wrote " << opt.svg_out << "\n";
  }
  return 0;
}

}  // namespace cli
}  // namespace normgrad
