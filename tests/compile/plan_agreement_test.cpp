// compile, opt, dot and partitions show one plan: on every bundled example,
// every oneDNN graph under tests/data, and oneDNN's upstream graphs when
// NORMGRAD_ONEDNN_INPUTS names them, the commands' outputs agree with
// plan_graph (the lowered graph and its partitions).
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include "tests/test_util.hpp"
#include "tools/cli.hpp"

namespace normgrad {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> graph_files() {
  std::vector<std::string> roots = {NORMGRAD_EXAMPLES, NORMGRAD_TEST_DATA};
  if (const char* up = std::getenv("NORMGRAD_ONEDNN_INPUTS"); up != nullptr && fs::is_directory(up))
    roots.emplace_back(up);
  std::vector<std::string> files;
  for (const std::string& root : roots) {
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file() && e.path().extension() == ".json")
        files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A subcommand run in this process, its stdout captured (stderr dropped).
std::string run(int (*command)(const std::vector<std::string>&),
                const std::vector<std::string>& args, int* rc) {
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  *rc = command(args);
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return out.str();
}

// Partition id -> op ids, from `dot`'s clusters.
std::map<int64_t, std::set<int64_t>> dot_clusters(const std::string& dot) {
  std::map<int64_t, std::set<int64_t>> clusters;
  const std::regex cluster(R"(^  subgraph cluster_p(\d+) \{)"), op(R"(^    op(\d+) \[label)");
  int64_t current = -1;
  std::istringstream lines(dot);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, cluster)) {
      current = std::stoll(m[1]);
      clusters[current];
    } else if (current >= 0 && std::regex_search(line, m, op)) {
      clusters[current].insert(std::stoll(m[1]));
    } else if (line == "  }") {
      current = -1;
    }
  }
  return clusters;
}

TEST(PlanAgreement, CompileOptDotAndPartitionsShowOnePlan) {
  const std::vector<std::string> files = graph_files();
  ASSERT_GE(files.size(), 20u);
  size_t planned = 0;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    auto loaded = load_graph(path);
    if (!loaded.ok()) continue;  // a file the loader refuses is the loader tests' business
    auto plan = plan_graph(*loaded);
    int rc_parts = 0, rc_dot = 0, rc_opt = 0;
    const std::string parts = run(cli::partitions_command, {path, "--json"}, &rc_parts);
    const std::string dot = run(cli::dot_command, {path, "--after-passes"}, &rc_dot);
    const std::string opt = run(cli::opt_command, {path}, &rc_opt);
    EXPECT_EQ(rc_dot == 0, plan.ok()) << (plan.ok() ? "" : plan.status().message());
    EXPECT_EQ(rc_opt == 0, plan.ok());
    if (!plan.ok()) continue;
    ++planned;
    // opt prints the lowered graph.
    EXPECT_EQ(opt, graph_to_json(plan->lowered));
    // dot clusters the lowered graph's ops as the plan partitions them.
    std::map<int64_t, std::set<int64_t>> want;
    for (const Partition& p : plan->partitions) {
      for (const Op& op : p.ops) want[p.id].insert(op.id());
    }
    EXPECT_EQ(dot_clusters(dot), want);
    // partitions (through CompiledGraph, keeping what it cannot compile as
    // pending) lists the same partitions and ports.
    ASSERT_EQ(rc_parts, 0) << parts;
    const auto rows = nlohmann::json::parse(parts);
    ASSERT_EQ(rows.size(), plan->partitions.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      const Partition& p = plan->partitions[k];
      EXPECT_EQ(rows[k]["id"].get<int64_t>(), p.id);
      EXPECT_EQ(rows[k]["pattern"].get<std::string>(), p.pattern);
      std::vector<int64_t> in, out;
      for (const LogicalTensor& lt : p.inputs) in.push_back(lt.id);
      for (const LogicalTensor& lt : p.outputs) out.push_back(lt.id);
      EXPECT_EQ(rows[k]["inputs"].get<std::vector<int64_t>>(), in);
      EXPECT_EQ(rows[k]["outputs"].get<std::vector<int64_t>>(), out);
    }
  }
  EXPECT_GE(planned, 20u);
  std::cout << "plan agreement: " << planned << " of " << files.size()
            << " graphs planned and compared\n";
}

}  // namespace
}  // namespace normgrad
