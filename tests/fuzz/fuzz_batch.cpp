// libFuzzer target: benchdnn's batch-file syntax and graph-driver knobs as
// `normgrad run` reads them (tools/cli_driver.hpp, tools/cli_knobs.hpp): the
// words of a batch file, every knob value parsed, and each `--case=` rewritten
// by the knobs in force, then finalized, compiled and, when small, executed.
// Case files come from oneDNN's graphs in tests/data/onednn (a path outside
// that folder or missing there takes op/f32/bnorm_bwd.json), so the fuzzer
// never reads other files; `--batch=` is not followed.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <normgrad/graph/json_io.hpp>
#include "tests/fuzz/fuzz_common.hpp"
#include "tools/cli_driver.hpp"
#include "tools/cli_knobs.hpp"

namespace {

using namespace normgrad;

// Cases run per input, so one input with thousands of `--case=` words stays fast.
constexpr int kMaxCases = 8;

const std::string& case_text(const std::string& path) {
  static std::map<std::string, std::string> cache;
  const bool inside = path.find("..") == std::string::npos && !path.empty() && path[0] != '/';
  const std::string key = inside ? path : "op/f32/bnorm_bwd.json";
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // A regular file only: a folder (`--case=op/f32/`) is not read.
  const std::string file = std::string(NORMGRAD_FUZZ_CASES) + "/" + key;
  std::error_code ec;
  std::string text;
  if (std::filesystem::is_regular_file(file, ec)) {
    std::ifstream in(file);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.empty() && key != "op/f32/bnorm_bwd.json") return case_text("op/f32/bnorm_bwd.json");
  return cache.emplace(key, std::move(text)).first->second;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::set_small_limits();
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::map<std::string, std::vector<std::string>> lists;  // case knob -> values
  int cases = 0;
  for (const std::string& word : cli::batch_words(in)) {
    if (word.rfind("--", 0) != 0) continue;
    const size_t eq = word.find('=');
    const std::string key = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
    if (key == "reset") {
      lists.clear();
      continue;
    }
    if (key != "case") {
      if (cli::is_case_knob(key)) lists[key] = cli::split_commas(value);
      continue;
    }
    if (++cases > kMaxCases) break;
    // Every value is parsed; the case runs with the first of each list (the
    // driver's first case of the cartesian product).
    cli::Knobs knobs;
    bool valid = true;
    for (const auto& [k, values] : lists) {
      for (size_t i = 0; i < values.size(); ++i) {
        cli::Knobs probe;
        const bool ok = cli::parse_case_knob(k, values[i], i == 0 ? &knobs : &probe).ok();
        if (i == 0) valid = valid && ok;
      }
    }
    if (!valid) continue;
    auto g = graph_from_json(case_text(value));
    if (!g.ok() || !cli::apply_knobs(knobs, &*g).ok()) continue;
    fuzz::compile_and_execute(std::move(g).value(), fuzz::input_seed(data, size));
  }
  return 0;
}
