// `normgrad run`: load a graph, make or read inputs, compile, execute, check.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>

#include <tbb/global_control.h>

#include "backends/compiler.hpp"
#include "graph/json_io.hpp"
#include "graph/npy.hpp"
#include "tools/cli.hpp"
#include "tools/cli_data.hpp"

namespace normgrad {
namespace cli {
namespace {

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::string attrs_string(const Op& op) {
  std::string s;
  for (const auto& [k, v] : op.attrs()) s += (s.empty() ? "" : ", ") + k + "=" + attr_value_to_string(v);
  return s;
}

std::string tensors_string(const std::vector<LogicalTensor>& ts) {
  std::string s;
  for (const LogicalTensor& lt : ts) {
    s += (s.empty() ? "" : ", ") + std::to_string(lt.id) + ":" + dtype_name(lt.dtype) + ":" + dims_to_string(lt.dims);
  }
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int fail(const Status& s) {
  std::cerr << "normgrad run: error: " << s.to_string() << "\n";
  return 2;
}

}  // namespace

bool parse_args(int argc, char** argv, int first, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued, Args* args, std::string* error) {
  auto contains = [](const std::vector<std::string>& v, const std::string& k) {
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      args->positional.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (contains(flags, key)) {
      if (inline_value) {
        *error = "option --" + key + " takes no value";
        return false;
      }
      args->options[key] = "1";
    } else if (contains(valued, key)) {
      if (!inline_value) {
        if (i + 1 >= argc) {
          *error = "option --" + key + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      args->options[key] = value;
    } else {
      *error = "unknown option --" + key;
      return false;
    }
  }
  return true;
}

int run_command(const Args& args) {
  if (args.positional.size() != 1) {
    std::cerr << "normgrad run: expected exactly one GRAPH.json, got " << args.positional.size() << "\n";
    return 2;
  }
  const std::string path = args.positional[0];
  int64_t iters = 1, threads = 0, seed = 1;
  if (args.has("iters") && !parse_int(args.get("iters"), 1, 1000000, &iters)) {
    std::cerr << "normgrad run: --iters must be an integer in [1, 1000000]\n";
    return 2;
  }
  if (args.has("threads") && !parse_int(args.get("threads"), 1, 4096, &threads)) {
    std::cerr << "normgrad run: --threads must be an integer in [1, 4096]\n";
    return 2;
  }
  if (args.has("seed") && !parse_int(args.get("seed"), 0, INT64_MAX, &seed)) {
    std::cerr << "normgrad run: --seed must be a non-negative integer\n";
    return 2;
  }
  std::unique_ptr<tbb::global_control> thread_limit;
  if (threads > 0) {
    thread_limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                         static_cast<size_t>(threads));
    set_backend_threads(static_cast<int>(threads));
  }
  CompileOptions options;
  options.backend = args.get("backend", "auto");

  auto loaded = load_graph(path);
  if (!loaded.ok()) return fail(loaded.status());
  Graph graph = std::move(loaded).value();
  if (Status s = graph.finalize(); !s.ok()) return fail(s.with_context(path));

  std::cout << "graph " << path << ": " << graph.ops().size() << " ops\n";
  for (const Op& op : graph.ops()) {
    std::cout << "  op " << op.id() << " " << op.label() << " {" << attrs_string(op) << "}\n"
              << "      in  [" << tensors_string(op.inputs()) << "]\n"
              << "      out [" << tensors_string(op.outputs()) << "]\n";
  }

  auto compiled = CompiledGraph::compile(graph, options);
  if (!compiled.ok()) return fail(compiled.status());
  const CompiledGraph& cg = *compiled;

  std::map<int64_t, std::string> sources;
  auto inputs = make_inputs(cg.graph(), cg.lowered_graph(), args.get("inputs"), static_cast<uint64_t>(seed), &sources);
  if (!inputs.ok()) return fail(inputs.status());
  std::map<int64_t, const void*> in_ptrs;
  for (auto& [id, buf] : *inputs) in_ptrs[id] = buf.data();
  std::cout << "inputs:";
  for (const auto& [id, src] : sources) std::cout << " " << id << "(" << src << ")";
  std::cout << "\n";

  std::map<int64_t, Buffer> outputs;
  std::map<int64_t, void*> out_ptrs;
  for (const LogicalTensor& lt : cg.outputs()) {
    auto b = allocate(lt);
    if (!b.ok()) return fail(b.status());
    out_ptrs[lt.id] = outputs.emplace(lt.id, std::move(b).value()).first->second.data();
  }

  std::vector<std::vector<double>> times(cg.partitions().size());
  std::vector<double> totals;
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<double> part_ms;
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = cg.execute(in_ptrs, out_ptrs, &part_ms); !s.ok()) return fail(s);
    totals.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    for (size_t k = 0; k < part_ms.size(); ++k) times[k].push_back(part_ms[k]);
  }
  std::cout << std::fixed << std::setprecision(3);
  for (size_t k = 0; k < cg.partitions().size(); ++k) {
    const CompiledPartition& cp = *cg.partitions()[k];
    std::cout << "partition " << cp.partition().id << ": " << cp.partition().ops_string()
              << "  backend=" << cp.backend_name() << "  kernel=" << cp.kernel_name()
              << "  compile=" << cp.compile_ms() << " ms  time=" << median(times[k]) << " ms (median of "
              << iters << ")\n";
  }
  std::cout << "total: " << median(totals) << " ms (median of " << iters << ", threads "
            << (threads > 0 ? std::to_string(threads) : "default") << ")\n";

  if (args.has("outputs")) {
    const std::string dir = args.get("outputs");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return fail(not_found(dir + ": cannot create directory: " + ec.message()));
    for (const auto& [id, buf] : outputs) {
      if (buf.desc.effective_strides() != dense_strides(buf.desc.dims)) {
        return fail(unimplemented("output tensor " + std::to_string(id) + " is strided; .npy output needs dense tensors"));
      }
      if (Status s = write_npy(dir + "/" + std::to_string(id) + ".npy", buf.desc, buf.data()); !s.ok()) return fail(s);
    }
    std::cout << "wrote " << outputs.size() << " outputs to " << dir << "\n";
  }

  if (!args.has("check")) return 0;
  CompileOptions ref_options;
  ref_options.backend = "ref";
  auto ref = CompiledGraph::compile(graph, ref_options);
  if (!ref.ok()) return fail(ref.status());
  std::map<int64_t, Buffer> expected;
  std::map<int64_t, void*> exp_ptrs;
  for (const LogicalTensor& lt : ref->outputs()) {
    auto b = allocate(lt);
    if (!b.ok()) return fail(b.status());
    exp_ptrs[lt.id] = expected.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  if (Status s = ref->execute(in_ptrs, exp_ptrs); !s.ok()) return fail(s);
  bool all_pass = true;
  std::cout << std::scientific << std::setprecision(3);
  for (const auto& [id, want] : expected) {
    const ErrorStats e = compare(outputs.at(id), want);
    const bool reduction = is_reduction_output(cg.lowered_graph(), id);
    const double limit = threshold_for(want.desc.dtype, reduction);
    const bool pass = e.nan_mismatch == 0 && e.rel_l2 <= limit;
    all_pass = all_pass && pass;
    std::cout << "check tensor " << id << " (" << dtype_name(want.desc.dtype) << " "
              << dims_to_string(want.desc.dims) << "): max_abs=" << e.max_abs << " rel_l2=" << e.rel_l2
              << " limit=" << limit;
    if (e.nan_mismatch) std::cout << " nan/inf_mismatch=" << e.nan_mismatch;
    std::cout << " " << (pass ? "ok" : "FAIL") << "\n";
  }
  std::cout << (all_pass ? "PASSED" : "FAILED") << "\n";
  return all_pass ? 0 : 1;
}

}  // namespace cli
}  // namespace normgrad
