// `normgrad tune`: times the JIT's variants for each shape class on this
// host, interleaved, and writes the winners to the per-host tune cache
// (backends/tune_cache.hpp) that compile then reads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <normgrad/backends/backend.hpp>
#include <normgrad/backends/tune_cache.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tools/bench_graphs.hpp"
#include "tools/cli.hpp"
#include "tools/cli_args.hpp"
#include "tools/cli_driver.hpp"

namespace normgrad {
namespace cli {
namespace {

// The candidates for an op and layout: the JIT's own choice ("default", the
// control) first, then every variant the JIT names for that walk (the
// forward's: every fwd- variant; those that leave a problem's kernel as it
// was are dropped when it compiles).
std::vector<std::string> candidates(const std::string& op, bool nxc) {
  std::vector<std::string> names = {"default"};
  const char* prefix = op == "fwd" ? "fwd-" : nxc ? "nxc-" : "ncx-";
  if (const Backend* jit = find_backend("jit")) {
    for (const std::string& v : jit->variants()) {
      if (v.rfind(prefix, 0) == 0) names.push_back(v);
    }
  }
  return names;
}

struct Problem {
  std::string op, layout;
  DataType dt;
  Dims nchw;
  std::string cls, isa, label;
  // Per candidate: the compiled graph (nullptr: the variant does not apply)
  // and its times.
  std::vector<std::unique_ptr<CompiledGraph>> compiled;
  std::vector<std::vector<double>> ms;
};

int usage_error(const std::string& what) {
  std::cerr << "normgrad tune: " << what << "\n";
  return 2;
}

StatusOr<Dims> parse_shape(const std::string& s) {
  Dims d;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, 'x')) {
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v <= 0 || v > (1 << 20))
      return invalid_argument("--shapes: '" + s + "' is not NxCxHxW with positive dims");
    d.push_back(v);
  }
  if (d.size() != 4) return invalid_argument("--shapes: '" + s + "' is not NxCxHxW");
  return d;
}

// --shapes: each item a named set of bench's (bench_shape_set) or one NxCxHxW.
StatusOr<NamedShapes> expand_shapes(const std::string& list) {
  NamedShapes out;
  for (const std::string& item : split_list(list)) {
    NamedShapes set = bench_shape_set(item);
    if (set.empty()) {
      if (item.find('x') == std::string::npos)
        return invalid_argument("--shapes: '" + item +
                                "' is neither NxCxHxW nor a named set (small, resnet50, cached)");
      NG_ASSIGN_OR_RETURN(Dims nchw, parse_shape(item));
      set.push_back({item, nchw});
    }
    for (auto& s : set) out.push_back(std::move(s));
  }
  return out;
}

// The JIT ISA and shape class of the problem, read off the compiled kernel's
// conf through the op (the class does not depend on the variant).
Status describe(Problem* p, const CompiledGraph& cg) {
  for (const Op& op : cg.lowered_graph().ops()) {
    auto d = describe_batch_norm(op);
    if (!d.ok()) continue;
    p->cls = tune_class(*d);
  }
  if (p->cls.empty()) return internal_error("no batch norm in the tuned graph");
  const std::string kernel = cg.partitions().front()->kernel_name();  // "jit:avx512:..."
  const size_t a = kernel.find(':'), b = kernel.find(':', a + 1);
  p->isa = kernel.substr(a + 1, b - a - 1);
  return ok_status();
}

// The command line's choices.
struct TuneArgs {
  std::string shapes = "32x64x112x112,32x256x56x56,32x512x28x28,32x1024x14x14,32x2048x7x7";
  std::string dts = "f32,bf16", layouts = "NCX,NXC", ops = "fwd,bwd,from-dst";
  int64_t iters = 7;
  double margin = 1.05;
  bool dry_run = false;
};

// Returns an exit code when the command is done (help, a usage error), -1 to go on.
int parse_tune_args(const std::vector<std::string>& argv, TuneArgs& a) {
  CLI::App app(
      "Times the JIT's kernel variants for each shape class on this host (interleaved, median "
      "of --iters) and writes the winners to the per-host tune cache that compile reads "
      "(NORMGRAD_TUNE=0 ignores it).",
      "normgrad tune");
  app.add_option("--shapes", a.shapes,
                 "comma-separated NxCxHxW or bench's named sets: small, resnet50, cached "
                 "(default: ResNet-50's batch-32 layers)");
  app.add_option("--dt", a.dts, "comma-separated: f32, bf16, f16")
      ->check(list_of({"f32", "bf16", "f16"}));
  app.add_option("--layouts", a.layouts, "comma-separated: NCX, NXC")
      ->check(list_of({"NCX", "NXC"}));
  app.add_option("--ops", a.ops,
                 "comma-separated: fwd (BatchNormForwardTraining), bwd "
                 "(BatchNormTrainingBackward), from-dst")
      ->check(list_of({"fwd", "bwd", "from-dst"}));
  app.add_option("--iters", a.iters, "timed runs per candidate, interleaved (default 7)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--margin", a.margin,
                 "a variant replaces the JIT's own choice only when at least this much faster "
                 "(default 1.05); below 1, the best variant is taken when it runs at least that "
                 "fraction of the rules' speed (to try a variant on real work)")
      ->check(CLI::Range(0.01, 10.0));
  app.add_flag("--dry-run", a.dry_run, "measure and print, write nothing");
  return parse_args(app, argv);
}

// Every (op, layout, dtype, shape) asked for.
StatusOr<std::vector<Problem>> plan_problems(const TuneArgs& a) {
  std::vector<Problem> problems;
  for (const std::string& op : split_list(a.ops)) {
    for (const std::string& layout : split_list(a.layouts)) {
      for (const std::string& dt_name : split_list(a.dts)) {
        NG_ASSIGN_OR_RETURN(const DataType dt, parse_dtype(dt_name));
        NG_ASSIGN_OR_RETURN(const NamedShapes shapes, expand_shapes(a.shapes));
        for (const auto& [shape, nchw] : shapes) {
          Problem p{op, layout, dt, nchw, "", "", "", {}, {}};
          p.label = shape + " " + layout + " " + dt_name + " " + op;
          problems.push_back(std::move(p));
        }
      }
    }
  }
  return problems;
}

// Compiles every candidate of `p`; a variant the conf cannot take is left
// out (nullptr), and so is a forward variant that leaves the kernel as it was.
Status compile_candidates(Problem& p) {
  const Graph g = p.op == "fwd"   ? make_forward_graph(p.nchw, p.layout, p.dt, "none")
                  : p.op == "bwd" ? make_graph(p.nchw, p.layout, p.dt, "none")
                                  : make_from_dst_graph(p.nchw, p.layout, p.dt, 0.01f);
  for (const std::string& v : candidates(p.op, p.layout == "NXC")) {
    CompileOptions options{"jit"};
    options.jit_variant = v;
    auto cg = CompiledGraph::compile(g, options);
    if (!cg.ok() && v == "default") return cg.status().with_context(p.label);
    const bool same = cg.ok() && v != "default" && p.op == "fwd" &&
                      cg->partitions().front()->kernel_config() ==
                          p.compiled.front()->partitions().front()->kernel_config();
    if (!cg.ok() || same) {
      p.compiled.emplace_back();
    } else {
      p.compiled.push_back(std::make_unique<CompiledGraph>(std::move(cg).value()));
    }
    p.ms.emplace_back();
  }
  return describe(&p, *p.compiled.front());
}

// Interleaved timing: every candidate of `p` once per round, so they share
// the host's drift. Each candidate's outputs are allocated once, by a first
// run, and reused: the kernels are timed, not the page faults of fresh
// output buffers (which cost several times the kernel).
Status time_candidates(Problem& p, int64_t iters) {
  NG_ASSIGN_OR_RETURN(auto inputs,
                      oracle::make_inputs(p.compiled.front()->graph(),
                                          p.compiled.front()->lowered_graph(), "", 1, nullptr));
  std::vector<std::map<int64_t, oracle::Buffer>> outs(p.compiled.size());
  std::map<int64_t, const void*> in_ptrs;
  for (const auto& [id, b] : inputs) in_ptrs[id] = b.data();
  for (size_t k = 0; k < p.compiled.size(); ++k) {
    if (!p.compiled[k]) continue;
    auto out = oracle::run_outputs(*p.compiled[k], inputs);
    if (!out.ok()) return out.status().with_context(p.label);
    outs[k] = std::move(out).value();
  }
  for (int64_t r = -1; r < iters; ++r) {  // round -1 warms up
    for (size_t k = 0; k < p.compiled.size(); ++k) {
      if (!p.compiled[k]) continue;
      std::map<int64_t, void*> out_ptrs;
      for (auto& [id, b] : outs[k]) out_ptrs[id] = b.data();
      const auto t0 = std::chrono::steady_clock::now();
      const Status s = p.compiled[k]->execute(in_ptrs, out_ptrs);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) return s.with_context(p.label);
      if (r >= 0) p.ms[k].push_back(ms);
    }
  }
  return ok_status();
}

using Choices =
    std::map<std::string, std::map<std::string, TunedChoice>>;  // isa -> class -> choice

// Per class (over its shapes): the candidate with the best geometric mean of
// time against the JIT's own choice, if it wins by `margin`. Prints each
// problem's ratios and the choices.
Choices choose(const std::vector<Problem>& problems, int64_t iters, double margin) {
  struct ClassScore {
    std::string isa;
    std::map<std::string, std::vector<double>> ratio;  // variant -> default/variant per shape
  };
  std::map<std::string, ClassScore> classes;
  std::cout << "tune: " << problems.size() << " problems, median of " << iters
            << " interleaved runs each; cache " << tune_cache_path() << "\n"
            << "host: " << tune_host_key() << "\n";
  for (const Problem& p : problems) {
    const double base = median_of(p.ms.front());
    ClassScore& cs = classes[p.cls];
    cs.isa = p.isa;
    std::cout << "  " << std::left << std::setw(34) << p.label << " " << std::setw(44) << p.cls
              << std::right << std::fixed << std::setprecision(3) << " default " << base << " ms";
    const std::vector<std::string> names = candidates(p.op, p.layout == "NXC");
    for (size_t k = 1; k < p.compiled.size(); ++k) {
      if (!p.compiled[k]) continue;
      const double m = median_of(p.ms[k]);
      cs.ratio[names[k]].push_back(base / m);
      std::cout << "  " << names[k] << " " << std::setprecision(2) << base / m << "x";
    }
    std::cout << "\n";
  }
  Choices by_isa;
  std::cout << "choices:\n";
  for (const auto& [cls, cs] : classes) {
    TunedChoice best{"", 0.0};
    for (const auto& [variant, ratios] : cs.ratio) {
      double log_sum = 0;
      for (double r : ratios) log_sum += std::log(r);
      const double geo = std::exp(log_sum / static_cast<double>(ratios.size()));
      if (geo > best.speedup) best = {variant, geo};
    }
    if (best.variant.empty() || best.speedup < margin) best = {"default", 1.0};
    std::cout << "  " << cs.isa << " " << std::left << std::setw(44) << cls << std::right << " "
              << best.variant;
    if (best.variant != "default")
      std::cout << " (" << std::setprecision(2) << best.speedup << "x)";
    std::cout << "\n";
    by_isa[cs.isa][cls] = best;
  }
  return by_isa;
}

}  // namespace

int tune_command(const std::vector<std::string>& argv) {
  TuneArgs args;
  if (int rc = parse_tune_args(argv, args); rc >= 0) return rc;
  auto problems = plan_problems(args);
  if (!problems.ok()) return usage_error(problems.status().message());
  for (Problem& p : *problems) {
    Status s = compile_candidates(p);
    if (s.ok()) s = time_candidates(p, args.iters);
    if (!s.ok()) {
      std::cerr << "normgrad tune: " << s.to_string() << "\n";
      return 1;
    }
  }
  const Choices by_isa = choose(*problems, args.iters, args.margin);
  if (args.dry_run) {
    std::cout << "dry run: nothing written\n";
    return 0;
  }
  for (const auto& [isa, choices] : by_isa) {
    if (Status s = write_tuned_choices(isa, choices); !s.ok()) {
      std::cerr << "normgrad tune: error: " << s.to_string() << "\n";
      return 1;
    }
  }
  std::cout << "wrote " << tune_cache_path() << "\n";
  return 0;
}

}  // namespace cli
}  // namespace normgrad
