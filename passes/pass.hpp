// Pass and PassPipeline: graph rewrites and the order they run in.
//
// A pass has a name and run(Graph&), which returns whether it changed the
// graph. The graph is finalized when a pass starts; the pipeline finalizes it
// again after every pass that changed it, which re-verifies every op against
// its schema and re-infers shapes, so a broken rewrite is caught at the pass
// that made it. The pipeline can print the graph (JSON) after every pass and
// records each pass's time.
#pragma once

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
  std::vector<std::string> pass_names() const;

  // Runs every pass in order. With `print_after_all`, writes
  // "// after <pass>" and the graph's JSON after each pass.
  StatusOr<bool> run(Graph& graph, std::ostream* print_after_all = nullptr,
                     std::vector<PassRecord>* records = nullptr) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
};

// The pipeline compile uses.
PassPipeline default_pipeline();
// A pass by name, for `--passes=`; lists the known names when `name` is unknown.
StatusOr<std::unique_ptr<Pass>> make_pass(const std::string& name);

}  // namespace normgrad
