// Example: a oneDNN-format (or TensorFlow-op) JSON graph through the whole
// compiler: CompiledGraph::compile runs the pass pipeline (canonicalize turns
// TensorFlow's FusedBatchNormGrad into BatchNormTrainingBackward, then the
// layout folds, CSE, dead-code elimination), partitions the lowered graph by
// the backends' patterns, compiles each partition, and execute() runs them in
// order on the caller's buffers.
//
//   example_compile_json_graph GRAPH.json
#include <cstdio>
#include <map>
#include <vector>

#include <normgrad/normgrad.hpp>

using namespace normgrad;

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s GRAPH.json\n", argv[0]), 2;
  auto loaded = load_graph(argv[1]);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 2;

  CompileOptions options;  // the default pipeline on "auto"; add your own by name:
  options.passes_after = {"cse"};
  auto cg = CompiledGraph::compile(*loaded, options);
  if (!cg.ok()) return std::fprintf(stderr, "%s\n", cg.status().to_string().c_str()), 1;

  std::printf("as written:");
  for (const Op& op : cg->graph().ops()) std::printf(" %s", op.kind_spelling());
  std::printf("\nafter the passes (canonicalize first):");
  for (const Op& op : cg->lowered_graph().ops()) std::printf(" %s", op.kind_spelling());
  std::printf("\n");
  for (const auto& p : cg->partitions()) {
    std::printf("partition %lld: %s on %s, kernel %s\n", static_cast<long long>(p->partition().id),
                p->partition().ops_string().c_str(), p->backend_name(), p->kernel_name().c_str());
  }

  // The caller's buffers, by tensor id: valid values for every input
  // (positive where an op reads a variance), room for every output.
  std::map<int64_t, std::vector<char>> storage;
  std::map<int64_t, const void*> in;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt : cg->inputs()) {
    auto& b = storage[lt.id];
    b.resize(static_cast<size_t>(*lt.buffer_bytes()) + 1);
    for (int64_t i = 0; i < *lt.buffer_elements(); ++i)
      store_from_double(b.data(), i, lt.dtype, 0.5 + 0.25 * static_cast<double>(i % 7));
    in[lt.id] = b.data();
  }
  for (const LogicalTensor& lt : cg->outputs()) {
    auto& b = storage[lt.id];
    b.resize(static_cast<size_t>(*lt.buffer_bytes()) + 1);
    out[lt.id] = b.data();
  }
  if (Status s = cg->execute(in, out); !s.ok())
    return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  for (const LogicalTensor& lt : cg->outputs()) {
    std::printf("output %lld (%s %s): first value %g\n", static_cast<long long>(lt.id),
                dtype_name(lt.dtype), dims_to_string(lt.dims).c_str(),
                *lt.element_count() ? load_as_double(out[lt.id], 0, lt.dtype) : 0.0);
  }
  return 0;
}
