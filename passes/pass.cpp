// PassPipeline: running, re-verifying, printing and timing passes; the default pipeline.
#include <normgrad/passes/pass.hpp>

#include <chrono>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/passes/canonicalize.hpp>
#include <normgrad/passes/cse.hpp>
#include <normgrad/passes/dead_code.hpp>
#include <normgrad/passes/fold_layout.hpp>
#include <normgrad/passes/fuse_elementwise.hpp>

namespace normgrad {

PassPipeline& PassPipeline::add(std::unique_ptr<Pass> pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

std::vector<std::string> PassPipeline::pass_names() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.emplace_back(p->name());
  return names;
}

StatusOr<bool> PassPipeline::run(Graph& graph, std::ostream* print_after_all,
                                 std::vector<PassRecord>* records) const {
  if (!graph.finalized()) NG_RETURN_IF_ERROR(graph.finalize());
  bool any = false;
  for (const auto& pass : passes_) {
    const auto t0 = std::chrono::steady_clock::now();
    auto changed = pass->run(graph);
    if (!changed.ok()) return changed.status().with_context(std::string("pass ") + pass->name());
    if (*changed || !graph.finalized()) {
      Status s = graph.finalize();
      if (!s.ok()) return s.with_context(std::string("after pass ") + pass->name());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    any = any || *changed;
    if (records) records->push_back({pass->name(), *changed, ms});
    if (print_after_all)
      *print_after_all << "// after " << pass->name() << "\n" << graph_to_json(graph);
  }
  return any;
}

// The order matters: canonical ops first, then conversions fold, dead outputs
// go (so fewer tensors are written), duplicates merge and dead ops go, and
// fusion groups are formed last, on the final graph.
PassPipeline default_pipeline() {
  PassPipeline p;
  for (const char* name : {"canonicalize", "fold-transpose", "fold-cast", "dead-output-elimination",
                           "cse", "dead-op-elimination", "fuse-elementwise"}) {
    p.add(std::move(make_pass(name)).value());
  }
  return p;
}

StatusOr<std::unique_ptr<Pass>> make_pass(const std::string& name) {
  std::unique_ptr<Pass> p;
  if (name == "canonicalize") p = std::make_unique<CanonicalizePass>();
  if (name == "fold-transpose") p = std::make_unique<FoldTransposePass>();
  if (name == "fold-cast") p = std::make_unique<FoldCastPass>();
  if (name == "dead-output-elimination") p = std::make_unique<DeadOutputEliminationPass>();
  if (name == "dead-op-elimination") p = std::make_unique<DeadOpEliminationPass>();
  if (name == "cse") p = std::make_unique<CsePass>();
  if (name == "fuse-elementwise") p = std::make_unique<FuseElementwisePass>();
  if (!p) {
    return invalid_argument(
        "unknown pass '" + name +
        "' (known: canonicalize, fold-transpose, fold-cast, dead-output-elimination, cse, "
        "dead-op-elimination, fuse-elementwise)");
  }
  return p;
}

}  // namespace normgrad
