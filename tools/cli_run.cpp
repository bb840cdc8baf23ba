// `normgrad run`: load a graph, make or read inputs, compile, execute, check;
// with benchdnn's knobs (--case, --batch, --dt, --in-shapes, --op-attrs, --mb,
// --mode, --reset) it runs cases the way benchdnn's graph driver does and ends
// with benchdnn's summary line.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <tbb/global_control.h>

#include "backends/compiler.hpp"
#include "graph/json_io.hpp"
#include "graph/npy.hpp"
#include "tools/cli.hpp"
#include "tools/cli_data.hpp"
#include "tools/cli_knobs.hpp"

namespace normgrad {
namespace cli {
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

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Options that are not benchdnn knobs.
struct RunOptions {
  Knobs knobs;
  bool check = false;
  int64_t iters = 1;
  int64_t threads = 0;
  int64_t seed = 1;
  std::string inputs_dir, outputs_dir;
};

enum class Outcome { kPassed, kExecuted, kFailed, kUnimplemented, kInvalidArguments };

struct CaseResult {
  Outcome outcome = Outcome::kPassed;
  std::string reason;
  double ms = 0.0;
};

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

// Runs one graph file. `detailed` prints the graph, partitions and checks.
CaseResult run_case(const std::string& path, const RunOptions& opt, bool detailed) {
  auto loaded = load_graph(path);
  if (!loaded.ok()) return error_result(loaded.status());
  Graph graph = std::move(loaded).value();
  if (Status s = apply_knobs(opt.knobs, &graph); !s.ok()) return error_result(s);
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
  const bool check = opt.check || opt.knobs.mode.find('C') != std::string::npos;
  const bool perf = opt.knobs.mode.find('P') != std::string::npos;
  if (detailed) {
    std::cout << "graph " << path << ": " << graph.ops().size() << " ops\n";
    for (const Op& op : graph.ops()) {
      std::cout << "  op " << op.id() << " " << op.label() << " {" << attrs_string(op) << "}\n"
                << "      in  [" << tensors_string(op.inputs()) << "]\n"
                << "      out [" << tensors_string(op.outputs()) << "]\n";
    }
  }
  CompileOptions options;
  options.backend = opt.knobs.backend;
  auto compiled = CompiledGraph::compile(graph, options);
  if (!compiled.ok()) return error_result(compiled.status());
  const CompiledGraph& cg = *compiled;

  std::map<int64_t, std::string> sources;
  auto inputs = make_inputs(cg.graph(), cg.lowered_graph(), opt.inputs_dir,
                            static_cast<uint64_t>(opt.seed), &sources);
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
  std::vector<std::vector<double>> times(cg.partitions().size());
  std::vector<double> totals;
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<double> part_ms;
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = cg.execute(in_ptrs, out_ptrs, &part_ms); !s.ok()) return error_result(s);
    totals.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    for (size_t k = 0; k < part_ms.size(); ++k) times[k].push_back(part_ms[k]);
  }
  CaseResult result{check ? Outcome::kPassed : Outcome::kExecuted, "", median(totals)};
  if (detailed) {
    std::cout << std::fixed << std::setprecision(3);
    for (size_t k = 0; k < cg.partitions().size(); ++k) {
      const CompiledPartition& cp = *cg.partitions()[k];
      std::cout << "partition " << cp.partition().id << ": " << cp.partition().ops_string()
                << "  backend=" << cp.backend_name() << "  kernel=" << cp.kernel_name()
                << "  compile=" << cp.compile_ms() << " ms  time=" << median(times[k])
                << " ms (median of " << iters << ")\n";
    }
    std::cout << "total: " << result.ms << " ms (median of " << iters << ", threads "
              << (opt.threads > 0 ? std::to_string(opt.threads) : "default") << ")\n";
  }
  if (!opt.outputs_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.outputs_dir, ec);
    if (ec)
      return error_result(
          not_found(opt.outputs_dir + ": cannot create directory: " + ec.message()));
    for (const auto& [id, buf] : outputs) {
      if (buf.desc.effective_strides() != dense_strides(buf.desc.dims)) {
        return error_result(unimplemented("output tensor " + std::to_string(id) +
                                          " is strided; .npy output needs dense tensors"));
      }
      if (Status s =
              write_npy(opt.outputs_dir + "/" + std::to_string(id) + ".npy", buf.desc, buf.data());
          !s.ok()) {
        return error_result(s);
      }
    }
    if (detailed)
      std::cout << "wrote " << outputs.size() << " outputs to " << opt.outputs_dir << "\n";
  }
  if (!check) return result;

  auto ref = CompiledGraph::compile(graph, CompileOptions{"ref"});
  if (!ref.ok()) return error_result(ref.status());
  std::map<int64_t, Buffer> expected;
  std::map<int64_t, void*> exp_ptrs;
  for (const LogicalTensor& lt : ref->outputs()) {
    auto b = allocate(lt);
    if (!b.ok()) return error_result(b.status());
    exp_ptrs[lt.id] = expected.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  if (Status s = ref->execute(in_ptrs, exp_ptrs); !s.ok()) return error_result(s);
  std::ostringstream report;
  report << std::scientific << std::setprecision(3);
  for (const auto& [id, want] : expected) {
    const ErrorStats e = compare(outputs.at(id), want);
    const double limit =
        threshold_for(want.desc.dtype, is_reduction_output(cg.lowered_graph(), id));
    const bool pass = e.nan_mismatch == 0 && e.rel_l2 <= limit;
    if (!pass) {
      result.outcome = Outcome::kFailed;
      result.reason += (result.reason.empty() ? "" : "; ") + std::string("tensor ") +
                       std::to_string(id) + " rel_l2 " + std::to_string(e.rel_l2) + " > " +
                       std::to_string(limit);
    }
    report << "check tensor " << id << " (" << dtype_name(want.desc.dtype) << " "
           << dims_to_string(want.desc.dims) << "): max_abs=" << e.max_abs << " rel_l2=" << e.rel_l2
           << " limit=" << limit;
    if (e.nan_mismatch) report << " nan/inf_mismatch=" << e.nan_mismatch;
    report << " " << (pass ? "ok" : "FAIL") << "\n";
  }
  if (detailed)
    std::cout << report.str() << (result.outcome == Outcome::kPassed ? "PASSED" : "FAILED") << "\n";
  return result;
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPassed:
      return "PASSED";
    case Outcome::kExecuted:
      return "EXECUTED";
    case Outcome::kFailed:
      return "FAILED";
    case Outcome::kUnimplemented:
      return "UNIMPLEMENTED";
    case Outcome::kInvalidArguments:
      return "INVALID_ARGUMENTS";
  }
  return "?";
}

// benchdnn-style driver state: knobs persist from case to case until --reset.
class Driver {
 public:
  explicit Driver(RunOptions defaults) : defaults_(defaults), opt_(std::move(defaults)) {}

  // Processes tokens in order; `base_dir` resolves --case paths inside batch files.
  bool process(const std::vector<std::string>& tokens, const std::string& base_dir, int depth) {
    for (const std::string& t : tokens) {
      std::string key = t, value;
      if (t.rfind("--", 0) == 0) {
        const size_t eq = t.find('=');
        key = t.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
        if (eq != std::string::npos) value = t.substr(eq + 1);
      } else {
        run_one(t, false);
        continue;
      }
      Status s;
      if (key == "reset") {
        opt_ = defaults_;
      } else if (key == "case") {
        std::filesystem::path p(value);
        run_one(p.is_absolute() || base_dir.empty()
                    ? value
                    : (std::filesystem::path(base_dir) / p).string(),
                true, value);
      } else if (key == "batch") {
        if (depth > 4) return fail_arg("--batch nests deeper than 4 files");
        std::ifstream in(value);
        if (!in) return fail_arg("--batch: cannot open " + value);
        std::vector<std::string> batch_tokens;
        std::string line;
        while (std::getline(in, line)) {
          const size_t hash = line.find('#');
          if (hash != std::string::npos) line.resize(hash);
          std::istringstream ls(line);
          std::string tok;
          while (ls >> tok) batch_tokens.push_back(tok);
        }
        if (!process(batch_tokens, std::filesystem::path(value).parent_path().string(), depth + 1))
          return false;
      } else if (key == "dt") {
        s = parse_dtype(value).status();
        opt_.knobs.dt = value;
      } else if (key == "in-shapes") {
        s = parse_in_shapes(value, &opt_.knobs);
      } else if (key == "op-attrs") {
        s = parse_op_attrs(value, &opt_.knobs);
      } else if (key == "mb") {
        if (!parse_int(value, 1, int64_t{1} << 40, &opt_.knobs.mb))
          s = invalid_argument("--mb must be a positive integer");
      } else if (key == "mode") {
        if (value != "C" && value != "P" && value != "CP" && value != "R")
          s = invalid_argument("--mode must be C, P, CP or R");
        opt_.knobs.mode = value;
      } else if (key == "backend") {
        opt_.knobs.backend = value;
      } else {
        s = invalid_argument("unknown option --" + key);
      }
      if (!s.ok()) return fail_arg(s.message());
    }
    return true;
  }

  int finish() {
    if (benchdnn_) {
      std::cout << "tests:" << tests_ << " passed:" << passed_
                << " skipped:0 mistrusted:0 unimplemented:" << unimplemented_
                << " invalid_arguments:" << invalid_ << " failed:" << failed_ << "\n";
    }
    // One graph: a rule broken is a usage error (2); a failed check or ops we
    // cannot run (benchdnn's UNIMPLEMENTED) is 1.
    if (benchdnn_) return failed_ + invalid_ + unimplemented_ > 0 ? 1 : 0;
    if (invalid_ > 0) return 2;
    return failed_ + unimplemented_ > 0 ? 1 : 0;
  }

 private:
  bool fail_arg(const std::string& msg) {
    std::cerr << "normgrad run: " << msg << "\n";
    return false;
  }

  void run_one(const std::string& path, bool benchdnn, const std::string& shown = "") {
    benchdnn_ = benchdnn_ || benchdnn;
    const CaseResult r = run_case(path, opt_, !benchdnn);
    ++tests_;
    switch (r.outcome) {
      case Outcome::kPassed:
      case Outcome::kExecuted:
        ++passed_;
        break;
      case Outcome::kFailed:
        ++failed_;
        break;
      case Outcome::kUnimplemented:
        ++unimplemented_;
        break;
      case Outcome::kInvalidArguments:
        ++invalid_;
        break;
    }
    if (benchdnn) {
      std::cout << tests_ - 1 << ":" << outcome_name(r.outcome);
      if (!r.reason.empty()) std::cout << " (" << r.reason << ")";
      std::cout << " (" << std::fixed << std::setprecision(3) << r.ms
                << " ms) __REPRO: " << repro_line(opt_.knobs, shown.empty() ? path : shown) << "\n";
    } else if (r.outcome != Outcome::kPassed && r.outcome != Outcome::kExecuted) {
      std::cerr << "normgrad run: "
                << (r.outcome == Outcome::kUnimplemented ? "UNIMPLEMENTED: "
                    : r.outcome == Outcome::kFailed && r.reason.find(':') == std::string::npos
                        ? "check failed: "
                        : "error: ")
                << r.reason << "\n";
    }
  }

  RunOptions defaults_, opt_;
  bool benchdnn_ = false;
  int tests_ = 0, passed_ = 0, failed_ = 0, unimplemented_ = 0, invalid_ = 0;
};

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  RunOptions defaults;
  defaults.knobs.mode = "C";
  std::vector<std::string> knob_tokens, positional;
  bool mode_given = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    auto value_of = [&](const std::string& key, std::string* v) -> bool {
      if (a == "--" + key) {
        if (i + 1 >= argv.size()) return false;
        *v = argv[++i];
        return true;
      }
      if (a.rfind("--" + key + "=", 0) == 0) {
        *v = a.substr(key.size() + 3);
        return true;
      }
      return false;
    };
    std::string v;
    if (a == "--check") {
      defaults.check = true;
    } else if (value_of("iters", &v)) {
      if (!parse_int(v, 1, 1000000, &defaults.iters))
        return std::cerr << "normgrad run: --iters must be an integer in [1, 1000000]\n", 2;
    } else if (value_of("threads", &v)) {
      if (!parse_int(v, 1, 4096, &defaults.threads))
        return std::cerr << "normgrad run: --threads must be an integer in [1, 4096]\n", 2;
    } else if (value_of("seed", &v)) {
      if (!parse_int(v, 0, INT64_MAX, &defaults.seed))
        return std::cerr << "normgrad run: --seed must be a non-negative integer\n", 2;
    } else if (value_of("inputs", &v)) {
      defaults.inputs_dir = v;
    } else if (value_of("outputs", &v)) {
      defaults.outputs_dir = v;
    } else if (value_of("backend", &v)) {
      defaults.knobs.backend = v;
    } else if (a.rfind("--", 0) != 0) {
      positional.push_back(a);  // runs after every option, whatever their order
    } else {
      if (a.rfind("--mode", 0) == 0) mode_given = true;
      knob_tokens.push_back(a);
    }
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
  if (!driver.process(knob_tokens, "", 0)) return 2;
  return driver.finish();
}

}  // namespace cli
}  // namespace normgrad
