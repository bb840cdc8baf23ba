// libFuzzer target: JSON loader + finalize + partitioning + compile, with
// small resource limits so a hostile shape cannot make a huge allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/limits.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace normgrad;
  static const bool limited = [] {
    ResourceLimits l;
    l.max_tensor_bytes = 1 << 20;
    l.max_total_bytes = 8 << 20;
    l.max_ops = 64;
    l.max_json_bytes = 1 << 20;
    set_resource_limits(l);
    return true;
  }();
  (void)limited;
  auto g = graph_from_json(std::string(reinterpret_cast<const char*>(data), size));
  if (!g.ok()) return 0;
  if (!g->finalize().ok()) return 0;
  auto cg = CompiledGraph::compile(*g, CompileOptions{});
  (void)cg;
  return 0;
}
