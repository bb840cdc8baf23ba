// Graph: op insertion checks, finalize (joining, cycle detection, shape inference).
#include <normgrad/graph/graph.hpp>

#include <algorithm>
#include <set>
#include <unordered_map>

#include <normgrad/graph/limits.hpp>
#include <normgrad/graph/op_checks.hpp>

namespace normgrad {
namespace {

std::string op_ref(const Op& op) {
  return "op " + std::to_string(op.id()) + " (" + op.label() + ")";
}

// Merges `incoming` into `known` for one tensor id; unknown dims and strides are
// filled in, known ones must agree.
// `where()` names the port for an error message; it is only called on one
// (finalize and every edit merge each port: building the name eagerly was a
// measured share of a 10^5-op graph's compile).
template <typename Where>
Status merge_metadata(LogicalTensor& known, const LogicalTensor& incoming, const Where& where) {
  const auto who = [&] { return "tensor " + std::to_string(known.id); };
  if (known.dtype != incoming.dtype) {
    return invalid_graph(who() + " has conflicting dtypes: " + dtype_name(known.dtype) + " and " +
                         dtype_name(incoming.dtype) + " (at " + where() + ")");
  }
  if (!incoming.rank_known()) return ok_status();
  if (!known.rank_known()) {
    known.dims = incoming.dims;
    known.strides = incoming.strides;
    known.rank_unknown = false;
    return ok_status();
  }
  if (known.dims.size() != incoming.dims.size()) {
    return invalid_graph(who() + " has conflicting shapes: " + dims_to_string(known.dims) +
                         " and " + dims_to_string(incoming.dims) + " (at " + where() + ")");
  }
  for (size_t i = 0; i < known.dims.size(); ++i) {
    const int64_t a = known.dims[i], b = incoming.dims[i];
    if (a == kUnknownDim) {
      known.dims[i] = b;
    } else if (b != kUnknownDim && a != b) {
      return invalid_graph(who() + " has conflicting shapes: " + dims_to_string(known.dims) +
                           " and " + dims_to_string(incoming.dims) + " (at " + where() + ")");
    }
  }
  if (incoming.strides_known()) {
    if (known.strides_known() && known.strides != incoming.strides) {
      return invalid_graph(who() + " has conflicting strides: " + dims_to_string(known.strides) +
                           " and " + dims_to_string(incoming.strides) + " (at " + where() + ")");
    }
    known.strides = incoming.strides;
  }
  if (known.layout != incoming.layout && incoming.layout == LayoutType::kStrided) {
    known.layout = LayoutType::kStrided;
  }
  return ok_status();
}

bool all_inputs_known(const Op& op) {
  return std::all_of(op.inputs().begin(), op.inputs().end(),
                     [](const LogicalTensor& t) { return t.dims_known(); });
}

}  // namespace

Status Graph::add_op(Op op) {
  NG_RETURN_IF_ERROR(verify_op_structure(op));
  if (const Op* other = ops_.find(op.id())) {
    return invalid_graph(op.label() + ": op id " + std::to_string(op.id()) +
                         " is already used by " + other->label());
  }
  if (all_inputs_known(op)) {
    // Shape rules fire as early as they can; finalize repeats them with propagated shapes.
    Op probe = op;
    NG_RETURN_IF_ERROR(infer_op_shapes(probe));
  }
  if (ids_seen_) see_op_ids(op);
  ops_.push_back(std::move(op));
  finalized_ = false;
  return ok_status();
}

int64_t Graph::producer_order(int64_t id) const {
  auto it = values_.find(id);
  if (it == values_.end() || it->second.producer < 0) return -1;
  return ops_.order(it->second.producer);
}

const Op& Graph::producer_op(const Value& v) const {
  return *ops_.find(v.producer);
}

Status Graph::collect_tensors() {
  values_.clear();
  values_.reserve(3 * ops_.size());  // about three tensors per op: no rehash while it fills
  notes_.clear();
  for (const Op& op : ops_) {
    for (size_t i = 0; i < op.outputs().size(); ++i) {
      const LogicalTensor& lt = op.outputs()[i];
      auto [it, inserted] = values_.emplace(lt.id, Value{lt, op.id(), i, {}});
      if (!inserted) {
        return invalid_graph("tensor " + std::to_string(lt.id) + " is produced by both " +
                             op_ref(producer_op(it->second)) + " and " + op_ref(op));
      }
    }
  }
  // Schema ops first: their metadata is checked. An opaque op's declaration
  // that disagrees with it is the framework's business (benchdnn's own inputs
  // have such slips); it is noted, and the checked metadata wins.
  for (int phase = 0; phase < 2; ++phase) {
    for (const Op& op : ops_) {
      const bool opaque = op_kind_is_opaque(op.kind());
      if (opaque != (phase == 1)) continue;
      auto visit = [&](const LogicalTensor& lt, const char* side, size_t i) -> Status {
        auto [it, inserted] = values_.emplace(lt.id, Value{lt, -1, 0, {}});
        if (inserted) return ok_status();
        Status s = merge_metadata(
            it->second.desc, lt, [&] { return op_ref(op) + " " + side + " " + std::to_string(i); });
        if (s.ok() || !opaque) return s;
        notes_.push_back(s.message() + "; " + op_ref(op) + " is not run by normgrad: ignored");
        return ok_status();
      };
      for (size_t i = 0; i < op.inputs().size(); ++i)
        NG_RETURN_IF_ERROR(visit(op.inputs()[i], "input", i));
      for (size_t i = 0; i < op.outputs().size(); ++i)
        NG_RETURN_IF_ERROR(visit(op.outputs()[i], "output", i));
    }
  }
  for (const Op& op : ops_) {
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      Value& v = values_.at(op.inputs()[i].id);
      v.uses.push_back({op.id(), i});
      if (v.producer == op.id()) {
        return invalid_graph("cycle: " + op_ref(op) + " consumes its own output tensor " +
                             std::to_string(v.desc.id));
      }
    }
  }
  if (input_ports_) {
    // oneDNN's dumps may list fewer input ports than the graph reads (a
    // constant weight, say): such tensors are graph inputs after the ports.
    for (int64_t id : *input_ports_) {
      if (values_.count(id) == 0) {
        // A port that a pass made unused stays a graph input (accepted at
        // execute and ignored). A port that never named a tensor describes no
        // buffer: noted and left out of graph_inputs().
        auto kept = port_tensors_.find(id);
        if (kept == port_tensors_.end()) {
          notes_.push_back("input port " + std::to_string(id) +
                           " names no tensor of the graph: ignored");
          continue;
        }
        values_.emplace(id, Value{kept->second, -1, 0, {}});
        continue;
      }
      if (producer_order(id) >= 0) {
        return invalid_graph("input port " + std::to_string(id) + " is produced by " +
                             op_ref(producer_op(values_.at(id))));
      }
    }
  }
  if (output_ports_) {
    for (int64_t id : *output_ports_) {
      if (producer_order(id) < 0) {
        notes_.push_back("output port " + std::to_string(id) +
                         " is not produced by any op: ignored");
      }
    }
  }
  return ok_status();
}

Status Graph::sort_topologically(bool* reordered) {
  const size_t n = ops_.size();
  *reordered = false;
  // Already in order (every producer before its readers), as graphs from
  // frameworks and from our own edits are: nothing to do.
  bool in_order = true;
  for (auto it = ops_.begin(); it != ops_.end() && in_order; ++it) {
    const int64_t k = ops_.order(it->id());
    for (const LogicalTensor& lt : it->inputs()) {
      if (producer_order(lt.id) >= k) {
        in_order = false;
        break;
      }
    }
  }
  if (in_order) return ok_status();
  *reordered = true;
  std::unordered_map<int64_t, size_t> place;  // op id -> its place in ops_ now
  std::vector<const Op*> at;
  for (const Op& op : ops_) {
    place.emplace(op.id(), at.size());
    at.push_back(&op);
  }
  std::vector<size_t> pending(n, 0);
  std::vector<std::set<size_t>> successors(n);
  for (size_t k = 0; k < n; ++k) {
    std::set<size_t> preds;
    for (const LogicalTensor& lt : at[k]->inputs()) {
      auto v = values_.find(lt.id);
      if (v != values_.end() && v->second.producer >= 0) preds.insert(place.at(v->second.producer));
    }
    pending[k] = preds.size();
    for (size_t p : preds) successors[p].insert(k);
  }
  // Kahn's algorithm, taking ready ops in insertion order so the result is stable.
  std::vector<size_t> order;
  std::set<size_t> ready;
  for (size_t k = 0; k < n; ++k) {
    if (pending[k] == 0) ready.insert(k);
  }
  while (!ready.empty()) {
    const size_t k = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(k);
    for (size_t s : successors[k]) {
      if (--pending[s] == 0) ready.insert(s);
    }
  }
  if (order.size() != n) {
    std::string members;
    for (size_t k = 0; k < n; ++k) {
      if (pending[k] != 0) members += (members.empty() ? "" : ", ") + op_ref(*at[k]);
    }
    return invalid_graph("cycle among " + members);
  }
  ops_.permute(order);
  return ok_status();
}

Status Graph::infer_shapes() {
  for (Op& op : ops_) {
    bool inputs_known = true;
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      LogicalTensor& lt = op.mutable_inputs()[i];
      lt = values_.at(lt.id).desc;
      inputs_known = inputs_known && lt.dims_known();
    }
    for (LogicalTensor& lt : op.mutable_outputs()) {
      const LogicalTensor& known = values_.at(lt.id).desc;
      lt.dims = known.dims;
      lt.strides = known.strides;
      lt.rank_unknown = known.rank_unknown;
    }
    // An op with an unknown input shape keeps its outputs as declared: oneDNN
    // Graph partitions such graphs too, and compile asks for the shapes of the
    // partitions it runs (see unknown_shape_error).
    if (!inputs_known) continue;
    NG_RETURN_IF_ERROR(infer_op_shapes(op));
    for (size_t i = 0; i < op.outputs().size(); ++i) {
      LogicalTensor& lt = op.mutable_outputs()[i];
      NG_RETURN_IF_ERROR(merge_metadata(
          values_.at(lt.id).desc, lt, [&] { return op_ref(op) + " output " + std::to_string(i); }));
      lt = values_.at(lt.id).desc;
    }
  }
  // Consumers declared before inference may still hold unknown dims: refresh them.
  for (Op& op : ops_) {
    for (LogicalTensor& lt : op.mutable_inputs()) lt = values_.at(lt.id).desc;
  }
  return ok_status();
}

Status Graph::unknown_shape_error(const Op& op) const {
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    const LogicalTensor& lt = op.inputs()[i];
    if (lt.dims_known()) continue;
    const int64_t producer = producer_order(lt.id);
    return invalid_graph(
        op_ref(op) + " input " + std::to_string(i) + ": tensor " + std::to_string(lt.id) +
        " has unknown shape " +
        (lt.rank_unknown ? std::string("(unknown rank)") : dims_to_string(lt.dims)) +
        (producer < 0
             ? "; graph inputs need concrete shapes"
             : "; its producer " + op_ref(producer_op(values_.at(lt.id))) + " does not say it"));
  }
  for (size_t i = 0; i < op.outputs().size(); ++i) {
    const LogicalTensor& lt = op.outputs()[i];
    if (lt.dims_known()) continue;
    return invalid_graph(op_ref(op) + " output " + std::to_string(i) + ": tensor " +
                         std::to_string(lt.id) + " has unknown shape");
  }
  return ok_status();
}

Status Graph::check_sizes() const {
  const ResourceLimits& limits = resource_limits();
  int64_t total = 0;
  for (const auto& [id, v] : values_) {
    const LogicalTensor& lt = v.desc;
    if (!lt.dims_known()) continue;  // sized when compile learns the shape
    NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
    if (bytes > limits.max_tensor_bytes) {
      return out_of_range("tensor " + std::to_string(id) + " (" + dims_to_string(lt.dims) + " " +
                          dtype_name(lt.dtype) + ") needs " + std::to_string(bytes) +
                          " bytes, over the limit of " + std::to_string(limits.max_tensor_bytes) +
                          " (NORMGRAD_MAX_TENSOR_BYTES)");
    }
    NG_ASSIGN_OR_RETURN(total, checked_add(total, bytes, "graph bytes"));
  }
  if (total > limits.max_total_bytes) {
    return out_of_range("the graph's tensors need " + std::to_string(total) +
                        " bytes, over the limit of " + std::to_string(limits.max_total_bytes) +
                        " (NORMGRAD_MAX_TOTAL_BYTES)");
  }
  // Outputs must not alias themselves: two logical elements at one address would race.
  for (const Op& op : ops_) {
    for (size_t i = 0; i < op.outputs().size(); ++i) {
      if (!op.outputs()[i].non_overlapping()) {
        return invalid_argument(op.label() + ": output " + std::to_string(i) + " (tensor " +
                                std::to_string(op.outputs()[i].id) + ") has overlapping strides " +
                                dims_to_string(op.outputs()[i].effective_strides()));
      }
    }
  }
  return ok_status();
}

void Graph::see_op_ids(const Op& op) {
  next_op_id_ = std::max(next_op_id_, op.id() + 1);
  for (const auto* ports : {&op.inputs(), &op.outputs()}) {
    for (const LogicalTensor& lt : *ports) next_tensor_id_ = std::max(next_tensor_id_, lt.id + 1);
  }
}

// Once over the graph; from then on every op that joins bumps the counters
// (see_op_ids), so a new id costs O(1).
void Graph::see_ids() {
  for (const Op& op : ops_) see_op_ids(op);
  for (const auto* ports : {&input_ports_, &output_ports_}) {
    if (*ports) {
      for (int64_t id : **ports) next_tensor_id_ = std::max(next_tensor_id_, id + 1);
    }
  }
  ids_seen_ = true;
}

int64_t Graph::new_op_id() {
  if (!ids_seen_) see_ids();
  return next_op_id_++;
}

int64_t Graph::new_tensor_id() {
  if (!ids_seen_) see_ids();
  return next_tensor_id_++;
}

void Graph::unlink(const Op& op) {
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    auto it = values_.find(op.inputs()[i].id);
    if (it == values_.end()) continue;
    auto& uses = it->second.uses;
    uses.erase(std::remove_if(uses.begin(), uses.end(),
                              [&](const Use& u) { return u.op_id == op.id() && u.port == i; }),
               uses.end());
  }
  for (const LogicalTensor& lt : op.outputs()) {
    auto it = values_.find(lt.id);
    if (it != values_.end() && it->second.producer == op.id()) it->second.producer = -1;
  }
}

Status Graph::link(const Op& op, const std::string& edit) {
  const bool opaque = op_kind_is_opaque(op.kind());
  auto merge = [&](const LogicalTensor& lt, const char* side, size_t i) -> Status {
    auto [it, inserted] = values_.emplace(lt.id, Value{lt, -1, 0, {}});
    if (inserted) return ok_status();
    Status s = merge_metadata(it->second.desc, lt,
                              [&] { return op_ref(op) + " " + side + " " + std::to_string(i); });
    if (!s.ok() && !opaque) return s.with_context(edit);
    if (s.ok()) return s;
    notes_.push_back(s.message() + "; " + op_ref(op) + " is not run by normgrad: ignored");
    return ok_status();
  };
  for (size_t i = 0; i < op.outputs().size(); ++i) {
    const LogicalTensor& lt = op.outputs()[i];
    NG_RETURN_IF_ERROR(merge(lt, "output", i));
    Value& v = values_.at(lt.id);
    if (v.producer >= 0 && v.producer != op.id()) {
      return invalid_graph(edit + ": tensor " + std::to_string(lt.id) + " is produced by both " +
                           op_ref(producer_op(v)) + " and " + op_ref(op));
    }
    v.producer = op.id();
    v.producer_port = i;
  }
  const int64_t k = ops_.order(op.id());
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    const LogicalTensor& lt = op.inputs()[i];
    NG_RETURN_IF_ERROR(merge(lt, "input", i));
    Value& v = values_.at(lt.id);
    if (v.producer == op.id()) {
      return invalid_graph(edit + ": cycle: " + op_ref(op) + " consumes its own output tensor " +
                           std::to_string(lt.id));
    }
    // Uses stay in op order (then port order).
    auto at = std::find_if(v.uses.begin(), v.uses.end(), [&](const Use& u) {
      const int64_t j = ops_.order(u.op_id);
      return j > k || (j == k && u.port > i);
    });
    v.uses.insert(at, Use{op.id(), i});
  }
  return ok_status();
}

void Graph::prune(const Op& op) {
  auto drop = [&](int64_t id) {
    auto it = values_.find(id);
    if (it == values_.end() || it->second.producer >= 0 || !it->second.uses.empty()) return;
    if (input_ports_ &&
        std::find(input_ports_->begin(), input_ports_->end(), id) != input_ports_->end()) {
      // An input port a pass made unused stays a graph input, as finalize keeps it.
      auto kept = port_tensors_.find(id);
      if (kept != port_tensors_.end()) it->second.desc = kept->second;
      return;
    }
    values_.erase(it);
  };
  for (const LogicalTensor& lt : op.inputs()) drop(lt.id);
  for (const LogicalTensor& lt : op.outputs()) drop(lt.id);
}

Status Graph::check_order(const Op& op, const std::string& edit) const {
  const int64_t k = ops_.order(op.id());
  for (const LogicalTensor& lt : op.inputs()) {
    if (producer_order(lt.id) >= k) {
      return invalid_graph(edit + ": " + op.label() + " would read tensor " +
                           std::to_string(lt.id) + " before " +
                           producer_op(values_.at(lt.id)).label() + " writes it");
    }
  }
  for (const LogicalTensor& lt : op.outputs()) {
    auto it = values_.find(lt.id);
    if (it == values_.end()) continue;
    for (const Use& u : it->second.uses) {
      if (ops_.order(u.op_id) <= k) {
        return invalid_graph(edit + ": " + ops_.find(u.op_id)->label() + " would read tensor " +
                             std::to_string(lt.id) + " before " + op.label() + " writes it");
      }
    }
  }
  return ok_status();
}

Status Graph::check_against_rebuild() const {
  if (!finalized_) return internal_error("check_against_rebuild: the graph is not finalized");
  Graph fresh = with_ops(ops_.to_vector());
  NG_RETURN_IF_ERROR(fresh.finalize().with_context("the graph finalized from scratch"));
  for (auto a = ops().begin(), b = fresh.ops().begin(); a != ops().end(); ++a, ++b) {
    if (b->id() != a->id())
      return internal_error("op " + std::to_string(a->id()) +
                            " is out of order: a fresh finalize puts op " +
                            std::to_string(b->id()) + " at its place");
  }
  for (const auto& [id, v] : values_) {
    const auto it = fresh.values_.find(id);
    const std::string who = "tensor " + std::to_string(id);
    if (it == fresh.values_.end())
      return internal_error(who + " is kept but no op names it any longer");
    const Value& f = it->second;
    if (f.producer != v.producer)
      return internal_error(who + ": producer " + std::to_string(v.producer) + ", rebuilt " +
                            std::to_string(f.producer));
    if (f.desc.dims != v.desc.dims || f.desc.dtype != v.desc.dtype)
      return internal_error(who + ": metadata differs from the rebuilt graph's");
    bool same = f.uses.size() == v.uses.size();
    for (size_t u = 0; same && u < f.uses.size(); ++u)
      same = f.uses[u].op_id == v.uses[u].op_id && f.uses[u].port == v.uses[u].port;
    if (!same) return internal_error(who + ": its uses differ from the rebuilt graph's");
  }
  if (fresh.values_.size() != values_.size())
    return internal_error("the rebuilt graph has " + std::to_string(fresh.values_.size()) +
                          " tensors, the edited one " + std::to_string(values_.size()));
  return ok_status();
}

Status Graph::merge_tensor(LogicalTensor& known, const LogicalTensor& incoming,
                           const std::string& where) {
  return merge_metadata(known, incoming, [&] { return where; });
}

Status Graph::finalize() {
  if (!ids_seen_) see_ids();  // before passes drop ops: their ids stay taken
  finalized_ = false;
  if (ops_.empty()) return invalid_graph("the graph has no ops");
  if (static_cast<int64_t>(ops_.size()) > resource_limits().max_ops) {
    return out_of_range("the graph has " + std::to_string(ops_.size()) +
                        " ops, over the limit of " + std::to_string(resource_limits().max_ops) +
                        " (NORMGRAD_MAX_OPS)");
  }
  // Structure first: passes edit ops directly, and the shape rules index ports.
  if (const int64_t id = ops_.repeated_id(); id >= 0) {
    const Op* second = nullptr;
    for (const Op& op : ops_) {
      if (op.id() == id && second == nullptr && &op != ops_.find(id)) second = &op;
    }
    return invalid_graph(second->label() + ": op id " + std::to_string(id) + " is used twice");
  }
  for (const Op& op : ops_) NG_RETURN_IF_ERROR(verify_op_structure(op));
  NG_RETURN_IF_ERROR(collect_tensors());
  bool reordered = false;
  NG_RETURN_IF_ERROR(sort_topologically(&reordered));
  if (reordered) NG_RETURN_IF_ERROR(collect_tensors());  // indices changed with the new order
  NG_RETURN_IF_ERROR(infer_shapes());
  NG_RETURN_IF_ERROR(check_sizes());
  if (input_ports_) {
    for (int64_t id : *input_ports_) {
      if (values_.count(id)) port_tensors_[id] = values_.at(id).desc;
    }
  }
  finalized_ = true;
  return ok_status();
}

}  // namespace normgrad
