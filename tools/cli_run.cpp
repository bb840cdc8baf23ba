// `normgrad run`: load a graph, make or read inputs, compile, execute, check;
// with benchdnn's knobs (--case, --batch, --dt, --in-shapes, --op-attrs, --mb,
// --mode, --reset) it runs cases the way benchdnn's graph driver does and ends
// with benchdnn's summary line.
#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include <tbb/global_control.h>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/npy.hpp>
#include <normgrad/graph/op_checks.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>
#include <normgrad/testing/partition_check.hpp>
#include "tools/cli.hpp"
#include "tools/cli_args.hpp"
#include "tools/cli_driver.hpp"
#include "tools/cli_knobs.hpp"
#include "tools/cli_shard.hpp"

namespace normgrad {
namespace cli {

// The test oracle's pieces, used unqualified below.
using oracle::allocate;
using oracle::Buffer;
using oracle::make_inputs;
namespace {

std::string attrs_string(const Op& op) {
  std::string s;
  for (const auto& [k, v] : op.attrs())
    s += (s.empty() ? "" : ", ") + k + "=" + attr_value_to_string(v);
  return s;
}

std::string tensors_string(const std::vector<LogicalTensor>& ts) {
  std::string s;
  for (const LogicalTensor& lt : ts) {
    s += (s.empty() ? "" : ", ") + std::to_string(lt.id) + ":" + dtype_name(lt.dtype) + ":" +
         dims_to_string(lt.dims);
  }
  return s;
}

Outcome outcome_of(const Status& s) {
  switch (s.code()) {
    case StatusCode::kUnimplemented:
      return Outcome::kUnimplemented;
    case StatusCode::kInvalidArgument:
    case StatusCode::kInvalidGraph:
    case StatusCode::kOutOfRange:
    case StatusCode::kNotFound:
      return Outcome::kInvalidArguments;
    default:
      return Outcome::kFailed;
  }
}

CaseResult error_result(const Status& s) {
  return {outcome_of(s), s.to_string(), 0.0};
}

// `graph` without the ops normgrad carries but cannot run: what they wrote
// becomes graph inputs (random data unless --inputs gives it), and ports
// that name only cut ops' tensors go. `cut` receives "Kind xN" per kind.
Graph cut_unsupported(const Graph& graph, std::string* cut) {
  // An op goes when normgrad cannot run it, or when it reads only graph
  // inputs and everything it writes is read, and read only by ops that go (a
  // transpose of a weight feeding only a MatMul): nothing is left to use it.
  const std::vector<Op> ops = graph.ops().to_vector();
  std::map<int64_t, std::vector<size_t>> readers;
  std::set<int64_t> produced;
  for (size_t k = 0; k < ops.size(); ++k) {
    for (const LogicalTensor& lt : ops[k].inputs()) readers[lt.id].push_back(k);
    for (const LogicalTensor& lt : ops[k].outputs()) produced.insert(lt.id);
  }
  std::vector<bool> gone(ops.size(), false);
  for (size_t k = 0; k < ops.size(); ++k) gone[k] = op_kind_is_opaque(ops[k].kind());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = ops.size(); k-- > 0;) {
      if (gone[k]) continue;
      bool feeds_only_gone = !ops[k].outputs().empty();
      for (const LogicalTensor& lt : ops[k].inputs())
        feeds_only_gone = feeds_only_gone && !produced.count(lt.id);
      for (const LogicalTensor& lt : ops[k].outputs()) {
        auto r = readers.find(lt.id);
        if (r == readers.end()) {
          feeds_only_gone = false;  // a graph output
          break;
        }
        for (size_t reader : r->second) feeds_only_gone = feeds_only_gone && gone[reader];
      }
      if (feeds_only_gone) gone[k] = changed = true;
    }
  }
  Graph g = graph;
  std::map<std::string, int> counts;
  std::set<int64_t> ids;
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    if (gone[k]) {
      ++counts[op_kind_name(op.kind())];
      const Status erased = g.cut_op(op.id());
      assert(erased.ok() && "the op is in the graph");
      (void)erased;
      continue;
    }
    for (const LogicalTensor& lt : op.inputs()) ids.insert(lt.id);
    for (const LogicalTensor& lt : op.outputs()) ids.insert(lt.id);
  }
  for (const auto& [kind, n] : counts)
    *cut += (cut->empty() ? "" : ", ") + kind + " x" + std::to_string(n);
  auto still_used = [&](std::vector<int64_t> ports) {
    ports.erase(
        std::remove_if(ports.begin(), ports.end(), [&](int64_t id) { return !ids.count(id); }),
        ports.end());
    return ports;
  };
  if (graph.input_ports()) g.set_input_ports(still_used(*graph.input_ports()));
  if (graph.output_ports()) g.set_output_ports(still_used(*graph.output_ports()));
  return g;
}

}  // namespace

namespace {

// The graph of `path` as it will run: loaded, benchdnn's knobs applied, the
// unsupported ops cut when asked, and finalized. A result instead when the
// case ends here (an error, or ops normgrad carries but cannot run).
std::variant<Graph, CaseResult> prepare_graph(const std::string& path, const RunOptions& opt,
                                              std::string* cut) {
  auto loaded = load_graph_file(path);
  if (!loaded.ok()) return error_result(loaded.status());
  Graph graph = std::move(loaded).value();
  Status knobs_applied = apply_knobs(opt.knobs, &graph);
  if (opt.cut_unsupported) graph = cut_unsupported(graph, cut);
  // A graph with ops we carry but cannot run is UNIMPLEMENTED whatever else
  // is true of it: shapes through those ops are theirs to infer, not ours.
  std::string opaque;
  for (const Op& op : graph.ops()) {
    if (op_kind_is_opaque(op.kind())) opaque += (opaque.empty() ? "" : ", ") + op.label();
  }
  if (!opaque.empty()) {
    return CaseResult{Outcome::kUnimplemented,
                      "unsupported partitions: normgrad has no kernel for " + opaque +
                          " (--cut-unsupported runs the rest on random inputs in their place)",
                      0.0};
  }
  if (!knobs_applied.ok()) return error_result(knobs_applied);
  if (Status s = graph.finalize(); !s.ok()) return error_result(s.with_context(path));
  // benchdnn takes the engine from --engine, not from the file; say it once.
  static bool engine_noted = false;
  if (graph.engine_kind != "cpu" && !engine_noted) {
    engine_noted = true;
    std::cerr << "normgrad run: note: " << path << " names engine '" << graph.engine_kind
              << "'; normgrad runs it on the cpu\n";
  }
  for (const std::string& note : graph.notes()) {
    std::cerr << "normgrad run: note: " << path << ": " << note << "\n";
  }
  return graph;
}

void print_graph(const std::string& path, const Graph& graph, const std::string& cut) {
  if (!cut.empty()) std::cout << "cut (unsupported; their outputs are inputs now): " << cut << "\n";
  std::cout << "graph " << path << ": " << graph.ops().size() << " ops\n";
  for (const Op& op : graph.ops()) {
    std::cout << "  op " << op.id() << " " << op.label() << " {" << attrs_string(op) << "}\n"
              << "      in  [" << tensors_string(op.inputs()) << "]\n"
              << "      out [" << tensors_string(op.outputs()) << "]\n";
  }
}

// benchdnn's --expected-n-partitions: a failure naming the partitions, or none.
std::optional<CaseResult> partition_count_failure(const CompiledGraph& cg, const RunOptions& opt) {
  const auto n_partitions = static_cast<int64_t>(cg.partitions().size());
  if (opt.knobs.mode == "R" || opt.knobs.expected_n_partitions == 0 ||
      n_partitions == opt.knobs.expected_n_partitions)
    return std::nullopt;
  std::string parts;
  for (const auto& p : cg.partitions())
    parts += (parts.empty() ? "" : ", ") + p->partition().ops_string();
  return CaseResult{Outcome::kFailed,
                    "expected " + std::to_string(opt.knobs.expected_n_partitions) +
                        " partitions, got " + std::to_string(n_partitions) + " (" + parts + ")",
                    0.0};
}

// The graph executed `iters` times: the median total, and each partition's
// times printed when `detailed`.
StatusOr<double> execute_timed(const CompiledGraph& cg, const std::map<int64_t, const void*>& in,
                               const std::map<int64_t, void*>& out, int64_t iters,
                               const RunOptions& opt, bool detailed) {
  std::vector<std::vector<double>> times(cg.partitions().size());
  std::vector<double> totals;
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<double> part_ms;
    const auto t0 = std::chrono::steady_clock::now();
    NG_RETURN_IF_ERROR(cg.execute(in, out, &part_ms));
    totals.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    for (size_t k = 0; k < part_ms.size(); ++k) times[k].push_back(part_ms[k]);
  }
  const double total = median_of(totals);
  if (detailed) {
    std::cout << std::fixed << std::setprecision(3);
    for (size_t k = 0; k < cg.partitions().size(); ++k) {
      const CompiledPartition& cp = *cg.partitions()[k];
      std::cout << "partition " << cp.partition().id << ": " << cp.partition().ops_string()
                << "  backend=" << cp.backend_name() << "  kernel=" << cp.kernel_name()
                << "  compile=" << cp.compile_ms() << " ms  time=" << median_of(times[k])
                << " ms (median of " << iters << ")\n";
    }
    std::cout << "total: " << total << " ms (median of " << iters << ", threads "
              << (opt.threads > 0 ? std::to_string(opt.threads) : "default") << ")\n";
  }
  return total;
}

// --outputs: each output as DIR/<id>.npy (dense tensors only).
Status write_outputs(const std::string& dir, const std::map<int64_t, Buffer>& outputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return not_found(dir + ": cannot create directory: " + ec.message());
  for (const auto& [id, buf] : outputs) {
    if (buf.desc.effective_strides() != dense_strides(buf.desc.dims)) {
      return unimplemented("output tensor " + std::to_string(id) +
                           " is strided; .npy output needs dense tensors");
    }
    NG_RETURN_IF_ERROR(write_npy(dir + "/" + std::to_string(id) + ".npy", buf.desc, buf.data()));
  }
  return ok_status();
}

// --check: each partition is judged on its own inputs, the values this
// backend computed upstream of it (testing/partition_check.hpp); the outputs
// of the whole run must be those values, bit for bit.
Status check_outputs(const CompiledGraph& cg, const std::map<int64_t, Buffer>& inputs,
                     const std::map<int64_t, Buffer>& outputs, bool detailed, CaseResult& result) {
  std::map<int64_t, Buffer> values;
  NG_ASSIGN_OR_RETURN(auto checks, oracle::check_partitions(cg, inputs, &values));
  std::ostringstream report;
  for (const auto& [id, buf] : outputs) {
    auto each = values.find(id);
    if (each == values.end() || inputs.count(id)) continue;  // no kernel writes it
    if (buf.bytes != each->second.bytes) {
      result.outcome = Outcome::kFailed;
      result.reason += (result.reason.empty() ? "" : "; ") + std::string("tensor ") +
                       std::to_string(id) + " differs from its partition run alone";
      report << "check tensor " << id << ": the graph's run differs from its partition's FAIL\n";
    }
  }
  for (const oracle::PartitionOutputCheck& c : checks) {
    const oracle::OutputVerdict& v = c.verdict;
    if (!v.pass) {
      result.outcome = Outcome::kFailed;
      result.reason += (result.reason.empty() ? "" : "; ") + std::string("tensor ") +
                       std::to_string(c.tensor.id) + " rel_l2 " + std::to_string(v.error.rel_l2) +
                       " > " + std::to_string(v.limit);
      if (v.cond_error >= 0.0)
        result.reason += " and sum-relative " + std::to_string(v.cond_error) + " > " +
                         std::to_string(v.cond_limit);
    }
    report << "check " << oracle::describe(c) << "\n";
  }
  if (detailed)
    std::cout << report.str() << (result.outcome == Outcome::kPassed ? "PASSED" : "FAILED") << "\n";
  return ok_status();
}

}  // namespace

// Runs one graph file. `detailed` prints the graph, partitions and checks.
CaseResult run_case(const std::string& path, const RunOptions& opt, bool detailed) {
  std::string cut;
  auto prepared = prepare_graph(path, opt, &cut);
  if (auto* ended = std::get_if<CaseResult>(&prepared)) return *ended;
  const Graph& graph = std::get<Graph>(prepared);
  const bool check = opt.check || opt.knobs.mode.find('C') != std::string::npos;
  const bool perf = opt.knobs.mode.find('P') != std::string::npos;
  if (detailed) print_graph(path, graph, cut);
  CompileOptions options;
  options.backend = opt.knobs.backend;
  auto compiled = CompiledGraph::compile(graph, options);
  if (!compiled.ok()) return error_result(compiled.status());
  const CompiledGraph& cg = *compiled;
  if (auto failed = partition_count_failure(cg, opt)) return *failed;

  std::map<int64_t, std::string> sources;
  auto inputs = make_inputs(cg.graph(), cg.lowered_graph(), opt.inputs_dir,
                            static_cast<uint64_t>(opt.seed), &sources, opt.data_offset);
  if (!inputs.ok()) return error_result(inputs.status());
  std::map<int64_t, const void*> in_ptrs;
  for (auto& [id, buf] : *inputs) in_ptrs[id] = buf.data();
  if (detailed) {
    std::cout << "inputs:";
    for (const auto& [id, src] : sources) std::cout << " " << id << "(" << src << ")";
    std::cout << "\n";
  }
  std::map<int64_t, Buffer> outputs;
  std::map<int64_t, void*> out_ptrs;
  for (const LogicalTensor& lt : cg.outputs()) {
    auto b = allocate(lt);
    if (!b.ok()) return error_result(b.status());
    out_ptrs[lt.id] = outputs.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  const int64_t iters = perf ? std::max<int64_t>(opt.iters, 10) : opt.iters;
  auto ms = execute_timed(cg, in_ptrs, out_ptrs, iters, opt, detailed);
  if (!ms.ok()) return error_result(ms.status());
  CaseResult result{check ? Outcome::kPassed : Outcome::kExecuted, "", *ms};
  if (!opt.outputs_dir.empty()) {
    if (Status s = write_outputs(opt.outputs_dir, outputs); !s.ok()) return error_result(s);
    if (detailed)
      std::cout << "wrote " << outputs.size() << " outputs to " << opt.outputs_dir << "\n";
  }
  if (!check) return result;
  if (Status s = check_outputs(cg, *inputs, outputs, detailed, result); !s.ok())
    return error_result(s);
  return result;
}

int run_command(const std::vector<std::string>& argv) {
  RunOptions defaults;
  defaults.knobs.mode = "C";
  CLI::App app(
      "Loads, verifies, compiles and executes a graph; with benchdnn's graph-driver knobs "
      "(--case, --batch, --mode, --dt, --in-shapes, --op-attrs, --mb, --reset, ...; "
      "docs/cli.md) it runs cases as benchdnn does.",
      "normgrad run");
  app.allow_extras();  // benchdnn's knobs and the graph: tools/cli_knobs, in their order
  app.footer(benchdnn_knobs_help());
  bool shard_batch = false;
  app.add_flag("--check", defaults.check, "compare every output with the reference backend");
  app.add_flag("--cut-unsupported", defaults.cut_unsupported,
               "cut the ops normgrad cannot run (convolutions, ...); their outputs become random "
               "inputs");
  app.add_flag("--shard-batch", shard_batch,
               "under mpirun: each process runs its slice of the batch (docs/scale-out.md)");
  app.add_option("--iters", defaults.iters, "executions (times are medians)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app.add_option("--threads", defaults.threads, "cap the threads")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--seed", defaults.seed, "seed of the random inputs")
      ->check(CLI::Range(int64_t{0}, INT64_MAX));
  app.add_option("--data-offset", defaults.data_offset,
                 "add this to every batch-norm src's random data (e.g. 1e4: far from zero)")
      ->check(CLI::Range(-1e30, 1e30));
  app.add_option("--inputs", defaults.inputs_dir, "read input <id> from DIR/<id>.npy");
  app.add_option("--outputs", defaults.outputs_dir, "write output <id> to DIR/<id>.npy");
  app.add_option("--backend", defaults.knobs.backend, backend_names_help())
      ->check(CLI::IsMember(known_backend_names()));
  if (int rc = parse_args(app, argv); rc >= 0) return rc;
  std::vector<std::string> knob_tokens, positional;
  bool mode_given = false;
  for (const std::string& a : app.remaining()) {
    if (a.rfind("-", 0) != 0) {
      positional.push_back(a);  // runs after every option, whatever their order
    } else {
      if (a.rfind("--mode", 0) == 0) mode_given = true;
      knob_tokens.push_back(a);
    }
  }
  if (shard_batch) {
    if (positional.size() != 1 || !knob_tokens.empty() || !defaults.inputs_dir.empty() ||
        !defaults.outputs_dir.empty()) {
      std::cerr << "normgrad run: --shard-batch takes one GRAPH.json and --check, --backend, "
                   "--iters, --threads, --seed\n";
      return 2;
    }
    if (defaults.threads > 0) set_num_threads(static_cast<int>(defaults.threads));
    return shard_run_command(positional[0], defaults);
  }
  knob_tokens.insert(knob_tokens.end(), positional.begin(), positional.end());
  // A plain `run GRAPH.json` only executes unless --check or --mode asks for more.
  if (!mode_given) {
    bool has_case = false;
    for (const std::string& t : knob_tokens)
      has_case = has_case || t.rfind("--case", 0) == 0 || t.rfind("--batch", 0) == 0;
    if (!has_case) defaults.knobs.mode = "R";
  }
  if (knob_tokens.empty()) {
    std::cerr << "normgrad run: expected GRAPH.json, --case=GRAPH.json or --batch=FILE\n";
    return 2;
  }
  std::unique_ptr<tbb::global_control> thread_limit;
  if (defaults.threads > 0) {
    thread_limit = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<size_t>(defaults.threads));
    set_backend_threads(static_cast<int>(defaults.threads));
  }
  Driver driver(defaults);
  if (!driver.process(knob_tokens)) {
    driver.finish();  // the cases run so far still get their summary
    return 2;
  }
  return driver.finish();
}

}  // namespace cli
}  // namespace normgrad
