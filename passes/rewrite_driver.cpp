// The greedy rewrite driver's worklist and the listener that feeds it.
#include <normgrad/passes/rewrite_driver.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <unordered_set>

namespace normgrad {
namespace {

// Ops to look at, each at most once at a time, in the order they came.
class Worklist final : public EditListener {
 public:
  explicit Worklist(const Graph& graph) : graph_(graph) {}

  void push(int64_t op_id) {
    if (queued_.insert(op_id).second) ids_.push_back(op_id);
  }
  bool empty() const { return ids_.empty(); }
  int64_t pop() {
    const int64_t id = ids_.front();
    ids_.pop_front();
    queued_.erase(id);
    return id;
  }

  void op_inserted(const Op& op) override { around(op); }
  void op_erased(const Op& gone) override { producers(gone); }  // may be dead now
  void op_replaced(const Op& old, const Op& now) override {
    producers(old);
    around(now);
  }
  void uses_replaced(int64_t from, int64_t to) override {
    if (const Op* p = graph_.producer(from)) push(p->id());
    readers(to);
  }

 private:
  void producers(const Op& op) {
    for (const LogicalTensor& lt : op.inputs()) {
      if (const Op* p = graph_.producer(lt.id)) push(p->id());
    }
  }
  void readers(int64_t tensor_id) {
    for (const Use& u : graph_.uses(tensor_id)) push(u.op_id);
  }
  void around(const Op& op) {
    push(op.id());
    producers(op);
    for (const LogicalTensor& lt : op.outputs()) readers(lt.id);
  }

  const Graph& graph_;
  std::deque<int64_t> ids_;
  std::unordered_set<int64_t> queued_;
};

// Restores the graph's listener however the driver leaves.
class Listening {
 public:
  Listening(Graph& graph, EditListener* listener)
      : graph_(graph), was_(graph.set_listener(listener)) {}
  ~Listening() { graph_.set_listener(was_); }
  Listening(const Listening&) = delete;
  Listening& operator=(const Listening&) = delete;

 private:
  Graph& graph_;
  EditListener* was_;
};

}  // namespace

StatusOr<bool> apply_patterns_greedily(Graph& graph, const std::vector<RewritePattern>& patterns,
                                       RewriteStats* stats, int64_t max_rewrites) {
  if (!graph.finalized())
    return invalid_graph("apply_patterns_greedily: the graph is not finalized");
  if (max_rewrites < 0) max_rewrites = 10 * static_cast<int64_t>(graph.ops().size()) + 1000;
  // Patterns by anchor kind, once, so a visit tries only the ones that apply.
  std::array<std::vector<const RewritePattern*>, static_cast<size_t>(OpKind::kCount)> by_kind;
  for (const RewritePattern& p : patterns) {
    for (size_t k = 0; k < by_kind.size(); ++k) {
      const bool anchored =
          p.anchors.empty() ||
          std::find(p.anchors.begin(), p.anchors.end(), static_cast<OpKind>(k)) != p.anchors.end();
      if (anchored) by_kind[k].push_back(&p);
    }
  }
  Worklist worklist(graph);
  for (const Op& op : graph.ops()) {
    if (!by_kind[static_cast<size_t>(op.kind())].empty()) worklist.push(op.id());
  }
  Listening listening(graph, &worklist);
  RewriteStats local;
  RewriteStats& st = stats ? *stats : local;
  bool changed = false;
  while (!worklist.empty()) {
    const int64_t id = worklist.pop();
    const Op* op = graph.op(id);
    if (op == nullptr) continue;  // erased since it was queued
    ++st.visits;
    for (const RewritePattern* p : by_kind[static_cast<size_t>(op->kind())]) {
      NG_ASSIGN_OR_RETURN(bool fired, p->rewrite(graph, *op));
      if (!fired) continue;
      changed = true;
      if (++st.rewrites > max_rewrites)
        return internal_error("rewrite pattern '" + p->name + "' still fires after " +
                              std::to_string(max_rewrites) +
                              " rewrites: the patterns do not converge");
      if (graph.op(id) != nullptr) worklist.push(id);  // other patterns may fire there now
      break;
    }
  }
  return changed;
}

}  // namespace normgrad
