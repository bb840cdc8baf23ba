// Every pass against hand-written golden graphs (tests/data/passes/NAME.in.json
// -> NAME.out.json, compared structurally), and the default pipeline over
// every graph in tests/data and examples/graphs: it must compile, and ref must
// give the same numbers with and without it.
#include <filesystem>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/passes/pass.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

const std::string kData = NORMGRAD_TEST_DATA;
const std::string kExamples = NORMGRAD_EXAMPLES;

// One line per op (by id): kind, name, attributes, ports with dtype and dims;
// then the output ports and the fusion groups.
std::string structure(const Graph& g) {
  std::map<int64_t, std::string> lines;
  for (const Op& op : g.ops()) {
    std::string s = std::string(op_kind_name(op.kind())) + " '" + op.name() + "' {";
    for (const auto& [k, v] : op.attrs()) s += k + "=" + attr_value_to_string(v) + ";";
    s += "} in:";
    for (const auto& t : op.inputs())
      s += " " + std::to_string(t.id) + ":" + dtype_name(t.dtype) + ":" + dims_to_string(t.dims);
    s += " out:";
    for (const auto& t : op.outputs())
      s += " " + std::to_string(t.id) + ":" + dtype_name(t.dtype) + ":" + dims_to_string(t.dims);
    lines[op.id()] = s;
  }
  std::string all;
  for (const auto& [id, s] : lines) all += std::to_string(id) + " " + s + "\n";
  if (g.output_ports()) {
    all += "output_ports:";
    for (int64_t p : *g.output_ports()) all += " " + std::to_string(p);
    all += "\n";
  }
  for (const auto& [op, anchor] : g.fusion_groups())
    all += "group " + std::to_string(op) + "->" + std::to_string(anchor) + "\n";
  return all;
}

Graph load_finalized(const std::string& path) {
  auto g = load_graph(path);
  EXPECT_TRUE(g.ok()) << path << ": " << g.status().to_string();
  if (!g.ok()) return Graph();
  Status s = g->finalize();
  EXPECT_TRUE(s.ok()) << path << ": " << s.to_string();
  return std::move(g).value();
}

TEST(PassGoldens, EachPassGivesTheExpectedGraph) {
  int cases = 0;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/passes")) {
    const std::string file = e.path().filename().string();
    if (file.size() < 8 || file.substr(file.size() - 8) != ".in.json") continue;
    const std::string name = file.substr(0, file.size() - 8);
    std::string pass_name = name.substr(0, name.find("_does_not"));
    std::replace(pass_name.begin(), pass_name.end(), '_', '-');
    if (pass_name == "dead-output" || pass_name == "dead-op") pass_name += "-elimination";
    SCOPED_TRACE(name + " (pass " + pass_name + ")");
    Graph in = load_finalized(e.path().string());
    const Graph want = load_finalized(kData + "/passes/" + name + ".out.json");
    auto pass = make_pass(pass_name);
    ASSERT_TRUE(pass.ok()) << pass.status().to_string();
    auto changed = (*pass)->run(in);
    ASSERT_TRUE(changed.ok()) << changed.status().to_string();
    ASSERT_TRUE(in.finalize().ok());
    EXPECT_EQ(*changed, name.find("_does_not") == std::string::npos);
    EXPECT_EQ(structure(in), structure(want));
    ++cases;
  }
  EXPECT_EQ(cases, 9);
}

std::vector<std::string> all_graphs() {
  std::vector<std::string> files;
  for (const std::string& dir : {kData, kExamples}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      const std::string p = e.path().string();
      if (e.path().extension() == ".json" && p.find(".out.json") == std::string::npos)
        files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(PassGoldens, DefaultPipelineKeepsTheNumbersOnEveryGraph) {
  int graphs = 0;
  for (const std::string& path : all_graphs()) {
    SCOPED_TRACE(path);
    auto loaded = load_graph(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    CompileOptions plain{"ref"};
    plain.optimize = false;
    auto before = CompiledGraph::compile(*loaded, plain);
    auto after = CompiledGraph::compile(*loaded, CompileOptions{"ref"});
    ASSERT_TRUE(before.ok()) << before.status().to_string();
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    std::map<int64_t, std::string> sources;
    auto inputs = oracle::make_inputs(before->graph(), before->lowered_graph(), "", 9, &sources);
    ASSERT_TRUE(inputs.ok()) << inputs.status().to_string();
    std::map<int64_t, const void*> in;
    for (auto& [id, b] : *inputs) in[id] = b.data();
    std::map<int64_t, oracle::Buffer> a, b;
    std::map<int64_t, void*> pa, pb;
    for (const LogicalTensor& lt : before->outputs()) {
      pa[lt.id] = a.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
      pb[lt.id] = b.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
    }
    ASSERT_TRUE(before->execute(in, pa).ok());
    ASSERT_TRUE(after->execute(in, pb).ok());
    for (const auto& [id, want] : a) {
      const oracle::ErrorStats e = oracle::compare(b.at(id), want);
      // The same maths, rounded in a different place at most (a folded cast rounds once).
      EXPECT_EQ(e.nan_mismatch, 0) << "tensor " << id;
      EXPECT_LE(e.rel_l2, oracle::threshold_for(want.desc.dtype, 0)) << "tensor " << id;
    }
    ++graphs;
  }
  EXPECT_GE(graphs, 20);
}

}  // namespace
}  // namespace normgrad
