// The fast JSON reader against the checked one: the same graph from every
// bundled file, and the same graph or the same error from thousands of
// single-byte mutations of oneDNN-style graphs.
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/json_scan.hpp>

#include <algorithm>
#include <filesystem>

#include "tests/test_util.hpp"

namespace normgrad {
namespace {

StatusOr<Graph> checked(const std::string& text) {
  JsonLimits limits;
  limits.fast_reader = false;
  return graph_from_json(text, limits);
}

// What a reader's answer says, for comparing two: the error, or the graph as
// the writer prints it with the root's fields the writer leaves out.
std::string answer(const StatusOr<Graph>& g) {
  if (!g.ok()) return "error: " + g.status().to_string();
  return g->version + "|" + g->engine_kind + "|" + g->fpmath_mode + "|" +
         g->fpmath_mode_apply_to_int.value_or("-") + "|" + graph_to_json(*g);
}

std::vector<std::string> bundled_graphs() {
  std::vector<std::string> files;
  for (const std::string dir : {NORMGRAD_TEST_DATA, NORMGRAD_EXAMPLES}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.path().extension() == ".json") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(JsonReaders, FastReaderTakesEveryBundledGraphAsTheCheckedOneDoes) {
  const auto files = bundled_graphs();
  ASSERT_GT(files.size(), 20u);
  size_t graphs = 0;
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const auto read = read_text_file(f, JsonLimits{}.max_bytes);
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    const std::string& text = *read;
    const auto slow = checked(text);
    EXPECT_EQ(answer(graph_from_json(text)), answer(slow));
    if (!slow.ok()) continue;
    ++graphs;
    // The fast reader itself took it (no fallback), into the same ops.
    Graph fast;
    std::string root;
    ASSERT_TRUE(scan_graph_json(text, 1000000, &fast, &root));
    // Its ops: the root's other members are the checked reader's to apply.
    auto ops = [](const Graph& g) {
      const std::string j = graph_to_json(g);
      return j.substr(j.find("\"graph\":"));
    };
    EXPECT_EQ(ops(fast), ops(*slow));
  }
  EXPECT_GT(graphs, 20u);
}

const char* kGraph = R"({
  "version": "3.1.0", "engine_kind": "cpu", "fpmath_mode": "strict",
  "fpmath_mode_apply_to_int": "false", "input_ports": [0, 1, 3, 4, 5], "output_ports": [6],
  "graph": [
    {"kind": "ReLUBackward", "name": "rb", "id": 7,
     "attrs": {"use_dst": {"value": 0, "type": "bool"}},
     "inputs": [
      {"id": 0, "dtype": "f32", "shape": [2, 3, 4, 5], "stride": [60, 20, 5, 1], "layout_type": "strided", "property_type": "undef"},
      {"id": 1, "dtype": "f32", "shape": [2, 3, 4, 5], "stride": [60, 20, 5, 1], "layout_type": "strided", "property_type": "undef"}],
     "outputs": [{"id": 2, "dtype": "f32", "shape": [-1, -1, -1, -1], "stride": [-9223372036854775808], "layout_type": "any", "property_type": "undef"}]},
    {"id": 8, "name": "bnb", "kind": "BatchNormTrainingBackward",
     "attrs": {"epsilon": {"type": "f32", "value": 1e-05}, "data_format": {"type": "string", "value": "NCX"}},
     "inputs": [
      {"id": 0, "dtype": "f32", "shape": [2, 3, 4, 5], "stride": [60, 20, 5, 1], "layout_type": "strided", "property_type": "undef"},
      {"id": 2, "dtype": "f32", "shape": [2, 3, 4, 5], "layout_type": "strided"},
      {"id": 3, "dtype": "f32", "shape": [3]},
      {"id": 4, "dtype": "f32", "shape": [3], "stride": [1]},
      {"id": 5, "dtype": "f32", "shape": [3], "property_type": "constant"}],
     "outputs": [
      {"id": 6, "dtype": "f32", "shape": [2, 3, 4, 5]},
      {"id": 9, "dtype": "f32", "shape": [3]},
      {"id": 10, "dtype": "f32", "shape": [3]}]}
  ]
})";

// Every single-byte deletion, duplication and replacement (by bytes that
// matter to JSON and to the checks) of a graph: the fast reader may give up,
// but where it answers, it answers as the checked reader does. A fast reader
// that took what the checked one refuses, or read a value differently, fails.
TEST(JsonReaders, EveryMutationGetsTheSameAnswerFromBothReaders) {
  const std::string base = kGraph;
  ASSERT_TRUE(checked(base).ok()) << checked(base).status().to_string();
  const std::string bytes = "\"\\,:{}[]0179-+.eE xt\x01\xc3";
  size_t accepted = 0, cases = 0;
  auto compare = [&](const std::string& text) {
    ++cases;
    const auto slow = checked(text);
    const auto fast = graph_from_json(text);
    accepted += slow.ok() ? 1 : 0;
    ASSERT_EQ(answer(fast), answer(slow)) << "text:\n" << text;
  };
  for (size_t p = 0; p < base.size(); ++p) {
    compare(std::string(base).erase(p, 1));
    compare(std::string(base).insert(p, 1, base[p]));
    for (char c : bytes) {
      if (c == base[p]) continue;
      std::string t = base;
      t[p] = c;
      compare(t);
    }
  }
  // Enough of the mutations are still graphs for the comparison to mean something.
  EXPECT_GT(accepted, cases / 50) << accepted << " of " << cases;
}

}  // namespace
}  // namespace normgrad
