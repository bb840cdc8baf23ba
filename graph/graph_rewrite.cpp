// The rewriter API of Graph: erase, insert, replace ops and uses by id.
//
// Each edit changes ops_ and, on a finalized graph, updates the tensor table
// and the producer/consumer maps for the ops it touches (link, unlink and
// prune in graph.cpp: the cost of the edit, not of the graph; no sort, no
// shape inference), and checks that every read still follows its write, so
// the graph stays finalized and every query answers for the graph as it now
// is. An edit that fails its checks is undone, and only then are the maps
// rebuilt from the ops (linear), to restore exactly the graph before it.
// Inserting or erasing moves no other op (OpList: a linked list with order
// keys), so an edit costs its own ports and the uses of the tensors they name.
#include <normgrad/graph/graph.hpp>

#include <algorithm>
#include <cassert>
#include <utility>
#include <vector>

#include <normgrad/graph/op_checks.hpp>

namespace normgrad {

Status Graph::reindex(const std::string& edit) {
  if (!finalized_) return ok_status();
  finalized_ = false;  // until the maps are whole again
  Status s = collect_tensors();
  if (!s.ok()) return s.with_context(edit);
  for (const Op& op : ops_) {
    for (const LogicalTensor& lt : op.inputs()) {
      if (producer_order(lt.id) >= ops_.order(op.id())) {
        return invalid_graph(edit + ": " + op.label() + " would read tensor " +
                             std::to_string(lt.id) + " before " +
                             producer_op(values_.at(lt.id)).label() + " writes it");
      }
    }
  }
  finalized_ = true;
  return ok_status();
}

// On a finalized graph, a tensor an edit brings in must come with its shape,
// so every query between edits answers with complete metadata; a tensor the
// graph already has keeps what finalize inferred for it.
Status Graph::check_new_tensors(const Op& op, const std::string& edit) const {
  if (!finalized_) return ok_status();
  for (const auto* ports : {&op.inputs(), &op.outputs()}) {
    for (const LogicalTensor& lt : *ports) {
      if (values_.count(lt.id) == 0 && !lt.dims_known())
        return invalid_graph(edit + ": " + op.label() + " brings in tensor " +
                             std::to_string(lt.id) +
                             " of unknown shape (give new tensors their shapes)");
    }
  }
  return ok_status();
}

namespace {

// Undoes a failed edit: `restore` puts ops_ back, then the maps are rebuilt.
template <typename Restore>
Status undo(Status why, Restore&& restore) {
  restore();
  return why;
}

}  // namespace

Status Graph::erase_op(int64_t op_id) {
  const Op* found = ops_.find(op_id);
  if (found == nullptr) return not_found("erase_op: no op " + std::to_string(op_id));
  const Op& op = *found;
  for (const LogicalTensor& lt : op.outputs()) {
    for (const Use& u : uses(lt.id)) {
      if (u.op_id != op_id)
        return invalid_graph("erase_op: " + this->op(u.op_id)->label() + " still reads tensor " +
                             std::to_string(lt.id) + " of " + op.label());
    }
  }
  return cut_op(op_id);
}

Status Graph::cut_op(int64_t op_id) {
  if (ops_.find(op_id) == nullptr) return not_found("cut_op: no op " + std::to_string(op_id));
  Op gone = ops_.erase(op_id);
  if (finalized_) {
    unlink(gone);
    prune(gone);
  }
  if (listener_) listener_->op_erased(gone);
  return ok_status();
}

Status Graph::insert_op(Op op, int64_t before_op_id) {
  NG_RETURN_IF_ERROR(verify_op_structure(op));
  NG_RETURN_IF_ERROR(check_new_tensors(op, "insert_op"));
  if (ops_.find(op.id()) != nullptr)
    return invalid_graph("insert_op: op id " + std::to_string(op.id()) + " is already used");
  if (before_op_id >= 0 && ops_.find(before_op_id) == nullptr)
    return not_found("insert_op: no op " + std::to_string(before_op_id));
  if (ids_seen_) see_op_ids(op);
  const int64_t id = op.id();
  const Op& added =
      before_op_id >= 0 ? ops_.insert(std::move(op), before_op_id) : ops_.push_back(std::move(op));
  Status s = finalized_ ? link(added, "insert_op") : ok_status();
  if (s.ok() && finalized_) s = check_order(added, "insert_op");
  if (s.ok()) {
    if (listener_) listener_->op_inserted(added);
    return s;
  }
  return undo(s, [&] {
    ops_.erase(id);
    Status back = reindex("insert_op");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

Status Graph::replace_op(int64_t op_id, Op replacement) {
  NG_RETURN_IF_ERROR(verify_op_structure(replacement));
  NG_RETURN_IF_ERROR(check_new_tensors(replacement, "replace_op"));
  if (ops_.find(op_id) == nullptr) return not_found("replace_op: no op " + std::to_string(op_id));
  if (replacement.id() != op_id && ops_.find(replacement.id()) != nullptr)
    return invalid_graph("replace_op: op id " + std::to_string(replacement.id()) +
                         " is already used");
  if (ids_seen_) see_op_ids(replacement);
  const int64_t id = replacement.id();
  Op old = ops_.replace(op_id, std::move(replacement));
  const Op& now = *ops_.find(id);
  Status s = ok_status();
  if (finalized_) {
    // A tensor only the old op named leaves first: the replacement's metadata
    // for it is then the whole truth, as a rebuild from the ops would have it.
    unlink(old);
    prune(old);
    s = link(now, "replace_op");
    if (s.ok()) s = check_order(now, "replace_op");
  }
  if (s.ok()) {
    if (listener_) listener_->op_replaced(old, now);
    return s;
  }
  return undo(s, [&] {
    ops_.replace(id, std::move(old));
    Status back = reindex("replace_op");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

Status Graph::update_tensors(const std::function<void(LogicalTensor&)>& edit) {
  // Each changed port and what it was, to put back when the edit changes an
  // id or the new descriptions do not finalize: a failed update leaves the
  // graph as it was. The listener hears of the changed ops only on success.
  std::vector<std::pair<LogicalTensor*, LogicalTensor>> was;
  std::vector<std::pair<Op, int64_t>> before;  // a changed op as it was, and its id
  auto put_back = [&] {
    for (auto it = was.rbegin(); it != was.rend(); ++it) *it->first = it->second;
  };
  for (Op& op : ops_) {
    Op old_op = listener_ ? op : Op();
    bool changed = false;
    for (auto* ports : {&op.mutable_inputs(), &op.mutable_outputs()}) {
      for (LogicalTensor& lt : *ports) {
        LogicalTensor old = lt;
        edit(lt);
        if (lt.id != old.id) {
          lt = std::move(old);
          put_back();
          return invalid_argument("update_tensors: tensor " + std::to_string(lt.id) +
                                  " may change its description, not its id");
        }
        if (lt.dtype != old.dtype || lt.dims != old.dims || lt.strides != old.strides ||
            lt.rank_unknown != old.rank_unknown || lt.layout != old.layout ||
            lt.property != old.property) {
          was.emplace_back(&lt, std::move(old));
          changed = true;
        }
      }
    }
    if (changed && listener_) before.emplace_back(std::move(old_op), op.id());
  }
  if (finalized_) {
    finalized_ = false;
    Status s = finalize();
    if (!s.ok()) {
      put_back();
      finalized_ = false;
      const Status back = finalize();
      assert(back.ok() && "the graph before an update must finalize");
      (void)back;
      return s.with_context("update_tensors");
    }
  }
  for (const auto& [old_op, id] : before) listener_->op_replaced(old_op, *ops_.find(id));
  return ok_status();
}

Status Graph::replace_all_uses_with(int64_t from, const LogicalTensor& to) {
  if (from == to.id) return ok_status();
  if (!finalized_) {
    for (Op& op : ops_) {
      for (LogicalTensor& lt : op.mutable_inputs()) {
        if (lt.id == from) lt = to;
      }
    }
    if (listener_) listener_->uses_replaced(from, to.id);
    return ok_status();
  }
  const std::vector<Use> readers = uses(from);
  std::vector<LogicalTensor> was;
  for (const Use& u : readers) {
    LogicalTensor& lt = ops_.find(u.op_id)->mutable_inputs()[u.port];
    was.push_back(lt);
    lt = to;
  }
  Status s = ok_status();
  auto it = values_.find(to.id);
  if (it == values_.end()) {
    values_.emplace(to.id, Value{to, -1, 0, {}});
  } else {
    LogicalTensor merged = it->second.desc;
    s = merge_tensor(merged, to, "replace_all_uses_with");
    if (s.ok()) it->second.desc = merged;
  }
  if (s.ok()) {
    Value& target = values_.at(to.id);
    for (const Use& u : readers) {
      const int64_t k = ops_.order(u.op_id);
      auto at = std::find_if(target.uses.begin(), target.uses.end(), [&](const Use& v) {
        const int64_t j = ops_.order(v.op_id);
        return j > k || (j == k && v.port > u.port);
      });
      target.uses.insert(at, u);
    }
    values_.at(from).uses.clear();
    const int64_t p = producer_order(to.id);
    for (const Use& u : readers) {
      if (target.producer == u.op_id) {
        s = invalid_graph("replace_all_uses_with: cycle: " + op(u.op_id)->label() +
                          " consumes its own output tensor " + std::to_string(to.id));
        break;
      }
      if (p >= ops_.order(u.op_id)) {
        s = invalid_graph("replace_all_uses_with: " + op(u.op_id)->label() + " would read tensor " +
                          std::to_string(to.id) + " before " + producer_op(target).label() +
                          " writes it");
        break;
      }
    }
  }
  if (s.ok()) {
    auto f = values_.find(from);
    const bool port = input_ports_ && std::find(input_ports_->begin(), input_ports_->end(), from) !=
                                          input_ports_->end();
    if (f != values_.end() && f->second.producer < 0 && !port) values_.erase(f);
    if (listener_) listener_->uses_replaced(from, to.id);
    return s;
  }
  return undo(s, [&] {
    for (size_t i = 0; i < readers.size(); ++i)
      ops_.find(readers[i].op_id)->mutable_inputs()[readers[i].port] = was[i];
    Status back = reindex("replace_all_uses_with");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

}  // namespace normgrad
