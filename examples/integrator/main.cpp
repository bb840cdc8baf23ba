// Consumer of an installed normgrad: version, a graph, a run on ref.
#include <cstdio>
#include <cstring>

#include <normgrad/normgrad.hpp>

int main() {
  using namespace normgrad;
  if (std::strcmp(version_string(), NORMGRAD_VERSION_STRING) != 0) return 1;
  Op relu(0, OpKind::kReLU, "relu");
  relu.add_input(LogicalTensor(0, DataType::kF32, {3}))
      .add_output(LogicalTensor(1, DataType::kF32, {3}));
  Graph g;
  if (!g.add_op(relu).ok()) return 1;
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  if (!cg.ok()) return 1;
  const float x[3] = {-1, 2, -3};
  float y[3] = {9, 9, 9};
  if (!cg->execute({{0, x}}, {{1, y}}).ok()) return 1;
  std::printf("consumer ok: normgrad %s relu -> %g %g %g\n", version_string(), y[0], y[1], y[2]);
  return y[0] == 0 && y[1] == 2 && y[2] == 0 ? 0 : 1;
}
