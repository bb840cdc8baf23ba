// The rewriter API of Graph: erase, insert, replace ops and uses by id.
//
// Each edit changes ops_ and, on a finalized graph, rebuilds the tensor
// table and the producer/consumer maps (linear in the ports, no sort, no
// shape inference) and checks that every read still follows its write, so
// the graph stays finalized and every query answers for the graph as it now is.
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

// Keeps the edit when the graph is still consistent; otherwise puts the ops
// back as they were and returns why.
Status Graph::commit(const std::vector<Op>& before, bool was_finalized, const std::string& edit) {
  Status s = reindex(edit);
  if (s.ok()) return s;
  ops_ = before;
  finalized_ = was_finalized;
  Status back = reindex(edit);
  assert(back.ok() && "the graph before an edit must reindex");
  (void)back;
  return s;
}

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
  const std::vector<Op> before = ops_;
  const bool was_finalized = finalized_;
  ops_.erase(ops_.begin() + k);
  return commit(before, was_finalized, "erase_op");
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
  const std::vector<Op> before = ops_;
  const bool was_finalized = finalized_;
  ops_.insert(ops_.begin() + k, std::move(op));
  return commit(before, was_finalized, "insert_op");
}

Status Graph::replace_op(int64_t op_id, Op replacement) {
  NG_RETURN_IF_ERROR(verify_op_structure(replacement));
  NG_RETURN_IF_ERROR(check_new_tensors(replacement, "replace_op"));
  const int64_t k = index_of(op_id);
  if (k < 0) return not_found("replace_op: no op " + std::to_string(op_id));
  if (replacement.id() != op_id && index_of(replacement.id()) >= 0)
    return invalid_graph("replace_op: op id " + std::to_string(replacement.id()) +
                         " is already used");
  const std::vector<Op> before = ops_;
  const bool was_finalized = finalized_;
  ops_[static_cast<size_t>(k)] = std::move(replacement);
  return commit(before, was_finalized, "replace_op");
}

Status Graph::replace_all_uses_with(int64_t from, const LogicalTensor& to) {
  if (from == to.id) return ok_status();
  const std::vector<Op> before = ops_;
  const bool was_finalized = finalized_;
  for (Op& op : ops_) {
    for (LogicalTensor& lt : op.mutable_inputs()) {
      if (lt.id == from) lt = to;
    }
  }
  return commit(before, was_finalized, "replace_all_uses_with");
}

}  // namespace normgrad
