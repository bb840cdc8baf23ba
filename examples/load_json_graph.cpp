// Example: load a graph in oneDNN's JSON format, compile its partitions one by
// one, and execute each on user buffers (usage: load_json_graph GRAPH.json).
#include <cstdio>
#include <map>
#include <vector>

#include <normgrad/normgrad.hpp>

using namespace normgrad;

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s GRAPH.json\n", argv[0]), 2;
  auto loaded = load_graph(argv[1]);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 2;
  Graph graph = std::move(loaded).value();
  if (Status s = graph.finalize(); !s.ok())
    return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 2;
  std::printf("normgrad %s: %zu ops\n", version_string(), graph.ops().size());

  // Buffers for every tensor, owned here. Inputs get simple valid values:
  // positive where an op reads a variance, small elsewhere.
  std::map<int64_t, std::vector<char>> buffers;
  auto buffer_for = [&](const LogicalTensor& lt) -> void* {
    auto& b = buffers[lt.id];
    if (b.empty()) b.resize(static_cast<size_t>(*lt.buffer_bytes()) + 1);
    return b.data();
  };
  for (const LogicalTensor& lt : graph.graph_inputs()) {
    void* p = buffer_for(lt);
    const int64_t n = *lt.buffer_elements();
    for (int64_t i = 0; i < n; ++i)
      store_from_double(p, i, lt.dtype, 0.5 + 0.25 * static_cast<double>(i % 7));
  }

  // The graph is finalized, so it is run here without passes: canonical oneDNN graphs need none.
  auto parts = partition_graph(graph);
  if (!parts.ok()) return std::fprintf(stderr, "%s\n", parts.status().to_string().c_str()), 1;
  for (const Partition& p : *parts) {
    auto cp = compile_partition(p, CompileOptions{});
    if (!cp.ok()) return std::fprintf(stderr, "%s\n", cp.status().to_string().c_str()), 1;
    std::vector<Tensor> in, out;
    for (const LogicalTensor& lt : p.inputs) in.push_back({lt, buffer_for(lt)});
    for (const LogicalTensor& lt : p.outputs) out.push_back({lt, buffer_for(lt)});
    if (Status s = (*cp)->execute(in, out); !s.ok())
      return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
    std::printf("partition %lld %s: backend %s, kernel %s\n", static_cast<long long>(p.id),
                p.ops_string().c_str(), (*cp)->backend_name(), (*cp)->kernel_name().c_str());
  }
  for (const LogicalTensor& lt : graph.graph_outputs()) {
    std::printf("output %lld (%s %s): first value %g\n", static_cast<long long>(lt.id),
                dtype_name(lt.dtype), dims_to_string(lt.dims).c_str(),
                *lt.element_count() ? load_as_double(buffer_for(lt), 0, lt.dtype) : 0.0);
  }
  return 0;
}
