// Graph-level input_ports / output_ports survive the pass pipeline.
//
// Canonicalisation drops inputs (TF V3's reserve_space_3, the single-output
// form's gamma); with oneDNN's `input_ports` listing them, the lowered graph
// once became invalid. Every example graph is run with explicit ports on every
// built backend, and its outputs compared with the same graph run without
// ports on ref (float64): the ports must change nothing but the interface.
#include <filesystem>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using oracle::Buffer;

struct Outputs {
  Status status = ok_status();
  std::map<int64_t, Buffer> buffers;
};

Outputs run_graph(const Graph& graph, const std::string& backend) {
  Outputs r;
  auto cg = CompiledGraph::compile(graph, CompileOptions{backend});
  if (!cg.ok()) return {cg.status(), {}};
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 7, &sources);
  if (!inputs.ok()) return {inputs.status(), {}};
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt : cg->outputs()) {
    auto b = oracle::allocate(lt);
    if (!b.ok()) return {b.status(), {}};
    out[lt.id] = r.buffers.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  r.status = cg->execute(in, out);
  return r;
}

TEST(GraphPorts, ExplicitPortsSurviveEveryPassOnEveryBackend) {
  int graphs = 0;
  for (const auto& e : std::filesystem::directory_iterator(NORMGRAD_EXAMPLES)) {
    if (e.path().extension() != ".json") continue;
    auto loaded = load_graph(e.path().string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    Graph plain = *loaded;
    ASSERT_TRUE(plain.finalize().ok());
    const Outputs want = run_graph(plain, "ref");
    ASSERT_TRUE(want.status.ok()) << e.path() << ": " << want.status.to_string();
    Graph ported = *loaded;
    std::vector<int64_t> in_ports, out_ports;
    for (const LogicalTensor& lt : plain.graph_inputs()) in_ports.push_back(lt.id);
    for (const LogicalTensor& lt : plain.graph_outputs()) out_ports.push_back(lt.id);
    ported.set_input_ports(in_ports);
    ported.set_output_ports(out_ports);
    ++graphs;
    for (const char* backend : {"auto", "ref", "dnnl", "jit"}) {
      if (std::string(backend) != "auto" && std::string(backend) != "ref" &&
          find_backend(backend) == nullptr)
        continue;
      const Outputs got = run_graph(ported, backend);
      // Only a forced oneDNN may decline (f16: oneDNN 2.6 has no f16 batch norm).
      if (std::string(backend) == "dnnl" && got.status.code() == StatusCode::kUnimplemented)
        continue;
      ASSERT_TRUE(got.status.ok())
          << e.path() << " on " << backend << ": " << got.status.to_string();
      // The interface is the user's: every port was accepted, every output written.
      ASSERT_EQ(got.buffers.size(), want.buffers.size()) << e.path();
      for (const auto& [id, buf] : want.buffers) {
        const oracle::ErrorStats err = oracle::compare(got.buffers.at(id), buf);
        EXPECT_LE(err.rel_l2,
                  oracle::threshold_for(buf.desc.dtype, oracle::reduction_length(plain, id)))
            << e.path() << " on " << backend << ", tensor " << id;
        EXPECT_EQ(err.nan_mismatch, 0);
      }
    }
  }
  EXPECT_GE(graphs, 8);  // V3 (reserve_space_3), single-output (gamma), gamma-less among them
}

}  // namespace
}  // namespace normgrad
