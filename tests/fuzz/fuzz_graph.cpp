// libFuzzer target: oneDNN JSON through the loader, finalize, partitioning and
// compile, then execution of the small graphs on the default backends and ref.
#include <cstddef>
#include <cstdint>
#include <string>

#include <normgrad/graph/json_io.hpp>
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace normgrad;
  fuzz::set_small_limits();
  auto g = graph_from_json(std::string(reinterpret_cast<const char*>(data), size));
  if (!g.ok()) return 0;
  fuzz::compile_and_execute(std::move(g).value(), fuzz::input_seed(data, size));
  return 0;
}
