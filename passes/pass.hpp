// Pass and PassPipeline: graph rewrites and the order they run in.
//
// A pass has a name and run(Graph&), which returns whether it changed the
// graph. The graph is finalized when a pass starts. A pass edits through the
// rewriter (graph.hpp), whose every edit checks the ops and tensors it
// touches and keeps the graph finalized, so a broken rewrite is caught at the
// edit that made it; the pipeline finalizes the whole graph again only after
// a pass that left it un-finalized, and with --verify-each checks it all
// after every pass. The pipeline can print the graph after every pass and
// records each pass's time.
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual StatusOr<bool> run(Graph& graph) const = 0;
};

struct PassRecord {
  std::string name;
  bool changed = false;
  double ms = 0.0;
};

class PassPipeline {
 public:
  PassPipeline& add(std::unique_ptr<Pass> pass);
  // After every pass, the graph's maps against a finalize from scratch
  // (Graph::check_against_rebuild): on by default in debug builds.
  PassPipeline& set_verify_each(bool on) {
    verify_each_ = on;
    return *this;
  }
  std::vector<std::string> pass_names() const;

  // Runs every pass in order. With `print_after_all`, writes
  // "// after <pass>" and the graph after each pass: JSON, or the text form
  // with `as_text`.
  StatusOr<bool> run(Graph& graph, std::ostream* print_after_all = nullptr,
                     std::vector<PassRecord>* records = nullptr, bool as_text = false) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
#ifdef NDEBUG
  bool verify_each_ = false;
#else
  bool verify_each_ = true;
#endif
};

// Runs `step` until it reports no change (XLA's HloPassFix): the graph is
// finalized before every step, so each sees valid producers and consumers.
// Returns whether any step changed the graph; a step that keeps reporting a
// change past `max_steps` is an internal error, not a hang.
StatusOr<bool> run_to_fixed_point(Graph& graph, const std::function<StatusOr<bool>(Graph&)>& step,
                                  int max_steps = 10000);
// A pass that runs `inner` to a fixed point, named "<inner>" (for user pipelines).
std::unique_ptr<Pass> fixed_point(std::unique_ptr<Pass> inner);

// Pass registry: the built-in passes (passes/passes.def) plus the ones a user
// registers by name, explicitly (a plugin does it from its exported
// `normgrad_register_passes`, see load_pass_plugin). No static initialisers.
using PassFactory = std::function<std::unique_ptr<Pass>()>;
struct PassInfo {
  std::string name;
  std::string summary;
  bool builtin = true;
};
// Registers a user pass; a name already taken (built-in or user) is an error.
Status register_pass(const std::string& name, const std::string& summary, PassFactory factory);
// Every pass that make_pass knows, built-in ones first.
std::vector<PassInfo> registered_passes();
// A pass by name, for `--passes=` and CompileOptions; lists the known names when unknown.
StatusOr<std::unique_ptr<Pass>> make_pass(const std::string& name);
// A pipeline of passes by name.
StatusOr<PassPipeline> make_pipeline(const std::vector<std::string>& names);
// dlopen()s a shared library and calls its
//   extern "C" normgrad::Status normgrad_register_passes();
// which registers its passes with register_pass (mlir-opt's --load-pass-plugin).
Status load_pass_plugin(const std::string& path);

}  // namespace normgrad
