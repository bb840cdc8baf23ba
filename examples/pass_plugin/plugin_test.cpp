// The plugin's own test: load it as normgrad would, run it through
// CompileOptions, and check the graph and the numbers.
#include <cstdio>
#include <cstring>

#include <normgrad/normgrad.hpp>

int main(int argc, char** argv) {
  using namespace normgrad;
  if (argc != 2) return 2;
  if (Status s = load_pass_plugin(argv[1]); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  // x (2x3) -> identity transpose -> ReLU -> y
  Graph g;
  Op t(0, OpKind::kStaticTranspose, "t");
  t.set_attr("order", std::vector<int64_t>{0, -1});
  t.add_input(LogicalTensor(0, DataType::kF32, {2, 3}))
      .add_output(LogicalTensor(1, DataType::kF32, {2, 3}));
  Op relu(1, OpKind::kReLU, "relu");
  relu.add_input(LogicalTensor(1, DataType::kF32, {2, 3}))
      .add_output(LogicalTensor(2, DataType::kF32, {2, 3}));
  if (!g.add_op(t).ok() || !g.add_op(relu).ok()) return 1;
  CompileOptions options;
  options.backend = "ref";
  options.passes_before = {"drop-identity-transpose"};
  auto cg = CompiledGraph::compile(g, options);
  if (!cg.ok()) {
    std::fprintf(stderr, "%s\n", cg.status().to_string().c_str());
    return 1;
  }
  if (cg->lowered_graph().ops().size() != 1) return 3;  // the transpose is gone
  const float x[6] = {-1, 2, -3, 4, -5, 6};
  float y[6] = {};
  if (!cg->execute({{0, x}}, {{2, y}}).ok()) return 1;
  const float want[6] = {0, 2, 0, 4, 0, 6};
  if (std::memcmp(y, want, sizeof y) != 0) return 4;
  std::printf("plugin ok: drop-identity-transpose removed 1 op, numbers unchanged\n");
  return 0;
}
