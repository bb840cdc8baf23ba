// PassPipeline: running, re-verifying, printing and timing passes; the default pipeline.
#include <normgrad/passes/pass.hpp>

#include <dlfcn.h>

#include <chrono>
#include <mutex>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/text_io.hpp>
#include <normgrad/passes/canonicalize.hpp>
#include <normgrad/passes/cse.hpp>
#include <normgrad/passes/dead_code.hpp>
#include <normgrad/passes/fold_layout.hpp>
#include <normgrad/passes/split_sync_batch_norm.hpp>

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
                                 std::vector<PassRecord>* records, bool as_text) const {
  if (!graph.finalized()) NG_RETURN_IF_ERROR(graph.finalize());
  bool any = false;
  for (const auto& pass : passes_) {
    const auto t0 = std::chrono::steady_clock::now();
    auto changed = pass->run(graph);
    if (!changed.ok()) return changed.status().with_context(std::string("pass ") + pass->name());
    // The rewriter's edits keep the graph finalized, each checking the ops
    // and tensors it touched, so only a pass that edited ops directly (and
    // left the graph un-finalized) needs the whole graph finalized again;
    // --verify-each checks everything after every pass.
    if (!graph.finalized()) {
      Status s = graph.finalize();
      if (!s.ok()) return s.with_context(std::string("after pass ") + pass->name());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    any = any || *changed;
    if (verify_each_) {
      NG_RETURN_IF_ERROR(graph.check_against_rebuild().with_context(
          std::string("--verify-each after pass ") + pass->name()));
    }
    if (records) records->push_back({pass->name(), *changed, ms});
    if (print_after_all)
      *print_after_all << "// after " << pass->name() << "\n"
                       << (as_text ? graph_to_text(graph) : graph_to_json(graph));
  }
  return any;
}

StatusOr<bool> run_to_fixed_point(Graph& graph, const std::function<StatusOr<bool>(Graph&)>& step,
                                  int max_steps) {
  bool changed = false;
  for (int i = 0; i < max_steps; ++i) {
    if (!graph.finalized()) NG_RETURN_IF_ERROR(graph.finalize());
    NG_ASSIGN_OR_RETURN(bool once, step(graph));
    if (!once) return changed;
    changed = true;
  }
  return internal_error("a rewrite still changed the graph after " + std::to_string(max_steps) +
                        " steps");
}

namespace {

class FixedPointPass final : public Pass {
 public:
  explicit FixedPointPass(std::unique_ptr<Pass> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  StatusOr<bool> run(Graph& graph) const override {
    return run_to_fixed_point(graph, [&](Graph& g) { return inner_->run(g); });
  }

 private:
  std::unique_ptr<Pass> inner_;
};

}  // namespace

std::unique_ptr<Pass> fixed_point(std::unique_ptr<Pass> inner) {
  return std::make_unique<FixedPointPass>(std::move(inner));
}

namespace {

struct UserPass {
  PassInfo info;
  PassFactory factory;
};

// User passes, guarded: registration may come from plugins loaded at any time.
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<UserPass>& user_passes() {
  static std::vector<UserPass> passes;
  return passes;
}

// A built-in pass, wrapped to run to a fixed point when passes.def says so.
template <typename Class>
std::unique_ptr<Pass> builtin(bool fixed) {
  std::unique_ptr<Pass> pass = std::make_unique<Class>();
  return fixed ? fixed_point(std::move(pass)) : std::move(pass);
}

std::unique_ptr<Pass> make_builtin(const std::string& name) {
#define NG_PASS(pass_name, Class, fixed, summary) \
  if (name == pass_name) return builtin<Class>(fixed);
#include <normgrad/passes/passes.def>
  return nullptr;
}

}  // namespace

std::vector<PassInfo> registered_passes() {
  std::vector<PassInfo> all = {
#define NG_PASS(pass_name, Class, fixed, summary) {pass_name, summary, true},
#include <normgrad/passes/passes.def>
  };
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const UserPass& u : user_passes()) all.push_back(u.info);
  return all;
}

Status register_pass(const std::string& name, const std::string& summary, PassFactory factory) {
  if (name.empty() || !factory)
    return invalid_argument("register_pass: a name and a factory are needed");
  for (const PassInfo& p : registered_passes()) {
    if (p.name == name)
      return invalid_argument("register_pass: pass '" + name + "' exists already");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  user_passes().push_back({{name, summary, false}, std::move(factory)});
  return ok_status();
}

StatusOr<std::unique_ptr<Pass>> make_pass(const std::string& name) {
  if (auto p = make_builtin(name)) return p;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (const UserPass& u : user_passes()) {
      if (u.info.name == name) {
        auto p = u.factory();
        if (!p) return internal_error("pass '" + name + "': its factory returned no pass");
        return p;
      }
    }
  }
  std::string known;
  for (const PassInfo& p : registered_passes()) known += (known.empty() ? "" : ", ") + p.name;
  return invalid_argument("unknown pass '" + name + "' (known: " + known + ")");
}

StatusOr<PassPipeline> make_pipeline(const std::vector<std::string>& names) {
  PassPipeline p;
  for (const std::string& n : names) {
    NG_ASSIGN_OR_RETURN(auto pass, make_pass(n));
    p.add(std::move(pass));
  }
  return p;
}

Status load_pass_plugin(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return not_found("pass plugin " + path + ": " + dlerror());
  using Register = Status (*)();
  auto reg = reinterpret_cast<Register>(dlsym(handle, "normgrad_register_passes"));
  if (reg == nullptr) {
    return invalid_argument("pass plugin " + path +
                            ": no extern \"C\" normgrad_register_passes() in it");
  }
  Status s = reg();  // the library stays loaded: its passes live in it
  return s.ok() ? s : s.with_context("pass plugin " + path);
}

}  // namespace normgrad
