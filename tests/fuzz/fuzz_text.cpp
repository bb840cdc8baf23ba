// libFuzzer target: normgrad's text IR (graph/text_io.hpp) through the parser,
// finalize, partitioning and compile, then execution of the small graphs.
// The seeds are the FileCheck cases of tests/passes/ (split at `// -----`
// or whole).
#include <cstddef>
#include <cstdint>
#include <string>

#include <normgrad/graph/text_io.hpp>
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace normgrad;
  fuzz::set_small_limits();
  const std::string text(reinterpret_cast<const char*>(data), size);
  // A file of several cases is parsed case by case, as `opt
  // --split-input-file` does, so the seeds exercise every case.
  for (const auto& [line, body] : split_text_cases(text)) {
    (void)line;
    auto g = graph_from_text(body);
    if (!g.ok()) continue;
    const std::string round_trip = graph_to_text(*g);  // the printer sees it too
    (void)round_trip;
    fuzz::compile_and_execute(std::move(g).value(), fuzz::input_seed(data, size));
  }
  return 0;
}
