// benchdnn's graph driver: tokens, batch files, comma lists, statuses, summary.
#include "tools/cli_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace normgrad {
namespace cli {
namespace {

namespace fs = std::filesystem;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// benchdnn's loop order for the graph driver, outermost first.
const char* const kListOrder[] = {
    "in-shapes", "op-attrs", "attr-fpmath",           "mb",
    "dt",        "op-kind",  "expected-n-partitions", "tensor-property"};

// benchdnn's timing, debug and implementation knobs: accepted, no effect.
const char* const kNoops[] = {"graph",
                              "max-ms-per-prb",
                              "fix-times-per-prb",
                              "allow-enum-tags-only",
                              "cold-cache",
                              "memory-kind",
                              "mode-modifier",
                              "perf-template",
                              "repeats-per-prb",
                              "canonical",
                              "cpu-isa-hints",
                              "mem-check",
                              "start",
                              "skip-impl",
                              "impl",
                              "global-impl",
                              "num-streams",
                              "execution-mode",
                              "attr-scratchpad"};

bool is_benchdnn_noop(const std::string& key) {
  for (const char* k : kNoops) {
    if (key == k) return true;
  }
  return false;
}

bool is_mode(const std::string& m) {
  return m == "C" || m == "P" || m == "CP" || m == "PC" || m == "R" || m == "L";
}

}  // namespace

std::string benchdnn_knobs_help() {
  std::string s =
      "benchdnn's graph-driver knobs, in any order, as on benchdnn's command line:\n"
      "  --case=GRAPH.json  --batch=FILE  --reset\n"
      "  --mode=C|P|CP|R|L  --backend=B  --seed=S  -v/--verbose[=N]  --summary=[no-]failures  "
      "--engine=cpu\n"
      "case knobs (comma lists, expanded in benchdnn's order):";
  for (const char* k : kListOrder) s += std::string(" --") + k;
  s += "\naccepted and ignored:";
  for (const char* k : kNoops) s += std::string(" --") + k;
  return s + "\n";
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPassed:
      return "PASSED";
    case Outcome::kExecuted:
      return "EXECUTED";
    case Outcome::kFailed:
      return "FAILED";
    case Outcome::kSkipped:
      return "SKIPPED";
    case Outcome::kUnimplemented:
      return "UNIMPLEMENTED";
    case Outcome::kInvalidArguments:
      return "INVALID_ARGUMENTS";
  }
  return "?";
}

Driver::Driver(RunOptions defaults) : defaults_(defaults), opt_(std::move(defaults)) {
  start_ms_ = now_ms();
}

bool Driver::fail_arg(const std::string& msg) {
  if (depth_ > 0) {  // a batch file's line: its cases say why, the batch goes on
    invalid_knob_ = msg;
    return true;
  }
  std::cerr << "normgrad run: " << msg << "\n";
  return false;
}

bool Driver::process(const std::vector<std::string>& tokens) {
  return process_in(tokens, 0);
}

// Global options: they survive --reset, as benchdnn's do.
bool Driver::set_global(const std::string& key, const std::string& value, bool* handled) {
  *handled = true;
  if (key == "mode") {
    std::string m;
    for (char c : value) m += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!is_mode(m))
      return fail_arg("--mode must be C, P, CP, R or L (any case), got '" + value + "'");
    opt_.knobs.mode = m == "PC" ? "CP" : m;
  } else if (key == "backend") {
    opt_.knobs.backend = value;
  } else if (key == "seed") {
    if (!parse_int(value, 0, INT64_MAX, &opt_.seed))
      return fail_arg("--seed must be a non-negative integer");
  } else if (key == "v" || key == "verbose") {
    int64_t v = 1;
    if (!value.empty() && !parse_int(value, 0, 10, &v))
      return fail_arg("-v/--verbose takes a level 0..10");
    opt_.verbose = static_cast<int>(v);
  } else if (key == "summary") {
    // benchdnn's [no-]failures and [no-]impl, comma-separated.
    for (const std::string& v : split_commas(value)) {
      const std::string w = v.rfind("no-", 0) == 0 ? v.substr(3) : v;
      if (w != "failures" && w != "impl")
        return fail_arg("--summary takes [no-]failures and [no-]impl, got '" + v + "'");
    }
    summary_ = value;
  } else if (key == "engine") {
    const std::string kind = value.substr(0, value.find(':'));
    if (kind != "cpu" && kind != "gpu") return fail_arg("--engine must be cpu or gpu[:N]");
    opt_.engine = kind;
  } else if (is_benchdnn_noop(key)) {
    // benchdnn's driver selector and its common timing/debug knobs: accepted;
    // normgrad has one driver, times with --iters and has no implementation list.
  } else {
    *handled = false;
  }
  return true;
}

std::string Driver::resolve(const std::string& path) const {
  std::error_code ec;
  if (fs::path(path).is_absolute() || fs::exists(path, ec)) return path;
  for (auto it = batch_dirs_.rbegin(); it != batch_dirs_.rend(); ++it) {
    fs::path dir = *it;
    for (int up = 0; up < 4 && !dir.empty(); ++up) {
      const fs::path candidate = dir / path;
      if (fs::exists(candidate, ec)) return candidate.string();
      if (!dir.has_parent_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  }
  if (const char* root = std::getenv("NORMGRAD_INPUTS_ROOT")) {
    const fs::path candidate = fs::path(root) / path;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return path;  // the error names the path as given
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts(1);
  for (char c : s) {
    if (c == ',') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  for (std::string& item : split_commas(s)) {
    if (!item.empty()) v.push_back(std::move(item));
  }
  return v;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<std::string> batch_words(std::istream& in) {
  std::vector<std::string> words;
  std::string line, pending;
  while (std::getline(in, line)) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string w;
    while (ls >> w) {
      // benchdnn's shell-style break: a word ending in a backslash goes
      // on with the next word (`--in-shapes=0:1x16,\` then `0:2x16`).
      if (w.back() == '\\') {
        pending += w.substr(0, w.size() - 1);
        continue;
      }
      words.push_back(pending + w);
      pending.clear();
    }
  }
  if (!pending.empty()) words.push_back(pending);
  return words;
}

bool Driver::process_in(const std::vector<std::string>& tokens, int depth) {
  depth_ = depth;
  for (const std::string& t : tokens) {
    if (t.rfind("-", 0) != 0) {  // a plain graph path: detailed runs
      run_cases(t, t, false);
      continue;
    }
    const std::string body = t.substr(t.rfind("--", 0) == 0 ? 2 : 1);
    const size_t eq = body.find('=');
    std::string key = body.substr(0, eq),
                value = eq == std::string::npos ? "" : body.substr(eq + 1);
    if (key.size() > 1 && key[0] == 'v' && std::isdigit(static_cast<unsigned char>(key[1]))) {
      value = key.substr(1);  // -v1
      key = "v";
    }
    if (key == "reset") {
      lists_.clear();  // case knobs only; globals stay
      invalid_knob_.clear();
      continue;
    }
    if (key == "case") {
      run_cases(resolve(value), value, true);
      continue;
    }
    if (key == "batch") {
      // A batch that cannot be read stops the run, inside a batch file too.
      if (depth > 4) return std::cerr << "normgrad run: --batch nests deeper than 4 files\n", false;
      const std::string path = resolve(value);
      std::ifstream in(path);
      if (!in) return std::cerr << "normgrad run: --batch: cannot open " << value << "\n", false;
      const std::vector<std::string> words = batch_words(in);
      batch_dirs_.push_back(fs::path(path).parent_path().string());
      const bool ok = process_in(words, depth + 1);
      depth_ = depth;
      batch_dirs_.pop_back();
      if (!ok) return false;
      continue;
    }
    bool handled = false;
    if (!set_global(key, value, &handled)) return false;
    if (handled) continue;
    if (!is_case_knob(key)) {
      if (!fail_arg("unknown option " + t)) return false;
      continue;
    }
    // On the command line a value that does not parse is a usage error (exit
    // 2). Inside a batch file the cases it applies to are INVALID_ARGUMENTS
    // (run_cases parses each case's knobs again) and the batch goes on to its
    // summary, as benchdnn's does.
    if (depth == 0) {
      for (const std::string& v : split_commas(value)) {
        Knobs probe;
        if (Status s = parse_case_knob(key, v, &probe); !s.ok()) return fail_arg(s.message());
      }
    }
    lists_[key] = split_commas(value);
  }
  return true;
}

void Driver::run_cases(const std::string& resolved, const std::string& shown, bool benchdnn) {
  benchdnn_ = benchdnn_ || benchdnn;
  // Odometer over the lists in benchdnn's order.
  std::vector<std::pair<std::string, const std::vector<std::string>*>> dims;
  for (const char* key : kListOrder) {
    if (auto it = lists_.find(key); it != lists_.end()) dims.emplace_back(key, &it->second);
  }
  std::vector<size_t> idx(dims.size(), 0);
  while (true) {
    RunOptions o = opt_;
    Status parsed = ok_status();
    for (size_t k = 0; k < dims.size() && parsed.ok(); ++k)
      parsed = parse_case_knob(dims[k].first, (*dims[k].second)[idx[k]], &o.knobs);
    const std::string repro = repro_line(o.knobs, shown, o.seed);
    CaseResult r;
    if (!invalid_knob_.empty()) {
      r = {Outcome::kInvalidArguments, invalid_knob_, 0.0};
    } else if (!parsed.ok()) {
      r = {Outcome::kInvalidArguments, parsed.to_string(), 0.0};
    } else if (o.engine != "cpu") {
      r = {Outcome::kSkipped, "engine '" + o.engine + "' is not available: normgrad runs on cpu",
           0.0};
    } else if (o.knobs.mode == "L") {
      ++listed_;
      std::cout << "run: " << repro << "\n";
    } else {
      r = run_case(resolved, o, !benchdnn || o.verbose >= 2);
    }
    if (o.knobs.mode != "L" || !parsed.ok() || !invalid_knob_.empty()) record(r, repro, benchdnn);
    size_t k = dims.size();
    while (k > 0) {
      --k;
      if (++idx[k] < dims[k].second->size()) break;
      idx[k] = 0;
      if (k == 0) return;
    }
    if (dims.empty()) return;
  }
}

void Driver::record(const CaseResult& r, const std::string& repro, bool benchdnn) {
  const int number = tests_++;
  switch (r.outcome) {
    case Outcome::kPassed:
    case Outcome::kExecuted:
      ++passed_;
      break;
    case Outcome::kSkipped:
      ++skipped_;
      break;
    case Outcome::kFailed:
      ++failed_;
      break;
    case Outcome::kUnimplemented:
      ++unimplemented_;
      break;
    case Outcome::kInvalidArguments:
      ++invalid_;
      break;
  }
  if (benchdnn) {
    std::ostringstream line;
    line << number << ":" << outcome_name(r.outcome);
    if (!r.reason.empty()) line << " (" << r.reason << ")";
    line << " (" << std::fixed << std::setprecision(3) << r.ms << " ms) __REPRO: " << repro;
    // One line per case as it ends, piped or not (benchdnn flushes each too).
    std::cout << line.str() << std::endl;
    if (r.outcome == Outcome::kFailed || r.outcome == Outcome::kInvalidArguments ||
        r.outcome == Outcome::kUnimplemented)
      failures_.push_back(std::to_string(number) + ":" + outcome_name(r.outcome) +
                          " __REPRO: " + repro);
    return;
  }
  if (r.outcome != Outcome::kPassed && r.outcome != Outcome::kExecuted) {
    std::cerr << "normgrad run: "
              << (r.outcome == Outcome::kUnimplemented ? "UNIMPLEMENTED: "
                  : r.outcome == Outcome::kFailed && r.reason.find(':') == std::string::npos
                      ? "check failed: "
                      : "error: ")
              << r.reason << "\n";
  }
}

int Driver::finish() {
  if (benchdnn_) {
    if (!failures_.empty() && summary_.find("no-failures") == std::string::npos) {
      std::cout << "===========================================================\n"
                << "= Failed cases summary (--summary=no-failures to disable) =\n"
                << "===========================================================\n";
      for (size_t i = 0; i < failures_.size() && i < 10; ++i) std::cout << failures_[i] << "\n";
      if (failures_.size() > 10)
        std::cout << "... and " << failures_.size() - 10 << " more failed cases\n";
      std::cout << "============================\n";
    }
    std::cout << "tests:" << tests_ << " passed:" << passed_ << " skipped:" << skipped_
              << " mistrusted:0 unimplemented:" << unimplemented_
              << " invalid_arguments:" << invalid_ << " failed:" << failed_ << " listed:" << listed_
              << "\n";
    std::cout << "total: " << std::fixed << std::setprecision(2) << (now_ms() - start_ms_) / 1000.0
              << "s;\n";
    return failed_ + invalid_ + unimplemented_ > 0 ? 1 : 0;
  }
  // One graph: a rule broken is a usage error (2); a failed check or ops we
  // cannot run (benchdnn's UNIMPLEMENTED) is 1.
  if (invalid_ > 0) return 2;
  return failed_ + unimplemented_ > 0 ? 1 : 0;
}

}  // namespace cli
}  // namespace normgrad
