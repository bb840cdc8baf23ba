// benchdnn knob parsing and graph rewriting.
#include "tools/cli_knobs.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include "graph/op_checks.hpp"
#include "ops/op_registry.hpp"
#include "ops/tf_batch_norm.hpp"

namespace normgrad {
namespace cli {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) parts.push_back(cur);
  return parts;
}

bool to_int(const std::string& s, int64_t* v) {
  return parse_int(s, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), v);
}

StatusOr<Dims> parse_dims(const std::string& s, const std::string& what) {
  Dims dims;
  for (const std::string& p : split(s, 'x')) {
    int64_t d;
    if (!to_int(p, &d) || d < 0)
      return invalid_argument(what + ": bad shape '" + s + "' (expected e.g. 2x3x4)");
    dims.push_back(d);
  }
  if (dims.empty()) return invalid_argument(what + ": empty shape");
  return dims;
}

bool is_batch_norm(OpKind k) {
  return k == OpKind::kBatchNormTrainingBackward || k == OpKind::kBatchNormForwardTraining ||
         k == OpKind::kBatchNormInference || is_tf_batch_norm_grad(k);
}

// Tensors on a batch-norm op's per-channel ports: statistics, scale, shift and their gradients.
std::set<int64_t> statistics_tensors(const Graph& g) {
  std::set<int64_t> ids;
  for (const Op& op : g.ops()) {
    if (!is_batch_norm(op.kind())) continue;
    const bool two_data_inputs =
        op.kind() == OpKind::kBatchNormTrainingBackward || is_tf_batch_norm_grad(op.kind());
    for (size_t i = two_data_inputs ? 2 : 1; i < op.inputs().size(); ++i)
      ids.insert(op.inputs()[i].id);
    for (size_t i = 1; i < op.outputs().size(); ++i) ids.insert(op.outputs()[i].id);
  }
  return ids;
}

// Parses `text` as the type of attribute `name` of `op` (from its schema).
StatusOr<AttrValue> typed_value(const Op& op, const std::string& name, const std::string& text) {
  const OpSchema* schema = op_registry().find(op.kind());
  const AttrSpec* spec = schema ? schema->find_attr(name) : nullptr;
  if (spec == nullptr)
    return invalid_argument("--op-attrs: " + op.label() + " has no attribute '" + name + "'");
  const std::string where = "--op-attrs: " + op.label() + " attribute '" + name + "'";
  switch (spec->kind) {
    case AttrKind::kString:
      return AttrValue(text);
    case AttrKind::kBool:
      if (text == "true" || text == "1") return AttrValue(true);
      if (text == "false" || text == "0") return AttrValue(false);
      return invalid_argument(where + ": expected true or false, got '" + text + "'");
    case AttrKind::kS64: {
      int64_t v;
      if (!to_int(text, &v))
        return invalid_argument(where + ": expected an integer, got '" + text + "'");
      return AttrValue(v);
    }
    case AttrKind::kF32: {
      char* end = nullptr;
      const float v = std::strtof(text.c_str(), &end);
      if (text.empty() || *end != '\0')
        return invalid_argument(where + ": expected a number, got '" + text + "'");
      return AttrValue(v);
    }
    case AttrKind::kS64s: {
      std::vector<int64_t> v;
      for (const std::string& p : split(text, 'x')) {
        int64_t x;
        if (!to_int(p, &x))
          return invalid_argument(where + ": expected integers joined by 'x', got '" + text + "'");
        v.push_back(x);
      }
      return AttrValue(v);
    }
    case AttrKind::kF32s: {
      std::vector<float> v;
      for (const std::string& p : split(text, 'x')) v.push_back(std::strtof(p.c_str(), nullptr));
      return AttrValue(v);
    }
  }
  return invalid_argument(where + ": unsupported type");
}

}  // namespace

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

Status parse_in_shapes(const std::string& text, Knobs* knobs) {
  knobs->in_shapes.clear();
  knobs->in_shapes_text = text;
  for (const std::string& item : split(text, '+')) {
    const size_t colon = item.find(':');
    int64_t id;
    if (colon == std::string::npos || !to_int(item.substr(0, colon), &id)) {
      return invalid_argument("--in-shapes: expected ID:SHAPE, got '" + item + "'");
    }
    NG_ASSIGN_OR_RETURN(knobs->in_shapes[id], parse_dims(item.substr(colon + 1), "--in-shapes"));
  }
  return ok_status();
}

Status parse_op_attrs(const std::string& text, Knobs* knobs) {
  knobs->op_attrs.clear();
  knobs->op_attrs_text = text;
  for (const std::string& item : split(text, '+')) {
    const auto parts = split(item, ':');
    int64_t id;
    if (parts.size() != 3 || !to_int(parts[0], &id)) {
      return invalid_argument("--op-attrs: expected OPID:NAME:VALUE, got '" + item + "'");
    }
    knobs->op_attrs.push_back({id, parts[1], parts[2]});
  }
  return ok_status();
}

Status apply_knobs(const Knobs& knobs, Graph* graph) {
  if (!knobs.dt.empty()) {
    NG_ASSIGN_OR_RETURN(DataType dt, parse_dtype(knobs.dt));
    const std::set<int64_t> stats = statistics_tensors(*graph);
    for (Op& op : graph->mutable_ops()) {
      for (auto* ports : {&op.mutable_inputs(), &op.mutable_outputs()}) {
        for (LogicalTensor& lt : *ports) {
          if (!stats.count(lt.id)) lt.dtype = dt;
        }
      }
    }
  }
  const bool reshape = !knobs.in_shapes.empty() || knobs.mb > 0;
  if (reshape) {
    // Tensors our ops produce are re-inferred by finalize; an opaque op's
    // outputs keep their declared shape (we cannot infer it), with --mb applied.
    std::set<int64_t> produced, seen;
    for (const Op& op : graph->ops()) {
      if (op_kind_is_opaque(op.kind())) continue;
      for (const LogicalTensor& lt : op.outputs()) produced.insert(lt.id);
    }
    const std::set<int64_t> stats = statistics_tensors(*graph);
    for (Op& op : graph->mutable_ops()) {
      for (auto* ports : {&op.mutable_inputs(), &op.mutable_outputs()}) {
        for (LogicalTensor& lt : *ports) {
          if (produced.count(lt.id)) {  // re-inferred by finalize
            lt.dims.clear();
            lt.rank_unknown = true;
            lt.strides.clear();
            continue;
          }
          if (auto it = knobs.in_shapes.find(lt.id); it != knobs.in_shapes.end()) {
            lt.dims = it->second;
            lt.strides.clear();
            seen.insert(lt.id);
          }
          if (knobs.mb > 0 && !stats.count(lt.id) && lt.rank() >= 2 &&
              !knobs.in_shapes.count(lt.id)) {
            lt.dims[0] = knobs.mb;
            lt.strides.clear();
          }
        }
      }
    }
    for (const auto& [id, dims] : knobs.in_shapes) {
      if (!seen.count(id))
        return invalid_argument("--in-shapes: tensor " + std::to_string(id) +
                                " is not a graph input");
    }
  }
  for (const OpAttrRewrite& r : knobs.op_attrs) {
    bool found = false;
    for (Op& op : graph->mutable_ops()) {
      if (op.id() != r.op_id) continue;
      found = true;
      NG_ASSIGN_OR_RETURN(AttrValue v, typed_value(op, r.name, r.value));
      op.set_attr(r.name, std::move(v));
    }
    if (!found)
      return invalid_argument("--op-attrs: the graph has no op " + std::to_string(r.op_id));
  }
  return ok_status();
}

std::string repro_line(const Knobs& knobs, const std::string& case_path) {
  std::string s = "--mode=" + knobs.mode;
  if (knobs.backend != "auto") s += " --backend=" + knobs.backend;
  if (!knobs.dt.empty()) s += " --dt=" + knobs.dt;
  if (knobs.mb > 0) s += " --mb=" + std::to_string(knobs.mb);
  if (!knobs.in_shapes_text.empty()) s += " --in-shapes=" + knobs.in_shapes_text;
  if (!knobs.op_attrs_text.empty()) s += " --op-attrs=" + knobs.op_attrs_text;
  return s + " --case=" + case_path;
}

}  // namespace cli
}  // namespace normgrad
