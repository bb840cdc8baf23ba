// `normgrad bench`: backends side by side on batch-norm backward, interleaved in
// one process, next to an in-run bandwidth roofline; table, JSON and SVG.
//
// The command in its steps: parse_bench_args reads the options, bench_shape_set
// and BenchCommand plan the cases (a preset layer in each dtype, layout and
// fusion, its two phases apart, or a user's graph), run_bench_case
// (bench_run.cpp) times each between two bandwidth probes, and the command
// reports each case against its probes and writes the JSON and the chart.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/ops/op_ports.hpp>
#include "tools/bench_graphs.hpp"
#include "tools/bench_probe.hpp"
#include "tools/bench_report.hpp"
#include "tools/bench_run.hpp"
#include "tools/cli.hpp"
#include "tools/cli_args.hpp"
#include "tools/cli_driver.hpp"
#include "tools/cli_shard.hpp"

namespace normgrad {
namespace cli {
namespace {

// What the command line asks beyond BenchOptions: the compiler's timing.
struct BenchArgs {
  bool compile_time = false;
  std::vector<int64_t> compile_sizes;
  std::vector<std::string> compile_shapes;
};

// Reads the options; returns an exit code when the command is done (help,
// a usage error), -1 to go on.
int parse_bench_args(const std::vector<std::string>& argv, BenchOptions& opt, BenchArgs& more) {
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
  app.add_option("--fused", fused,
                 "comma-separated: none, relu, add, relu-side (the ReLUBackward's output a graph "
                 "output too: the JIT writes it as a side output), add-relu-side (the same "
                 "behind a gradient Add, as at a residual block's end), relu-siblings and "
                 "add-relu-siblings (a second batch norm reads the ReLUBackward's output, as a "
                 "downsampling shortcut's: one partition for both); with --dir fwd, add-siblings "
                 "(the residual a second batch norm's dst), and relu-side and add-relu-side "
                 "(the ReLU's input a graph output too: the JIT writes it as a side output)")
      ->check(list_of({"none", "relu", "add", "relu-side", "add-relu-side", "relu-siblings",
                       "add-relu-siblings", "add-siblings"}));
  app.add_option("--dir", opt.dir,
                 "bwd (BatchNormTrainingBackward) or fwd (BatchNormForwardTraining; relu and add "
                 "fuse ReLU and Add+ReLU after it)")
      ->check(CLI::IsMember({"bwd", "fwd"}));
  std::string variants;
  app.add_option("--jit-variant", variants,
                 "comma-separated JIT variants timed as extra columns jit[NAME] (auto[NAME], every "
                 "backend with the JIT under the variant, with --backends=auto), interleaved with "
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
  std::string compile_ops = "1000,10000,100000",
              compile_shapes = "chain,ladder,fan-out,folds,resnet";
  app.add_flag("--compile", more.compile_time,
               "time the compiler instead (load, passes, partitioning, compile; us per op) on "
               "generated graphs");
  app.add_option("--compile-ops", compile_ops,
                 "with --compile: comma-separated graph sizes in ops (default 1000,10000,100000)");
  app.add_option("--compile-shapes", compile_shapes,
                 "with --compile: comma-separated: chain, ladder, fan-out, folds, resnet")
      ->check(list_of({"chain", "ladder", "fan-out", "folds", "resnet"}));
  if (int rc = parse_args(app, argv); rc >= 0) return rc;
  if (more.compile_time) {
    for (const std::string& n : split_list(compile_ops)) {
      char* end = nullptr;
      const long long v = std::strtoll(n.c_str(), &end, 10);
      if (end == n.c_str() || *end != '\0' || v < 2 || v > 10000000) {
        std::cerr << "normgrad bench: --compile-ops takes sizes from 2 to 10000000, got '" << n
                  << "'\n";
        return 2;
      }
      more.compile_sizes.push_back(v);
    }
    more.compile_shapes = split_list(compile_shapes);
    return -1;
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
  for (const std::string& f : opt.fused) {
    const bool fwd_fusion = f == "none" || f == "relu" || f == "add" || f == "add-siblings" ||
                            f == "relu-side" || f == "add-relu-side";
    const bool bwd_fusion = f != "add-siblings";
    if (opt.dir == "fwd" ? !fwd_fusion : !bwd_fusion) {
      std::cerr << "normgrad bench: --fused=" << f << " is not a fusion of --dir " << opt.dir
                << " (fwd takes none, relu, add, add-siblings, relu-side and add-relu-side)\n";
      return 2;
    }
  }
  opt.jit_variants = split_list(variants);
  // An unknown variant is a usage error here, not a declined column in every case.
  const Backend* jit = find_backend("jit");
  for (const std::string& v : opt.jit_variants) {
    const Status s = jit ? jit->check_variant(v) : unimplemented("this build has no JIT backend");
    if (!s.ok()) {
      std::cerr << "normgrad bench: --jit-variant: " << s.message() << "\n";
      return 2;
    }
  }
  return -1;
}

// One run of the command: the probe, the host, and the cases so far.
class BenchCommand {
 public:
  BenchCommand(const BenchOptions& opt, int64_t threads)
      : opt_(opt), threads_(threads), probe_(kProbeFloats), host_(host_info()) {
    roof_start_ = last_probe_ = probe_.measure(4);
    read_start_ = probe_.measure_read_only(4);
    core_ = probe_.measure_one_core(2);
    std::cout << "host: " << host_.cpu_model << ", " << host_.logical_cpus << " logical CPUs, L1d "
              << host_.l1d_bytes / 1024 << " KiB, L2 " << host_.l2_bytes / 1024 << " KiB, L3 "
              << host_.l3_bytes / 1024 << " KiB (cache model " << host_.model_l3_bytes / 1024
              << " KiB), " << host_.isa << "\n";
    std::cout << std::fixed << std::setprecision(2) << "roofline (2 reads + 1 streaming write, "
              << threads_ << " threads): " << roof_start_ << " GB/s at start; 2 reads alone "
              << read_start_ << " GB/s (a reduction pass's pattern)\n"
              << "one core alone: 2 reads " << core_.reads << " GB/s, streaming writes "
              << core_.writes << ", both in one loop " << core_.mixed << "\n";
  }

  Status graph_case(const std::string& path);
  Status layer_cases(const std::string& name, const Dims& nchw);
  void finish();

 private:
  static constexpr int64_t kProbeFloats = int64_t{64} << 20;  // 256 MiB an array, past the L3

  Status phase_cases(const BenchCase& whole, const Dims& nchw, DataType dt);
  Status run_and_report(BenchCase& cr, const Graph& g, const BenchOptions& o);
  void report(const BenchCase& cr) const;

  const BenchOptions& opt_;
  const int64_t threads_;
  StreamProbe probe_;
  const HostInfo host_;
  double roof_start_ = 0, read_start_ = 0, last_probe_ = 0;
  CoreRates core_;  // one core alone, at the start
  std::vector<BenchCase> cases_;
};

void BenchCommand::report(const BenchCase& cr) const {
  // No ratio where oneDNN was not timed or declined (it would read x0.00).
  auto format_ratio = [](double ratio) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << ratio;
    return os.str();
  };
  std::cout << "\n"
            << cr.name << "  (" << cr.bytes / 1e6 << " MB minimal traffic; roofline "
            << cr.probe_before << " GB/s before, " << cr.probe_after << " after)\n";
  if (cr.plain_bound_ms > 0) {
    std::cout << "  bound at the probe's rate: " << cr.layout << " " << cr.plain_bound_ms << " ms ("
              << cr.plain_traffic.passes << " tensor passes), nChw16c " << cr.blocked_bound_ms
              << " ms (" << cr.blocked_traffic.passes << ")\n";
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
  if (above && cr.bytes <= 2.0 * static_cast<double>(host_.l3_bytes)) {
    std::cout << "  * above 100%: this case's " << cr.bytes / 1e6 << " MB largely stay in the "
              << "caches (L3 " << host_.l3_bytes / 1e6 << " MB), which the DRAM probe does not "
              << "bound; \"% of its bound\" is the DRAM-sized cases' figure\n";
  } else if (above) {
    std::cout << "  * above 100%: the host gave this case more bandwidth than the probe "
              << "measured before and after it (shared memory bandwidth varies)\n";
  }
}

// Probes on both sides of every case: its shares divide by the higher of
// the two, the bandwidth the host gave while the case ran.
Status BenchCommand::run_and_report(BenchCase& cr, const Graph& g, const BenchOptions& o) {
  cr.probe_before = last_probe_;
  NG_RETURN_IF_ERROR(run_bench_case(o, cr, g));
  cr.probe_after = last_probe_ = probe_.measure(2);
  const double roof = std::max(cr.probe_before, cr.probe_after);
  for (BenchResult& r : cr.results) r.pct = roof > 0 && r.gbps > 0 ? 100.0 * r.gbps / roof : 0.0;
  if (roof > 0) {
    // A reduce phase only reads: its bound is at the read-only rate.
    const double rate = cr.phase == "reduce" ? read_start_ : roof;
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
}

// A user's graph: minimal traffic is every graph input and output read or
// written once.
Status BenchCommand::graph_case(const std::string& path) {
  NG_ASSIGN_OR_RETURN(Graph g, load_graph(path));
  NG_RETURN_IF_ERROR(g.finalize());
  BenchCase cr;
  cr.name = path;
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
  NG_RETURN_IF_ERROR(run_and_report(cr, g, opt_).with_context(cr.name));
  cases_.push_back(std::move(cr));
  return ok_status();
}

// A preset layer in every dtype, layout and fusion asked for.
Status BenchCommand::layer_cases(const std::string& name, const Dims& nchw) {
  const bool fwd = opt_.dir == "fwd";
  for (const std::string& dts : opt_.dts) {
    NG_ASSIGN_OR_RETURN(const DataType dt, parse_dtype(dts));
    for (const std::string& layout : opt_.layouts) {
      for (const std::string& fused : opt_.fused) {
        BenchCase cr;
        cr.layout = layout;
        cr.dtype = dts;
        cr.fused = fused;
        cr.shape = layout == "NCX" ? nchw : Dims{nchw[0], nchw[2], nchw[3], nchw[1]};
        cr.name = name + " " + layout + " " + dts + (fwd ? " fwd" : "") +
                  (fused == "none" ? "" : " +" + fused);
        const double elems = static_cast<double>(nchw[0] * nchw[1] * nchw[2] * nchw[3]);
        // Minimal traffic: bwd reads src and diff_dst and writes diff_src (and
        // a fused producer's second input, and writes its output with
        // relu-side; add-relu-side reads the Add's two operands and dst; the
        // siblings read a second src and write a second diff_src);
        // fwd reads src and writes dst (and reads the residual, or the sibling's src).
        // With --dir fwd, relu-side and add-relu-side write the ReLU's input too.
        const bool fwd_add = fused == "add" || fused == "add-siblings" || fused == "add-relu-side";
        const bool fwd_side = fused == "relu-side" || fused == "add-relu-side";
        const double passes = fwd               ? (fwd_add ? 3.0 : 2.0) + (fwd_side ? 1.0 : 0.0)
                              : fused == "none" ? 3.0
                              : fused == "relu-side"         ? 5.0
                              : fused == "add-relu-side"     ? 6.0
                              : fused == "relu-siblings"     ? 6.0
                              : fused == "add-relu-siblings" ? 7.0
                                                             : 4.0;
        cr.bytes = elems * static_cast<double>(dtype_size(dt)) * passes;
        if (fused == "none" && !fwd) {
          const auto esize = static_cast<int64_t>(dtype_size(dt));
          const int64_t spatial = nchw[2] * nchw[3];
          cr.plain_traffic =
              two_pass_traffic(layout, nchw[0], nchw[1], spatial, esize, host_.model_l3_bytes);
          cr.blocked_traffic =
              two_pass_traffic("nChw16c", nchw[0], nchw[1], spatial, esize, host_.model_l3_bytes);
        }
        Graph g =
            fwd ? make_forward_graph(nchw, layout, dt, fused) : make_graph(nchw, layout, dt, fused);
        NG_RETURN_IF_ERROR(run_and_report(cr, g, opt_).with_context(cr.name));
        const BenchCase whole = cr;
        cases_.push_back(std::move(cr));
        if (opt_.phases && !fwd && fused == "none")
          NG_RETURN_IF_ERROR(phase_cases(whole, nchw, dt));
      }
    }
  }
  return ok_status();
}

// The backward's two phases apart, on the JIT: reduce 2 tensor passes, apply
// 3, where the data exceeds the cache model's L3 (else no bound).
Status BenchCommand::phase_cases(const BenchCase& whole, const Dims& nchw, DataType dt) {
  const double elems = static_cast<double>(nchw[0] * nchw[1] * nchw[2] * nchw[3]);
  for (const bool reduce : {true, false}) {
    BenchCase pc;
    pc.layout = whole.layout;
    pc.dtype = whole.dtype;
    pc.fused = "none";
    pc.shape = whole.shape;
    pc.phase = reduce ? "reduce" : "apply";
    pc.name = whole.name + " " + pc.phase;
    const double tensor = elems * static_cast<double>(dtype_size(dt));
    pc.bytes = tensor * (reduce ? 2.0 : 3.0);
    if (2.0 * tensor > static_cast<double>(host_.model_l3_bytes))
      pc.plain_traffic = {pc.bytes, reduce ? 2.0 : 3.0};
    BenchOptions jit_only = opt_;
    jit_only.backends = {"jit"};
    NG_RETURN_IF_ERROR(
        run_and_report(pc, make_phase_graph(nchw, whole.layout, dt, reduce), jit_only)
            .with_context(pc.name));
    cases_.push_back(std::move(pc));
  }
  return ok_status();
}

void BenchCommand::finish() {
  const double roof_end = probe_.measure(4);
  const double read_end = probe_.measure_read_only(4);
  // The chart's line: the most the machine gave during this run. Each case's
  // share was taken against its own probes (run_and_report).
  double roofline = std::max(roof_start_, roof_end);
  for (const BenchCase& c : cases_) roofline = std::max({roofline, c.probe_before, c.probe_after});
  std::cout << "\nroofline at end: " << roof_end << " GB/s (start " << roof_start_ << ", highest "
            << roofline
            << "); each case's share divides by the higher of its two probes; 2 reads alone "
            << read_end << " GB/s at end\n";
  if (!opt_.json_out.empty()) {
    const RunProbes probes{roof_start_, roof_end, read_start_, read_end, roofline, core_};
    std::ofstream(opt_.json_out) << bench_json(cases_, host_, opt_.shapes, threads_, probes).dump(2)
                                 << "\n";
    std::cout << "wrote " << opt_.json_out << "\n";
  }
  if (!opt_.svg_out.empty()) {
    std::ofstream(opt_.svg_out) << svg_chart(cases_, roofline, threads_);
    std::cout << "wrote " << opt_.svg_out << "\n";
  }
}

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  BenchOptions opt;
  BenchArgs more;
  if (int rc = parse_bench_args(argv, opt, more); rc >= 0) return rc;
  if (more.compile_time)
    return bench_compile(more.compile_sizes, more.compile_shapes, opt.graph_path, opt.json_out);
  const NamedShapes shapes = opt.graph_path.empty() ? bench_shape_set(opt.shapes) : NamedShapes{};
  const int64_t threads =
      opt.threads > 0 ? opt.threads : static_cast<int64_t>(tbb::this_task_arena::max_concurrency());
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                  static_cast<size_t>(threads));
  set_backend_threads(static_cast<int>(threads));
  if (opt.shard_batch)
    return bench_sharded(shapes, opt.dts, opt.layouts, opt.backends[0], opt.iters, threads);
  BenchCommand command(opt, threads);
  Status s = opt.graph_path.empty() ? ok_status() : command.graph_case(opt.graph_path);
  for (const auto& [name, nchw] : shapes) {
    if (s.ok()) s = command.layer_cases(name, nchw);
  }
  if (!s.ok()) {
    std::cerr << "normgrad bench: " << s.to_string() << "\n";
    return 2;
  }
  command.finish();
  return 0;
}

}  // namespace cli
}  // namespace normgrad
