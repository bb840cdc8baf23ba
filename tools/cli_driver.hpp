// benchdnn's graph driver, as `normgrad run` speaks it: batch files, comma
// lists, --reset, case paths, statuses and the summary
// (oneDNN's benchdnn documentation, "Graph Driver", tests/benchdnn/doc/driver_graph.md
// in the oneDNN repository).
//
// Global options survive --reset: --mode, --backend, -v/--verbose, --seed,
// --summary, --engine. Case knobs (cli_knobs.hpp) return to their defaults on
// --reset; a comma list in any of them expands into one case per value, the
// cartesian product taken in benchdnn's loop order (in-shapes, op-attrs,
// attr-fpmath, mb, then dt, op-kind, expected-n-partitions, tensor-property).
// --case and --batch paths resolve against the working directory first, then
// against the folder of each enclosing batch file and that folder's parents
// (benchdnn's inputs root), then $NORMGRAD_INPUTS_ROOT.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

#include "tools/cli_knobs.hpp"

namespace normgrad {
namespace cli {

// Options of `normgrad run` that are not case knobs.
struct RunOptions {
  Knobs knobs;
  bool check = false;
  int64_t iters = 1;
  int64_t threads = 0;
  int64_t seed = 1;
  // Added to every batch-norm src (data far from zero: statistics that
  // cancel show up).
  double data_offset = 0.0;
  // Ops normgrad carries but cannot run (convolutions, pooling, ...) are cut:
  // what they wrote becomes graph inputs with random data, so the rest runs.
  bool cut_unsupported = false;
  int verbose = 0;
  std::string engine = "cpu";
  std::string inputs_dir, outputs_dir;
};

enum class Outcome {
  kPassed,
  kExecuted,
  kFailed,
  kSkipped,
  kUnimplemented,
  kInvalidArguments,
};

struct CaseResult {
  Outcome outcome = Outcome::kPassed;
  std::string reason;
  double ms = 0.0;
};

// Runs one graph file with `opt` (defined in cli_run.cpp). `detailed` prints
// the graph, the partitions and the checks, as a single `run GRAPH` does.
CaseResult run_case(const std::string& path, const RunOptions& opt, bool detailed);
const char* outcome_name(Outcome o);

// A batch file's words: `#` starts a comment to the end of the line, and a
// word ending in a backslash goes on with the next word, as in benchdnn.
std::vector<std::string> batch_words(std::istream& in);
// "a,b,c" as {"a", "b", "c"}: one case knob's comma list.
std::vector<std::string> split_commas(const std::string& s);
// The same without empty items ("a,,b," -> a, b): comma-separated option lists.
std::vector<std::string> split_list(const std::string& s);
// The median of `v` (the mean of the middle two for an even count; 0 when empty).
double median_of(std::vector<double> v);

// The knobs `normgrad run` takes beside its CLI11 options (its --help footer).
std::string benchdnn_knobs_help();

class Driver {
 public:
  explicit Driver(RunOptions defaults);

  // Processes tokens in order (the command line, or a batch file's words).
  // False on a usage error, already reported on stderr.
  bool process(const std::vector<std::string>& tokens);
  // Prints benchdnn's summary (for --case/--batch runs) and returns the exit code.
  int finish();

 private:
  bool process_in(const std::vector<std::string>& tokens, int depth);
  bool set_global(const std::string& key, const std::string& value, bool* handled);
  std::string resolve(const std::string& path) const;
  void run_cases(const std::string& resolved, const std::string& shown, bool benchdnn);
  void record(const CaseResult& r, const std::string& repro, bool benchdnn);
  bool fail_arg(const std::string& msg);

  RunOptions defaults_, opt_;
  std::map<std::string, std::vector<std::string>> lists_;  // case knob -> values
  std::vector<std::string> batch_dirs_;                    // innermost last
  // Inside a batch file, the last knob that did not parse or is unknown: the
  // cases that follow, until --reset, are INVALID_ARGUMENTS with this reason
  // (benchdnn reports such a line and goes on to its summary).
  std::string invalid_knob_;
  int depth_ = 0;  // batch-file nesting of the tokens being processed
  std::string summary_ = "failures";
  bool benchdnn_ = false;
  int tests_ = 0, passed_ = 0, skipped_ = 0, failed_ = 0, unimplemented_ = 0, invalid_ = 0,
      listed_ = 0;
  std::vector<std::string> failures_;
  double start_ms_ = 0.0;
};

}  // namespace cli
}  // namespace normgrad
