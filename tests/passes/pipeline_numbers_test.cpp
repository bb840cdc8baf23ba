// The default pipeline over every graph in tests/data and examples/graphs and
// every case of the FileCheck pass tests (tests/passes/*.ngt, which check the
// structure each pass leaves): it must compile, and ref must give the same
// numbers with the pipeline and without it.
#include <filesystem>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/text_io.hpp>
#include <normgrad/passes/pass.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

const std::string kData = NORMGRAD_TEST_DATA;
const std::string kExamples = NORMGRAD_EXAMPLES;
const std::string kPassTests = NORMGRAD_PASS_TESTS;

// (name, graph) for every JSON graph and every text case.
std::vector<std::pair<std::string, StatusOr<Graph>>> all_graphs() {
  std::vector<std::pair<std::string, StatusOr<Graph>>> graphs;
  for (const std::string& dir : {kData, kExamples, kPassTests}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      const std::string p = e.path().string();
      if (e.path().extension() == ".json") graphs.emplace_back(p, load_graph(p));
      if (e.path().extension() != ".ngt") continue;
      auto text = read_text_file(p, size_t{1} << 20);
      if (!text.ok()) {
        graphs.emplace_back(p, text.status());
        continue;
      }
      for (const auto& [line, body] : split_text_cases(*text))
        graphs.emplace_back(p + ":" + std::to_string(line), graph_from_text(body));
    }
  }
  std::sort(graphs.begin(), graphs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return graphs;
}

TEST(PipelineNumbers, DefaultPipelineKeepsTheNumbersOnEveryGraph) {
  int graphs = 0;
  for (auto& [path, loaded] : all_graphs()) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    CompileOptions plain{"ref"};
    plain.optimize = false;
    auto before = CompiledGraph::compile(*loaded, plain);
    auto after = CompiledGraph::compile(*loaded, CompileOptions{"ref"});
    ASSERT_TRUE(before.ok()) << before.status().to_string();
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    auto inputs = oracle::make_inputs(before->graph(), before->lowered_graph(), "", 9, nullptr);
    ASSERT_TRUE(inputs.ok()) << inputs.status().to_string();
    auto a = testing_util::run_outputs(*before, *inputs);
    auto b = testing_util::run_outputs(*after, *inputs);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    for (const auto& [id, want] : *a) {
      const oracle::ErrorStats e = oracle::compare(b->at(id), want);
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
