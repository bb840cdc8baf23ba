// The rewriter API of Graph: erase, insert, replace ops and uses by id.
//
// Each edit changes ops_ and, on a finalized graph, updates the tensor table
// and the producer/consumer maps for the ops it touches (link, unlink and
// prune in graph.cpp: the cost of the edit, not of the graph; no sort, no
// shape inference), and checks that every read still follows its write, so
// the graph stays finalized and every query answers for the graph as it now
// is. An edit that fails its checks is undone, and only then are the maps
// rebuilt from the ops (linear), to restore exactly the graph before it.
// Inserting or erasing shifts the later ops' places (integers only).
#include <normgrad/graph/graph.hpp>

#include <algorithm>
#include <cassert>

#include <normgrad/graph/op_checks.hpp>

namespace normgrad {

int64_t Graph::index_of(int64_t op_id) const {
  if (finalized_) {
    auto it = index_.find(op_id);
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  for (size_t k = 0; k < ops_.size(); ++k) {
    if (ops_[k].id() == op_id) return static_cast<int64_t>(k);
  }
  return -1;
}

Status Graph::reindex(const std::string& edit) {
  if (!finalized_) return ok_status();
  finalized_ = false;  // until the maps are whole again
  Status s = collect_tensors();
  if (!s.ok()) return s.with_context(edit);
  for (size_t k = 0; k < ops_.size(); ++k) {
    for (const LogicalTensor& lt : ops_[k].inputs()) {
      const int64_t p = producer_index(lt.id);
      if (p >= static_cast<int64_t>(k)) {
        return invalid_graph(edit + ": " + ops_[k].label() + " would read tensor " +
                             std::to_string(lt.id) + " before " +
                             ops_[static_cast<size_t>(p)].label() + " writes it");
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
  const int64_t k = index_of(op_id);
  if (k < 0) return not_found("erase_op: no op " + std::to_string(op_id));
  const Op& op = ops_[static_cast<size_t>(k)];
  for (const LogicalTensor& lt : op.outputs()) {
    for (const Use& u : uses(lt.id)) {
      if (u.op_id != op_id)
        return invalid_graph("erase_op: " + this->op(u.op_id)->label() + " still reads tensor " +
                             std::to_string(lt.id) + " of " + op.label());
    }
  }
  Op gone = std::move(ops_[static_cast<size_t>(k)]);
  ops_.erase(ops_.begin() + k);
  op_ids_.erase(op_id);
  if (!finalized_) return ok_status();
  unlink(gone);
  index_.erase(op_id);
  shift_index(static_cast<size_t>(k));
  prune(gone);
  return ok_status();
}

Status Graph::insert_op(Op op, int64_t before_op_id) {
  NG_RETURN_IF_ERROR(verify_op_structure(op));
  NG_RETURN_IF_ERROR(check_new_tensors(op, "insert_op"));
  if (index_of(op.id()) >= 0)
    return invalid_graph("insert_op: op id " + std::to_string(op.id()) + " is already used");
  int64_t k = static_cast<int64_t>(ops_.size());
  if (before_op_id >= 0) {
    k = index_of(before_op_id);
    if (k < 0) return not_found("insert_op: no op " + std::to_string(before_op_id));
  }
  const size_t at = static_cast<size_t>(k);
  if (ids_seen_) see_op_ids(op);
  op_ids_.insert(op.id());
  ops_.insert(ops_.begin() + k, std::move(op));
  if (!finalized_) return ok_status();
  shift_index(at);
  Status s = link(ops_[at], "insert_op");
  if (s.ok()) s = check_order(at, "insert_op");
  if (s.ok()) return s;
  return undo(s, [&] {
    op_ids_.erase(ops_[at].id());
    ops_.erase(ops_.begin() + k);
    Status back = reindex("insert_op");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

Status Graph::replace_op(int64_t op_id, Op replacement) {
  NG_RETURN_IF_ERROR(verify_op_structure(replacement));
  NG_RETURN_IF_ERROR(check_new_tensors(replacement, "replace_op"));
  const int64_t k = index_of(op_id);
  if (k < 0) return not_found("replace_op: no op " + std::to_string(op_id));
  if (replacement.id() != op_id && index_of(replacement.id()) >= 0)
    return invalid_graph("replace_op: op id " + std::to_string(replacement.id()) +
                         " is already used");
  const size_t at = static_cast<size_t>(k);
  if (ids_seen_) see_op_ids(replacement);
  Op old = std::move(ops_[at]);
  ops_[at] = std::move(replacement);
  op_ids_.erase(op_id);
  op_ids_.insert(ops_[at].id());
  if (!finalized_) return ok_status();
  // A tensor only the old op named leaves first: the replacement's metadata
  // for it is then the whole truth, as a rebuild from the ops would have it.
  unlink(old);
  prune(old);
  index_.erase(op_id);
  index_[ops_[at].id()] = at;
  Status s = link(ops_[at], "replace_op");
  if (s.ok()) s = check_order(at, "replace_op");
  if (s.ok()) return s;
  return undo(s, [&] {
    op_ids_.erase(ops_[at].id());
    op_ids_.insert(op_id);
    ops_[at] = std::move(old);
    Status back = reindex("replace_op");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

Status Graph::replace_all_uses_with(int64_t from, const LogicalTensor& to) {
  if (from == to.id) return ok_status();
  if (!finalized_) {
    for (Op& op : ops_) {
      for (LogicalTensor& lt : op.mutable_inputs()) {
        if (lt.id == from) lt = to;
      }
    }
    return ok_status();
  }
  const std::vector<Use> readers = uses(from);
  std::vector<LogicalTensor> was;
  for (const Use& u : readers) {
    LogicalTensor& lt = ops_[index_.at(u.op_id)].mutable_inputs()[u.port];
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
      const size_t k = index_.at(u.op_id);
      auto at = std::find_if(target.uses.begin(), target.uses.end(), [&](const Use& v) {
        const size_t j = index_.at(v.op_id);
        return j > k || (j == k && v.port > u.port);
      });
      target.uses.insert(at, u);
    }
    values_.at(from).uses.clear();
    const int64_t p = producer_index(to.id);
    for (const Use& u : readers) {
      if (target.producer == u.op_id) {
        s = invalid_graph("replace_all_uses_with: cycle: " + op(u.op_id)->label() +
                          " consumes its own output tensor " + std::to_string(to.id));
        break;
      }
      if (p >= static_cast<int64_t>(index_.at(u.op_id))) {
        s = invalid_graph("replace_all_uses_with: " + op(u.op_id)->label() + " would read tensor " +
                          std::to_string(to.id) + " before " +
                          ops_[static_cast<size_t>(p)].label() + " writes it");
        break;
      }
    }
  }
  if (s.ok()) {
    auto f = values_.find(from);
    const bool port = input_ports_ && std::find(input_ports_->begin(), input_ports_->end(), from) !=
                                          input_ports_->end();
    if (f != values_.end() && f->second.producer < 0 && !port) values_.erase(f);
    return s;
  }
  return undo(s, [&] {
    for (size_t i = 0; i < readers.size(); ++i)
      ops_[index_.at(readers[i].op_id)].mutable_inputs()[readers[i].port] = was[i];
    Status back = reindex("replace_all_uses_with");
    assert(back.ok() && "the graph before an edit must reindex");
    (void)back;
  });
}

}  // namespace normgrad
