// `normgrad opt`, `normgrad partitions` and `normgrad dot`: the compiler's view
// of a graph, as mlir-opt and friends give it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/text_io.hpp>
#include <normgrad/passes/pass.hpp>
#include "tools/cli.hpp"
#include "tools/cli_args.hpp"

namespace normgrad {
namespace cli {
namespace {

int fail(const char* cmd, const Status& s) {
  std::cerr << "normgrad " << cmd << ": error: " << s.to_string() << "\n";
  return 2;
}

}  // namespace

// JSON when the text starts with '{' (after blanks and // comments), else the
// text form. Scanned in place: a network's file is tens of megabytes.
StatusOr<Graph> parse_graph(const std::string& text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    const size_t p = text.find_first_not_of(" \t\r", pos);
    if (p < eol && text.compare(p, 2, "//") != 0)
      return text[p] == '{' ? graph_from_json(text) : graph_from_text(text);
    pos = eol + 1;
  }
  return invalid_graph("the file holds no graph");
}

StatusOr<Graph> load_graph_file(const std::string& path) {
  NG_ASSIGN_OR_RETURN(std::string text, read_text_file(path, JsonLimits{}.max_bytes));
  auto g = parse_graph(text);
  if (!g.ok()) return g.status().with_context(path);
  return g;
}

namespace {

StatusOr<Graph> load_finalized(const std::string& path) {
  NG_ASSIGN_OR_RETURN(Graph g, load_graph_file(path));
  if (Status s = g.finalize(); !s.ok()) return s.with_context(path);
  return g;
}

// Runs `one` on each case of `path` (the whole file, or with `split` each
// `// -----` case), joining the outputs with the separator; errors name the
// file's line (blank lines in front keep the reader's line numbers the
// file's). Returns 2 when a case failed.
int for_each_case(const char* cmd, const std::string& path, bool split,
                  const std::function<Status(std::string&, std::string*)>& one, std::string* all) {
  auto text = read_text_file(path, JsonLimits{}.max_bytes);
  if (!text.ok()) return fail(cmd, text.status());
  // One copy of the text at a time (a 10^5-op JSON is over 100 MB).
  std::vector<std::pair<int, std::string>> cases;
  if (split) {
    cases = split_text_cases(*text);
  } else {
    cases.emplace_back(1, std::move(*text));
  }
  std::string().swap(*text);
  int rc = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string out;
    // Blank lines in front keep the case's line numbers in messages.
    std::string body =
        cases[i].first > 1
            ? std::string(static_cast<size_t>(cases[i].first - 1), '\n') + cases[i].second
            : std::move(cases[i].second);
    std::string().swap(cases[i].second);
    Status s = one(body, &out);
    if (!s.ok()) {
      std::cerr << "normgrad " << cmd << ": error: " << path << ": " << s.to_string() << "\n";
      rc = 2;
    }
    if (i == 0) {
      *all = std::move(out);  // a network's JSON is hundreds of megabytes: not copied
    } else {
      all->append("// -----\n").append(out);
    }
  }
  return rc;
}

std::string tensor_list(const std::vector<LogicalTensor>& ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "" : ",") + std::to_string(t.id);
  return s;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out;
}

}  // namespace

// Loads every --load-pass-plugin=LIB (repeatable) and returns the other arguments.
StatusOr<std::vector<std::string>> load_plugins(const std::vector<std::string>& argv) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string path;
    if (argv[i].rfind("--load-pass-plugin=", 0) == 0) {
      path = argv[i].substr(19);
    } else if (argv[i] == "--load-pass-plugin" && i + 1 < argv.size()) {
      path = argv[++i];
    } else {
      rest.push_back(argv[i]);
      continue;
    }
    NG_RETURN_IF_ERROR(load_pass_plugin(path));
  }
  return rest;
}

std::string passes_help() {
  std::ostringstream os;
  os << "A plugin exports extern \"C\" normgrad::Status normgrad_register_passes(),\n"
        "which registers its passes by name with normgrad::register_pass.\n\npasses:\n";
  for (const PassInfo& p : registered_passes()) {
    os << "  " << std::left << std::setw(26) << p.name << p.summary
       << (p.builtin ? "" : " (plugin)") << "\n";
  }
  return os.str();
}

namespace {

// A network's graph, and its compiled form, are millions of heap blocks, and
// freeing them at exit takes longer than printing them: a large one is kept,
// still reachable (leak checkers stay quiet), until the process ends, as
// clang's -disable-free does.
template <typename T>
void keep_until_exit(T value, size_t ops) {
  constexpr size_t kLargeOps = 10000;
  if (ops < kLargeOps) return;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  kept->push_back(std::make_shared<T>(std::move(value)));
}

// One case of `opt`: parse, finalize, run the pipeline, print.
Status opt_one(const std::string& text, const std::string& passes, bool passes_given,
               bool print_after_all, bool as_text, bool verbose, bool verify_each,
               std::string* out) {
  NG_ASSIGN_OR_RETURN(Graph g, parse_graph(text));
  NG_RETURN_IF_ERROR(g.finalize());
  // Named passes run exactly as listed; none given, the compile pipeline.
  PassPipeline pipeline;
  if (passes_given && passes != "none") {
    std::vector<std::string> names;
    std::stringstream ss(passes);
    for (std::string name; std::getline(ss, name, ',');) names.push_back(name);
    NG_ASSIGN_OR_RETURN(pipeline, make_pipeline(names));
  } else if (!passes_given) {
    NG_ASSIGN_OR_RETURN(pipeline, build_pipeline(CompileOptions{}));
  }
  if (verify_each) pipeline.set_verify_each(true);
  std::vector<PassRecord> records;
  NG_ASSIGN_OR_RETURN(bool changed,
                      pipeline.run(g, print_after_all ? &std::cerr : nullptr, &records, as_text));
  (void)changed;
  for (const PassRecord& r : records) {
    if (!verbose) break;
    std::cerr << "// pass " << r.name << ": " << (r.changed ? "changed" : "unchanged") << ", "
              << r.ms << " ms\n";
  }
  *out = as_text ? graph_to_text(g) : graph_to_json(g);
  const size_t ops = g.ops().size();
  keep_until_exit(std::move(g), ops);
  return ok_status();
}

// The process's rank when an MPI launcher started it (Open MPI, MPICH's
// Hydra, PMIx), read from the launcher's environment: opt, partitions and dot
// do not initialize MPI, and every rank would print the same graph.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

// Under mpirun, the graph tools print from rank 0 only: the other ranks do the
// same work (and exit with the same code) with their output discarded.
void quiet_unless_first_rank() {
  if (launcher_rank() == 0) return;
  if (std::freopen("/dev/null", "w", stdout) == nullptr ||
      std::freopen("/dev/null", "w", stderr) == nullptr) {
    return;  // keep printing rather than lose rank 0's view of an error
  }
}

}  // namespace

int opt_command(const std::vector<std::string>& raw_argv) {
  auto argv = load_plugins(raw_argv);
  if (!argv.ok()) return fail("opt", argv.status());
  CLI::App app(
      "Runs passes (the compile pipeline by default) over a graph (oneDNN JSON or the text "
      "form) and prints it.",
      "normgrad opt");
  app.footer(passes_help());
  std::string path, passes, out_path;
  bool print_after_all = false, as_text = false, split = false, verbose = false,
       verify_each = false;
  app.add_option("graph", path, "GRAPH.json, or a file in the text form")->required();
  auto* passes_opt = app.add_option("--passes", passes,
                                    "comma-separated pass names, or none (default: the pipeline)");
  app.add_flag("--print-after-all", print_after_all, "print the graph after every pass (stderr)");
  app.add_flag("--text", as_text,
               "print the text form (one op per line) instead of JSON, after every pass too");
  app.add_flag("--verify-each", verify_each,
               "check the whole graph against a fresh finalize after every pass (on in debug "
               "builds)");
  app.add_flag("--verbose", verbose,
               "say on stderr whether each pass changed the graph, and how "
               "long it took");
  app.add_flag("--split-input-file", split,
               "the file holds cases separated by '// -----'; each runs on its own");
  app.add_option("-o", out_path, "write to this file instead of stdout");
  app.add_option("--load-pass-plugin", "load passes from a shared library (repeatable)");
  if (int rc = parse_args(app, *argv); rc >= 0) return rc;
  quiet_unless_first_rank();
  std::string all;
  const int rc = for_each_case(
      "opt", path, split,
      [&](const std::string& body, std::string* out) {
        return opt_one(body, passes, passes_opt->count() > 0, print_after_all, as_text, verbose,
                       verify_each, out);
      },
      &all);
  if (!out_path.empty() && launcher_rank() == 0) {  // one writer of the file
    std::ofstream out(out_path);
    if (!(out << all)) return fail("opt", not_found(out_path + ": cannot write"));
  } else {
    std::cout << all;
  }
  return rc;
}

namespace {

// One graph's partitions, printed; returns the exit status.
Status print_partitions(Graph g, const std::string& backend, bool as_json, bool explain,
                        bool verify_each, std::string* out) {
  NG_RETURN_IF_ERROR(g.finalize());
  CompileOptions options;
  options.verify_each = verify_each;
  options.allow_unsupported = true;
  options.backend = backend;
  if (g.engine_kind != "cpu") {
    std::cerr << "normgrad partitions: note: the file names engine '" << g.engine_kind
              << "'; partitioning for the cpu\n";
  }
  // Handed over, not copied: one fewer of a large graph in memory.
  NG_ASSIGN_OR_RETURN(CompiledGraph cg, CompiledGraph::compile(std::move(g), options));
  // Compiled and pending partitions, back in graph order.
  struct Row {
    const Partition* p;
    const CompiledPartition* cp;
  };
  std::vector<Row> rows;
  for (const auto& p : cg.partitions()) rows.push_back({&p->partition(), p.get()});
  for (const Partition& p : cg.pending()) rows.push_back({&p, nullptr});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.p->id < b.p->id; });
  std::ostringstream o;
  if (as_json) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json j;
      j["id"] = r.p->id;
      std::vector<std::string> ops;
      for (const Op& op : r.p->ops) ops.push_back(op.kind_spelling());
      j["ops"] = ops;
      j["supported"] = r.p->is_supported();
      j["backend"] = r.cp ? r.cp->backend_name() : "";
      j["pattern"] = r.p->pattern;
      j["kernel"] = r.cp ? r.cp->kernel_name() : "";
      if (!r.cp) j["reason"] = r.p->reason;
      std::vector<int64_t> in, outs;
      for (const auto& t : r.p->inputs) in.push_back(t.id);
      for (const auto& t : r.p->outputs) outs.push_back(t.id);
      j["inputs"] = in;
      j["outputs"] = outs;
      arr.push_back(j);
    }
    *out = arr.dump(2) + "\n";
    rows.clear();
    const size_t cg_ops = cg.lowered_graph().ops().size();
    keep_until_exit(std::move(cg), cg_ops);
    return ok_status();
  }
  std::multimap<int64_t, const PatternTrial*> trials;  // by op, in the order tried
  for (const PatternTrial& t : cg.pattern_trials()) trials.emplace(t.op_id, &t);
  size_t unsupported = 0;
  for (const Row& r : rows) {
    o << "partition " << r.p->id << ": " << r.p->ops_string() << "  "
      << (r.cp                  ? "supported"
          : r.p->is_supported() ? "supported, not compiled"
                                : "unsupported");
    if (r.cp) {
      o << "  backend=" << r.cp->backend_name() << "  pattern=" << r.p->pattern
        << "  kernel=" << r.cp->kernel_name();
    } else {
      o << "  (" << r.p->reason << ")";
      unsupported += r.p->is_supported() ? 0 : 1;
    }
    o << "  inputs=" << tensor_list(r.p->inputs) << "  outputs=" << tensor_list(r.p->outputs)
      << "\n";
    if (!explain) continue;
    // Per op of the partition: every pattern anchored there, in priority
    // order, and what it answered (the last one that matched won); an op a
    // pattern anchored elsewhere took says so.
    for (const Op& op : r.p->ops) {
      if (op.id() != r.p->anchor() && r.p->anchor() >= 0) {
        std::string role;
        for (const BoundOp& b : r.p->roles)
          role = b.op_id == op.id() ? std::string(" as ") + fusion_role_name(b.role) : role;
        o << "    " << op.label() << ": taken by " << r.p->pattern << role << " (anchored at op "
          << r.p->anchor() << ")\n";
      }
      auto [first, last] = trials.equal_range(op.id());
      for (auto it = first; it != last; ++it) {
        const PatternTrial& t = *it->second;
        o << "    " << op.label() << ": " << t.pattern << ": "
          << (t.result.ok() ? "matched" + (t.note.empty() ? "" : " (" + t.note + ")")
                            : t.result.message())
          << "\n";
      }
    }
  }
  o << rows.size() << " partitions: " << rows.size() - unsupported << " supported, " << unsupported
    << " unsupported\n";
  *out = o.str();
  rows.clear();
  trials.clear();
  const size_t cg_ops = cg.lowered_graph().ops().size();
  keep_until_exit(std::move(cg), cg_ops);
  return ok_status();
}

}  // namespace

int partitions_command(const std::vector<std::string>& argv) {
  CLI::App app(
      "Lists the partitions of a graph (after the pass pipeline) with their ops, backend, "
      "pattern, kernel and tensors.",
      "normgrad partitions");
  std::string path, backend = "auto";
  bool as_json = false, explain = false, split = false, verify_each = false;
  app.add_option("graph", path, "GRAPH.json, or a file in the text form")->required();
  app.add_flag("--json", as_json, "print JSON");
  app.add_flag("--verify-each", verify_each,
               "check the whole graph against a fresh finalize after every pass");
  app.add_flag("--explain", explain, "per op, every pattern tried there and why it did not match");
  app.add_option("--backend", backend, backend_names_help())
      ->check(CLI::IsMember(known_backend_names()));
  app.add_flag("--split-input-file", split,
               "the file holds cases separated by '// -----'; each is partitioned on its own");
  if (int rc = parse_args(app, argv); rc >= 0) return rc;
  quiet_unless_first_rank();
  std::string all;
  const int rc = for_each_case(
      "partitions", path, split,
      [&](std::string& body, std::string* out) {
        NG_ASSIGN_OR_RETURN(Graph g, parse_graph(body));
        std::string().swap(body);  // the graph holds what is needed now
        return print_partitions(std::move(g), backend, as_json, explain, verify_each, out);
      },
      &all);
  std::cout << all;
  return rc;
}

int dot_command(const std::vector<std::string>& argv) {
  CLI::App app("Prints Graphviz: partitions as clusters, dtype and shape on the edges.",
               "normgrad dot");
  std::string path;
  bool after_passes = false;
  app.add_option("graph", path, "GRAPH.json, or a file in the text form")->required();
  app.add_flag("--after-passes", after_passes, "run the pipeline first (fused partitions)");
  if (int rc = parse_args(app, argv); rc >= 0) return rc;
  quiet_unless_first_rank();
  auto loaded = load_finalized(path);
  if (!loaded.ok()) return fail("dot", loaded.status());
  // After the passes: the plan compile and `partitions` use.
  auto plan = after_passes ? plan_graph(*loaded) : StatusOr<Plan>(Plan{*loaded, {}, {}});
  if (!plan.ok()) return fail("dot", plan.status());
  if (!after_passes) {
    auto parts = partition_graph(plan->lowered);
    if (!parts.ok()) return fail("dot", parts.status());
    plan->partitions = std::move(parts).value();
  }
  const Graph* g = &plan->lowered;
  const std::vector<Partition>* parts = &plan->partitions;
  std::ostringstream s;
  s << "digraph normgrad {\n  rankdir=TB;\n  node [shape=box, fontname=\"sans-serif\"];\n";
  std::map<int64_t, std::string> producer;  // tensor id -> node name
  for (const Op& op : g->ops()) {
    for (const auto& t : op.outputs()) producer[t.id] = "op" + std::to_string(op.id());
  }
  for (const Partition& p : *parts) {
    s << "  subgraph cluster_p" << p.id << " {\n    label=\"partition " << p.id
      << "\";\n    style=dashed;\n";
    for (const Op& op : p.ops) {
      s << "    op" << op.id() << " [label=\"" << escape(op.label()) << "\"];\n";
    }
    s << "  }\n";
  }
  for (const Op& op : g->ops()) {
    if (op.kind() == OpKind::kEnd) s << "  op" << op.id() << " [label=\"End\", shape=plaintext];\n";
  }
  for (const Op& op : g->ops()) {
    for (const auto& t : op.inputs()) {
      auto it = producer.find(t.id);
      std::string from = it != producer.end() ? it->second : "in" + std::to_string(t.id);
      if (it == producer.end())
        s << "  in" << t.id << " [label=\"input " << t.id << "\", shape=ellipse];\n";
      s << "  " << from << " -> op" << op.id() << " [label=\"" << t.id << ": "
        << dtype_name(t.dtype) << " " << dims_to_string(t.dims) << "\"];\n";
    }
  }
  for (const LogicalTensor& t : g->graph_outputs()) {
    s << "  out" << t.id << " [label=\"output " << t.id << "\", shape=ellipse];\n  "
      << producer[t.id] << " -> out" << t.id << " [label=\"" << t.id << ": " << dtype_name(t.dtype)
      << " " << dims_to_string(t.dims) << "\"];\n";
  }
  s << "}\n";
  std::cout << s.str();
  return 0;
}

}  // namespace cli
}  // namespace normgrad
