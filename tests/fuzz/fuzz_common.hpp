// What the graph-producing fuzz targets share: small resource limits, so a
// hostile shape cannot make a huge allocation, and compile-then-execute, so
// the kernels (and ref) see the odd shapes, strides and attributes the
// fuzzer finds, not only the compiler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/limits.hpp>
#include <normgrad/testing/oracle.hpp>

namespace normgrad {
namespace fuzz {

// Graphs whose inputs and outputs together take at most this many bytes are
// executed: large enough for every walk (tails, several chunks per thread),
// small enough to keep thousands of executions per minute under ASan.
constexpr int64_t kExecuteBytes = 256 * 1024;

inline void set_small_limits() {
  static const bool done = [] {
    ResourceLimits l;
    l.max_tensor_bytes = 1 << 20;
    l.max_total_bytes = 8 << 20;
    l.max_ops = 64;
    l.max_json_bytes = 1 << 20;
    set_resource_limits(l);
    return true;
  }();
  (void)done;
}

// FNV-1a of the input: the seed of the random tensors, so a crash replays.
inline uint64_t input_seed(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

// Runs `cg` on random valid inputs (true batch statistics, as `run --check`
// makes them) when its tensors are small. Errors are fine: a kernel that
// refuses an input is not a bug here; a crash or a sanitizer report is.
inline void execute_small(const CompiledGraph& cg, uint64_t seed) {
  int64_t bytes = 0;
  for (const auto* list : {&cg.inputs(), &cg.outputs()}) {
    for (const LogicalTensor& lt : *list) {
      auto b = lt.buffer_bytes();
      if (!b.ok()) return;
      bytes += *b;
      if (bytes > kExecuteBytes) return;
    }
  }
  auto inputs = oracle::make_inputs(cg.graph(), cg.lowered_graph(), "", seed, nullptr);
  if (!inputs.ok()) return;
  std::map<int64_t, const void*> in_ptrs;
  for (auto& [id, buf] : *inputs) in_ptrs[id] = buf.data();
  std::map<int64_t, oracle::Buffer> outputs;
  std::map<int64_t, void*> out_ptrs;
  for (const LogicalTensor& lt : cg.outputs()) {
    auto b = oracle::allocate(lt);
    if (!b.ok()) return;
    out_ptrs[lt.id] = outputs.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  (void)cg.execute(in_ptrs, out_ptrs);
}

// Finalizes, compiles on the default backends and on ref, and executes both
// when small.
inline void compile_and_execute(Graph graph, uint64_t seed) {
  if (!graph.finalize().ok()) return;
  for (const char* backend : {"auto", "ref"}) {
    auto cg = CompiledGraph::compile(graph, CompileOptions{backend});
    if (cg.ok()) execute_small(*cg, seed);
  }
}

}  // namespace fuzz
}  // namespace normgrad
