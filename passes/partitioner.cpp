// Partitioner: the backends' patterns, matched in priority order.
#include <normgrad/passes/partitioner.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

Status plain_layouts(const Partition& p) {
  for (const Op& op : p.ops) {
    for (const auto* list : {&op.inputs(), &op.outputs()}) {
      for (const LogicalTensor& lt : *list) {
        if (lt.layout == LayoutType::kOpaque)
          return unimplemented("tensor " + std::to_string(lt.id) +
                               " has an opaque (backend-private) layout that normgrad cannot read");
      }
    }
  }
  return ok_status();
}

bool shapes_known(const Graph& graph, const Partition& p) {
  return std::all_of(p.ops.begin(), p.ops.end(),
                     [&](const Op& op) { return graph.unknown_shape_error(op).ok(); });
}

// Keeps the partition graph acyclic, so that the plan can run. Every unit
// (a partition, or an op not yet in one) has a position: a partition's is
// its last op's, a free op's its index in the topological order unless a
// candidate moved it (below). The invariant: a unit that reads another's
// output has the larger position. It holds for free ops (the graph's order);
// a candidate keeps it when every unit it reads from sits before its last op
// and every unit that reads it sits after. A reader that sits before it is
// moved after it, with every free op that reads onward from it up to there,
// in their order, when none of those is in a partition and none leads back
// into the candidate: the candidate is convex, and only the graph's
// arbitrary order put them first (two sibling batch norms far apart in it,
// one's diff_src read by a convolution's backward in between). Otherwise it
// is declined: a path that leaves the group and comes back (not convex), or
// a partition the plan would schedule before the one it reads. Declined
// ops run apart (or in another pattern's match), and the plan's order by
// position is a topological order. The cost is the candidate's edges, and
// for a move the ops between the candidate's ops, so matching stays linear
// in the graph for local patterns.
class UnitOrder {
 public:
  explicit UnitOrder(const Graph& graph) : graph_(graph) {}

  double position(int64_t op_id) const {
    const auto it = pos_.find(op_id);
    return it != pos_.end() ? it->second : static_cast<double>(graph_.order_of(op_id));
  }

  // OK, or why the candidate `ids` (free ops, in topological order) would
  // break the order; *moved: the free ops to move after it (in order).
  Status check(const std::vector<int64_t>& ids, const std::function<bool(int64_t)>& owned,
               std::vector<int64_t>* moved) const {
    moved->clear();
    const std::set<int64_t> inside(ids.begin(), ids.end());
    const double last = position(ids.back());
    const Op& last_op = *graph_.op(ids.back());
    std::vector<std::pair<int64_t, const Op*>> early;  // (tensor, reader) before `last`
    for (int64_t id : ids) {
      const Op& op = *graph_.op(id);
      for (const LogicalTensor& lt : op.inputs()) {
        const Op* from = graph_.producer(lt.id);
        if (from == nullptr || inside.count(from->id()) || position(from->id()) < last) continue;
        return declined(lt.id, *from, "is produced by", last_op);
      }
      for (const LogicalTensor& lt : op.outputs()) {
        for (const Use& u : graph_.uses(lt.id)) {
          const Op& to = *graph_.op(u.op_id);
          if (inside.count(u.op_id) || to.kind() == OpKind::kEnd || position(u.op_id) > last)
            continue;
          early.emplace_back(lt.id, &to);
        }
      }
    }
    if (early.empty()) return ok_status();
    // Every op reachable from the early readers before `last`: free, unmoved,
    // and none of the candidate's.
    const bool unmoved_candidate =
        std::all_of(ids.begin(), ids.end(), [&](int64_t id) { return !pos_.count(id); });
    // Each op reached carries the early reader it was reached from: a refusal
    // names that reader, the op that must run between the group's ops.
    std::set<int64_t> seen;
    std::vector<std::pair<const Op*, size_t>> stack;
    for (size_t k = 0; k < early.size(); ++k) {
      const Op& reader = *early[k].second;
      if (!unmoved_candidate || owned(reader.id()) || pos_.count(reader.id()))
        return declined(early[k].first, reader, "is read by", last_op);
      if (seen.insert(reader.id()).second) stack.emplace_back(&reader, k);
    }
    while (!stack.empty()) {
      const auto [op, root] = stack.back();
      stack.pop_back();
      for (const LogicalTensor& lt : op->outputs()) {
        for (const Use& u : graph_.uses(lt.id)) {
          const Op& to = *graph_.op(u.op_id);
          if (to.kind() == OpKind::kEnd || position(u.op_id) > last || seen.count(u.op_id))
            continue;
          if (inside.count(u.op_id) || owned(u.op_id) || pos_.count(u.op_id))
            return declined(early[root].first, *early[root].second, "is read by", last_op);
          seen.insert(u.op_id);
          stack.emplace_back(&to, root);
        }
      }
    }
    moved->assign(seen.begin(), seen.end());
    std::sort(moved->begin(), moved->end(),
              [&](int64_t a, int64_t b) { return graph_.order_of(a) < graph_.order_of(b); });
    return ok_status();
  }

  // Takes the candidate, and moves `moved` (check's) into (last, last + 1):
  // no unit sits there, since the candidate's ops were unmoved.
  void take(const std::vector<int64_t>& ids, const std::vector<int64_t>& moved) {
    const double last = position(ids.back());
    for (int64_t id : ids) pos_[id] = last;
    for (size_t k = 0; k < moved.size(); ++k)
      pos_[moved[k]] = last + static_cast<double>(k + 1) / static_cast<double>(moved.size() + 1);
  }

 private:
  Status declined(int64_t tensor, const Op& other, const char* how, const Op& last_op) const {
    return unimplemented("not convex: tensor " + std::to_string(tensor) + " " + how + " op " +
                         std::to_string(other.id()) + " (" + other.label() +
                         "), which must run between this group's ops (its last is op " +
                         std::to_string(last_op.id()) + ", " + last_op.label() +
                         "); fusing would make a cycle of partitions (rule: a partition's ops "
                         "have no path that leaves the group and comes back)");
  }

  const Graph& graph_;
  std::unordered_map<int64_t, double> pos_;
};

}  // namespace

Partition make_partition(const Graph& graph, const std::vector<int64_t>& op_ids) {
  Partition p;
  std::set<int64_t> inside_ops, produced, seen_in;
  p.ops.reserve(op_ids.size());
  for (int64_t id : op_ids) {
    const Op& op = *graph.op(id);
    p.ops.push_back(op);
    inside_ops.insert(id);
    for (const LogicalTensor& lt : op.outputs()) produced.insert(lt.id);
  }
  for (const Op& op : p.ops) {
    for (const LogicalTensor& lt : op.inputs()) {
      if (!produced.count(lt.id) && seen_in.insert(lt.id).second) p.inputs.push_back(lt);
    }
  }
  for (const Op& op : p.ops) {
    for (const LogicalTensor& lt : op.outputs()) {
      // Internal tensors stay inside; anything read outside (End included),
      // read by nobody, or an output port leaves. Linear in the partition,
      // so matching stays linear in the graph.
      const std::vector<Use> uses = graph.uses(lt.id);
      bool outside = is_output_port(graph, lt.id) || uses.empty() || p.ops.size() == 1;
      for (const Use& u : uses) outside = outside || !inside_ops.count(u.op_id);
      if (outside) p.outputs.push_back(lt);
    }
  }
  return p;
}

StatusOr<std::vector<Partition>> match_partitions(const Graph& graph,
                                                  const PartitionerOptions& options,
                                                  std::vector<PatternTrial>* trials) {
  if (!graph.finalized()) return invalid_graph("match_partitions: the graph is not finalized");
  const auto& ops = graph.ops();
  std::unordered_map<int64_t, size_t> owner;  // op id -> index into `found`
  owner.reserve(ops.size());
  std::vector<Partition> found;
  found.reserve(ops.size());
  std::unordered_map<int64_t, std::string> answers;  // op id -> what each pattern there said
  UnitOrder units(graph);
  auto note = [&](const Op& op, const Pattern& pattern, const Status& s,
                  const std::string& left_out = "") {
    if (trials) trials->push_back({op.id(), pattern.full_name(), s, left_out});
    if (!s.ok())
      answers[op.id()] += std::string(answers[op.id()].empty() ? "" : "; ") + pattern.full_name() +
                          ": " + s.message();
  };
  for (const Pattern& pattern : options.patterns) {
    if (pattern.fused && !options.fuse) continue;
    for (const Op& anchor : ops) {
      if (!pattern.anchored_at(anchor.kind()) || anchor.kind() == OpKind::kEnd ||
          op_kind_is_opaque(anchor.kind()) || owner.count(anchor.id()))
        continue;
      auto matched = pattern.match(graph, anchor);
      if (!matched.ok()) {
        note(anchor, pattern, matched.status());
        continue;
      }
      std::vector<int64_t> ids;
      for (const BoundOp& b : matched->ops) ids.push_back(b.op_id);
      std::string taken;
      for (int64_t id : ids) {
        if (owner.count(id)) taken = "op " + std::to_string(id) + " is in another partition";
      }
      if (!taken.empty()) {
        note(anchor, pattern, unimplemented(taken));
        continue;
      }
      // By position: the graph's order, or where an earlier candidate moved an op.
      std::sort(ids.begin(), ids.end(),
                [&](int64_t a, int64_t b) { return units.position(a) < units.position(b); });
      std::vector<int64_t> moved;
      const auto owned = [&](int64_t id) { return owner.count(id) != 0; };
      if (Status order = units.check(ids, owned, &moved); !order.ok()) {
        note(anchor, pattern, order);
        continue;
      }
      Partition p = make_partition(graph, ids);
      p.backend = pattern.backend;
      p.pattern = pattern.full_name();
      p.roles = matched->ops;
      Status s = plain_layouts(p);
      if (s.ok() && options.accept && shapes_known(graph, p)) s = options.accept(pattern, p);
      note(anchor, pattern, s, matched->note);
      if (!s.ok()) continue;
      for (int64_t id : ids) owner[id] = found.size();
      units.take(ids, moved);
      found.push_back(std::move(p));
    }
  }
  // Ops no pattern took: unsupported, one each.
  for (const Op& op : ops) {
    if (op.kind() == OpKind::kEnd || owner.count(op.id())) continue;
    Partition p = make_partition(graph, {op.id()});
    p.supported = false;
    p.reason = op_kind_is_opaque(op.kind())
                   ? std::string("normgrad has no kernel for ") + op.kind_spelling() +
                         " (an op kind it carries but does not run)"
               : answers.count(op.id())
                   ? "no pattern takes it (" + answers[op.id()] + ")"
                   : "no pattern of " + options.scope + " is anchored at " + op.kind_spelling();
    if (Status layout = plain_layouts(p); !layout.ok()) p.reason = layout.message();
    owner[op.id()] = found.size();
    found.push_back(std::move(p));
  }
  // Emitted by position (their last op's, or where a candidate moved them),
  // so their inputs are ready.
  std::vector<std::pair<double, size_t>> order;
  for (size_t k = 0; k < found.size(); ++k)
    order.emplace_back(units.position(found[k].ops.back().id()), k);
  std::sort(order.begin(), order.end());
  std::vector<Partition> parts;
  parts.reserve(order.size());
  for (const auto& entry : order) {
    parts.push_back(std::move(found[entry.second]));
    parts.back().id = static_cast<int64_t>(parts.size() - 1);
  }
  return parts;
}

Status check_partition_order(const Graph& graph, const std::vector<Partition>& parts) {
  std::unordered_map<int64_t, size_t> part_of;  // op id -> its partition's place in `parts`
  for (size_t k = 0; k < parts.size(); ++k) {
    for (const Op& op : parts[k].ops) part_of[op.id()] = k;
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    for (const LogicalTensor& lt : parts[k].inputs) {
      const Op* from = graph.producer(lt.id);
      if (from == nullptr) continue;
      const auto it = part_of.find(from->id());
      if (it != part_of.end() && it->second >= k)
        return internal_error("the partition graph has a cycle: partition " + std::to_string(k) +
                              " reads tensor " + std::to_string(lt.id) + " from partition " +
                              std::to_string(it->second) + " (op " + from->label() +
                              "), which cannot run before it");
    }
  }
  return ok_status();
}

StatusOr<Partition> match_whole(const Graph& graph, const PartitionerOptions& options,
                                std::vector<PatternTrial>* trials) {
  // The partitioner itself, with every candidate that leaves an op out declined.
  const auto all = std::count_if(graph.ops().begin(), graph.ops().end(),
                                 [](const Op& op) { return op.kind() != OpKind::kEnd; });
  PartitionerOptions whole = options;
  whole.accept = [&](const Pattern& pattern, const Partition& p) {
    if (static_cast<long>(p.ops.size()) != all)
      return unimplemented("it takes " + std::to_string(p.ops.size()) + " of the " +
                           std::to_string(all) + " ops");
    return options.accept ? options.accept(pattern, p) : ok_status();
  };
  NG_ASSIGN_OR_RETURN(std::vector<Partition> parts, match_partitions(graph, whole, trials));
  if (parts.size() == 1 && parts[0].is_supported()) return parts[0];
  std::string why;
  for (const Partition& p : parts) why += std::string(why.empty() ? "" : "; ") + p.reason;
  return unimplemented("no pattern takes these ops as one partition (" + why + ")");
}

}  // namespace normgrad
