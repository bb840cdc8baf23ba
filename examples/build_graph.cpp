// Example: build a BatchNormTrainingBackward graph in code, compile it, and
// execute it on your own buffers. Uses oneDNN's documented example values
// (NCX 1x1x2x2) and checks the result against them.
#include <cmath>
#include <cstdio>
#include <vector>

#include <normgrad/normgrad.hpp>

using namespace normgrad;

int main() {
  // Logical tensors: id, dtype, dims. The ids join ops into a graph.
  const Dims data = {1, 1, 2, 2};
  Op bn(0, OpKind::kBatchNormTrainingBackward, "bn_bwd");
  bn.set_attr("epsilon", 0.0f).set_attr("data_format", std::string("NCX"));
  bn.add_input(LogicalTensor(0, DataType::kF32, data))     // src
      .add_input(LogicalTensor(1, DataType::kF32, data))   // diff_dst
      .add_input(LogicalTensor(2, DataType::kF32, {1}))    // mean
      .add_input(LogicalTensor(3, DataType::kF32, {1}))    // variance
      .add_input(LogicalTensor(4, DataType::kF32, {1}));   // gamma
  bn.add_output(LogicalTensor(5, DataType::kF32, data))    // diff_src
      .add_output(LogicalTensor(6, DataType::kF32, {1}))   // diff_gamma
      .add_output(LogicalTensor(7, DataType::kF32, {1}));  // diff_beta

  Graph graph;
  if (Status s = graph.add_op(bn); !s.ok())
    return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  if (Status s = graph.finalize(); !s.ok())
    return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;

  auto compiled =
      CompiledGraph::compile(graph, CompileOptions{});  // auto: the fastest backend that accepts
  if (!compiled.ok()) return std::fprintf(stderr, "%s\n", compiled.status().to_string().c_str()), 1;
  for (const auto& p : compiled->partitions()) {
    std::printf("partition %lld: %s on %s (%s)\n", static_cast<long long>(p->partition().id),
                p->partition().ops_string().c_str(), p->backend_name(), p->kernel_name().c_str());
  }

  std::vector<float> src = {1, 2, 3, 4}, diff_dst = {0.1f, 0.1f, 0.2f, 0.2f};
  std::vector<float> mean = {2.5f}, variance = {1.25f}, gamma = {2.0f};
  std::vector<float> diff_src(4), diff_gamma(1), diff_beta(1);
  Status s =
      compiled->execute({{0, src.data()},
                         {1, diff_dst.data()},
                         {2, mean.data()},
                         {3, variance.data()},
                         {4, gamma.data()}},
                        {{5, diff_src.data()}, {6, diff_gamma.data()}, {7, diff_beta.data()}});
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;

  const float want[4] = {0.01788854f, -0.05366563f, 0.05366563f, -0.01788854f};
  bool ok =
      std::fabs(diff_gamma[0] - 0.17888544f) < 1e-6f && std::fabs(diff_beta[0] - 0.6f) < 1e-6f;
  for (int i = 0; i < 4; ++i) ok = ok && std::fabs(diff_src[i] - want[i]) < 1e-6f;
  std::printf("diff_src = {%.8f, %.8f, %.8f, %.8f}\ndiff_gamma = %.8f, diff_beta = %.8f\n%s\n",
              diff_src[0], diff_src[1], diff_src[2], diff_src[3], diff_gamma[0], diff_beta[0],
              ok ? "matches oneDNN's values" : "MISMATCH");
  return ok ? 0 : 1;
}
