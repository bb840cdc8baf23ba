// Graph's queries by id: values, tensors, ops, producers, uses, and the
// graph's inputs and outputs; and with_ops, which derives a graph.
//
// After finalize they answer from the maps that finalize and every rewriter
// edit keep (hash lookups); before it they scan the ops as they are.
#include <normgrad/graph/graph.hpp>

#include <set>

namespace normgrad {

// Before finalize (and between a failed finalize and the next) the maps are
// stale or empty: the queries then scan the ops as they are, at linear cost.
std::optional<Value> Graph::value(int64_t id) const {
  if (finalized_) {
    auto it = values_.find(id);
    return it == values_.end() ? std::nullopt : std::optional<Value>(it->second);
  }
  std::optional<Value> v;
  for (const Op& op : ops_) {
    for (size_t i = 0; i < op.outputs().size(); ++i) {
      if (op.outputs()[i].id != id) continue;
      if (!v) v = Value{op.outputs()[i], -1, 0, {}};
      v->producer = op.id();
      v->producer_port = i;
    }
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      if (op.inputs()[i].id != id) continue;
      if (!v) v = Value{op.inputs()[i], -1, 0, {}};
      v->uses.push_back({op.id(), i});
    }
  }
  return v;
}

const LogicalTensor* Graph::find_tensor(int64_t id) const {
  if (!finalized_) {
    for (const Op& op : ops_) {
      for (const auto* ports : {&op.outputs(), &op.inputs()}) {
        for (const LogicalTensor& lt : *ports) {
          if (lt.id == id) return &lt;
        }
      }
    }
    return nullptr;
  }
  auto it = values_.find(id);
  return it == values_.end() ? nullptr : &it->second.desc;
}

const Op* Graph::op(int64_t op_id) const {
  return ops_.find(op_id);
}

const Op* Graph::producer(int64_t tensor_id) const {
  if (finalized_) {
    auto it = values_.find(tensor_id);
    return it == values_.end() || it->second.producer < 0 ? nullptr : &producer_op(it->second);
  }
  const std::optional<Value> v = value(tensor_id);
  return v && v->producer >= 0 ? op(v->producer) : nullptr;
}

std::vector<Use> Graph::uses(int64_t tensor_id) const {
  if (finalized_) {  // the uses alone: no copy of the tensor's metadata
    auto it = values_.find(tensor_id);
    return it == values_.end() ? std::vector<Use>{} : it->second.uses;
  }
  std::optional<Value> v = value(tensor_id);
  return v ? v->uses : std::vector<Use>{};
}

Graph Graph::with_ops(std::vector<Op> ops) const {
  Graph g;
  g.version = version;
  g.engine_kind = engine_kind;
  g.fpmath_mode = fpmath_mode;
  g.fpmath_mode_apply_to_int = fpmath_mode_apply_to_int;
  g.input_ports_ = input_ports_;
  g.output_ports_ = output_ports_;
  g.ops_.assign(std::move(ops));
  g.next_op_id_ = next_op_id_;
  g.next_tensor_id_ = next_tensor_id_;
  g.see_ids();
  return g;
}

std::vector<LogicalTensor> Graph::graph_inputs() const {
  std::vector<LogicalTensor> result;
  std::set<int64_t> seen;
  if (input_ports_) {
    for (int64_t id : *input_ports_) {
      if (values_.count(id) && seen.insert(id).second) result.push_back(values_.at(id).desc);
    }
  }
  for (const Op& op : ops_) {
    for (const LogicalTensor& lt : op.inputs()) {
      if (producer_order(lt.id) < 0 && seen.insert(lt.id).second)
        result.push_back(values_.at(lt.id).desc);
    }
  }
  return result;
}

std::vector<LogicalTensor> Graph::graph_outputs() const {
  std::vector<LogicalTensor> result;
  if (output_ports_) {
    for (int64_t id : *output_ports_) {
      if (producer_order(id) >= 0) result.push_back(values_.at(id).desc);
    }
    return result;
  }
  for (const Op& op : ops_) {
    for (const LogicalTensor& lt : op.outputs()) {
      bool consumed = false;
      for (const Use& u : uses(lt.id))
        consumed = consumed || this->op(u.op_id)->kind() != OpKind::kEnd;
      if (!consumed) result.push_back(values_.at(lt.id).desc);
    }
  }
  return result;
}

}  // namespace normgrad
