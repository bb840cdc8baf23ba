// `normgrad opt`, `normgrad partitions` and `normgrad dot`: the compiler's view
// of a graph, as mlir-opt and friends give it.
#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <normgrad/backends/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/passes/pass.hpp>
#include "tools/cli.hpp"

namespace normgrad {
namespace cli {
namespace {

int fail(const char* cmd, const Status& s) {
  std::cerr << "normgrad " << cmd << ": error: " << s.to_string() << "\n";
  return 2;
}

// Splits `--key=value` / `--key value` / `-o value` arguments; positional gets the rest.
bool parse(const std::vector<std::string>& argv, const std::vector<std::string>& flags,
           const std::vector<std::string>& valued, std::map<std::string, std::string>* opts,
           std::vector<std::string>* positional, std::string* error) {
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (a.rfind("-", 0) != 0) {
      positional->push_back(a);
      continue;
    }
    std::string key = a.substr(a.rfind("--", 0) == 0 ? 2 : 1), value;
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (std::find(valued.begin(), valued.end(), key) != valued.end()) {
      if (i + 1 >= argv.size()) return *error = "option " + a + " needs a value", false;
      value = argv[++i];
    }
    if (std::find(flags.begin(), flags.end(), key) == flags.end() &&
        std::find(valued.begin(), valued.end(), key) == valued.end()) {
      return *error = "unknown option " + a, false;
    }
    (*opts)[key] = value;
  }
  if (positional->size() != 1) return *error = "expected exactly one GRAPH.json", false;
  return true;
}

StatusOr<Graph> load_finalized(const std::string& path) {
  NG_ASSIGN_OR_RETURN(Graph g, load_graph(path));
  Status s = g.finalize();
  if (!s.ok()) return s.with_context(path);
  return g;
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

void print_opt_help() {
  std::cout << "usage: normgrad opt GRAPH.json [--passes=p1,p2,...] [--print-after-all] "
               "[-o OUT.json] [--load-pass-plugin=LIB.so]...\n\n"
               "Runs passes (the compile pipeline by default) and prints the graph.\n"
               "A plugin exports extern \"C\" normgrad::Status normgrad_register_passes(),\n"
               "which registers its passes by name with normgrad::register_pass.\n\npasses:\n";
  for (const PassInfo& p : registered_passes()) {
    std::cout << "  " << std::left << std::setw(26) << p.name << p.summary
              << (p.builtin ? "" : " (plugin)") << "\n";
  }
}

int opt_command(const std::vector<std::string>& raw_argv) {
  auto argv = load_plugins(raw_argv);
  if (!argv.ok()) return fail("opt", argv.status());
  for (const std::string& a : *argv) {
    if (a == "--help" || a == "-h") {
      print_opt_help();
      return 0;
    }
  }
  std::map<std::string, std::string> opts;
  std::vector<std::string> pos;
  std::string error;
  if (!parse(*argv, {"print-after-all"}, {"passes", "o"}, &opts, &pos, &error)) {
    std::cerr << "normgrad opt: " << error << "\n";
    return 2;
  }
  auto g = load_finalized(pos[0]);
  if (!g.ok()) return fail("opt", g.status());
  PassPipeline pipeline;
  if (opts.count("passes")) {
    std::stringstream ss(opts["passes"]);
    std::string name;
    while (std::getline(ss, name, ',')) {
      auto p = make_pass(name);
      if (!p.ok()) return fail("opt", p.status());
      pipeline.add(std::move(p).value());
    }
  } else {
    pipeline = default_pipeline();
  }
  std::vector<PassRecord> records;
  auto changed = pipeline.run(*g, opts.count("print-after-all") ? &std::cerr : nullptr, &records);
  if (!changed.ok()) return fail("opt", changed.status());
  for (const PassRecord& r : records) {
    std::cerr << "// pass " << r.name << ": " << (r.changed ? "changed" : "unchanged") << ", "
              << r.ms << " ms\n";
  }
  const std::string text = graph_to_json(*g, true);
  if (opts.count("o")) {
    std::ofstream out(opts["o"]);
    if (!(out << text)) return fail("opt", not_found(opts["o"] + ": cannot write"));
  } else {
    std::cout << text;
  }
  return 0;
}

int partitions_command(const std::vector<std::string>& argv) {
  std::map<std::string, std::string> opts;
  std::vector<std::string> pos;
  std::string error;
  if (!parse(argv, {"json", "explain"}, {"backend"}, &opts, &pos, &error)) {
    std::cerr << "normgrad partitions: " << error << "\n";
    return 2;
  }
  auto g = load_finalized(pos[0]);
  if (!g.ok()) return fail("partitions", g.status());
  CompileOptions options;
  options.allow_unsupported = true;
  if (opts.count("backend")) options.backend = opts["backend"];
  if (g->engine_kind != "cpu") {
    std::cerr << "normgrad partitions: note: the file names engine '" << g->engine_kind
              << "'; partitioning for the cpu\n";
  }
  auto cg = CompiledGraph::compile(*g, options);
  if (!cg.ok()) return fail("partitions", cg.status());
  // Compiled and pending partitions, back in graph order.
  struct Row {
    const Partition* p;
    const CompiledPartition* cp;
  };
  std::vector<Row> rows;
  for (const auto& p : cg->partitions()) rows.push_back({&p->partition(), p.get()});
  for (const Partition& p : cg->pending()) rows.push_back({&p, nullptr});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.p->id < b.p->id; });
  auto status_of = [](const Row& r) -> std::string {
    if (r.cp) return "supported";
    return r.p->is_supported() ? "supported, not compiled" : "unsupported";
  };
  if (opts.count("json")) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json j;
      j["id"] = r.p->id;
      std::vector<std::string> ops;
      for (const Op& op : r.p->ops) ops.push_back(op.kind_spelling());
      j["ops"] = ops;
      j["supported"] = r.p->is_supported();
      j["backend"] = r.cp ? r.cp->backend_name() : "";
      j["kernel"] = r.cp ? r.cp->kernel_name() : "";
      if (!r.cp) j["reason"] = r.p->reason;
      std::vector<int64_t> in, out;
      for (const auto& t : r.p->inputs) in.push_back(t.id);
      for (const auto& t : r.p->outputs) out.push_back(t.id);
      j["inputs"] = in;
      j["outputs"] = out;
      arr.push_back(j);
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  size_t unsupported = 0;
  for (const Row& r : rows) {
    std::cout << "partition " << r.p->id << ": " << r.p->ops_string() << "  " << status_of(r);
    if (r.cp) {
      std::cout << "  backend=" << r.cp->backend_name() << "  kernel=" << r.cp->kernel_name();
    } else {
      std::cout << "  (" << r.p->reason << ")";
      unsupported += r.p->is_supported() ? 0 : 1;
    }
    std::cout << "  inputs=" << tensor_list(r.p->inputs)
              << "  outputs=" << tensor_list(r.p->outputs) << "\n";
    if (opts.count("explain") && r.p->is_supported()) {
      // Every backend in auto's order, and what it said about this partition.
      for (const Backend* b : available_backends()) {
        const Status st = b->supports(*r.p, CompileContext{});
        std::cout << "    " << b->name() << ": "
                  << (st.ok() ? std::string("takes it") : "declines: " + st.message()) << "\n";
      }
    }
  }
  std::cout << rows.size() << " partitions: " << rows.size() - unsupported << " supported, "
            << unsupported << " unsupported\n";
  return 0;
}

int dot_command(const std::vector<std::string>& argv) {
  std::map<std::string, std::string> opts;
  std::vector<std::string> pos;
  std::string error;
  if (!parse(argv, {"after-passes"}, {}, &opts, &pos, &error)) {
    std::cerr << "normgrad dot: " << error << "\n";
    return 2;
  }
  auto g = load_finalized(pos[0]);
  if (!g.ok()) return fail("dot", g.status());
  if (opts.count("after-passes")) {
    auto changed = default_pipeline().run(*g);
    if (!changed.ok()) return fail("dot", changed.status());
  }
  auto parts = partition_graph(*g);
  if (!parts.ok()) return fail("dot", parts.status());
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
