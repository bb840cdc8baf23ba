// benchdnn knob parsing and graph rewriting.
#include "tools/cli_knobs.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include <normgrad/graph/op_checks.hpp>
#include <normgrad/ops/op_registry.hpp>
#include <normgrad/ops/tf_batch_norm.hpp>

namespace normgrad {
namespace cli {
namespace {

// Splits keeping empty pieces ("a++b" gives "a", "", "b"; "" gives one "").
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts(1);
  for (char c : s) {
    if (c == sep) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
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
  return dims;
}

// "abdc" over dims: the last letter is the innermost dim (stride 1).
StatusOr<Dims> tag_strides(const std::string& tag, const Dims& dims, const std::string& what) {
  if (tag.size() != dims.size())
    return invalid_argument(what + ": tag '" + tag + "' has " + std::to_string(tag.size()) +
                            " letters for rank " + std::to_string(dims.size()));
  Dims strides(dims.size(), 0);
  std::vector<bool> seen(dims.size(), false);
  int64_t step = 1;
  for (size_t k = tag.size(); k-- > 0;) {
    const int axis = tag[k] - 'a';
    if (axis < 0 || axis >= static_cast<int>(dims.size()) || seen[axis])
      return invalid_argument(what + ": tag '" + tag + "' is not a permutation of a.." +
                              std::string(1, static_cast<char>('a' + dims.size() - 1)));
    seen[axis] = true;
    strides[axis] = step;
    NG_ASSIGN_OR_RETURN(step, checked_mul(step, std::max<int64_t>(dims[axis], 1), what));
  }
  return strides;
}

// Tensors on an op's per-channel ports (its schema's): statistics, scale,
// shift and their gradients.
std::set<int64_t> statistics_tensors(const Graph& g) {
  std::set<int64_t> ids;
  for (const Op& op : g.ops()) {
    const OpSchema* schema = op_registry().find(op.kind());
    if (schema == nullptr) continue;
    for (size_t i = 0; i < op.inputs().size(); ++i)
      if (schema->is_per_channel(true, i)) ids.insert(op.inputs()[i].id);
    for (size_t i = 0; i < op.outputs().size(); ++i)
      if (schema->is_per_channel(false, i)) ids.insert(op.outputs()[i].id);
  }
  return ids;
}

// The attribute kind of `name` on `op`: its schema's, else the type the file
// gave it, else guessed from the text (opaque ops carry attributes we have no
// schema for; benchdnn rewrites them all the same).
AttrKind attr_kind_for(const Op& op, const std::string& name, const std::string& text) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (const AttrSpec* spec = schema ? schema->find_attr(name) : nullptr) return spec->kind;
  if (auto it = op.attrs().find(name); it != op.attrs().end()) return attr_value_kind(it->second);
  int64_t i;
  if (to_int(text, &i)) return AttrKind::kS64;
  bool ints = true;
  for (const std::string& p : split(text, 'x')) ints = ints && to_int(p, &i);
  if (ints && text.find('x') != std::string::npos) return AttrKind::kS64s;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  if (!text.empty() && *end == '\0') return AttrKind::kF32;
  return AttrKind::kString;
}

// Parses `text` as the kind of attribute `name` of `op`.
StatusOr<AttrValue> typed_value(const Op& op, const std::string& name, const std::string& text) {
  const OpSchema* schema = op_registry().find(op.kind());
  if (schema != nullptr && schema->find_attr(name) == nullptr)
    return invalid_argument("--op-attrs: " + op.label() + " has no attribute '" + name + "'");
  const std::string where = "--op-attrs: " + op.label() + " attribute '" + name + "'";
  auto number = [&](const std::string& t, float* v) {
    char* end = nullptr;
    *v = std::strtof(t.c_str(), &end);
    return !t.empty() && *end == '\0';
  };
  switch (attr_kind_for(op, name, text)) {
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
      float v;
      if (!number(text, &v))
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
      for (const std::string& p : split(text, 'x')) {
        float x;
        if (!number(p, &x))
          return invalid_argument(where + ": expected numbers joined by 'x', got '" + text + "'");
        v.push_back(x);
      }
      return AttrValue(v);
    }
  }
  return invalid_argument(where + ": unsupported type");
}

// Splits "ID:REST" (ID an integer). benchdnn reads the ID with std::stoi,
// which stops at the first non-digit, so its inputs also carry "ID*TAG:REST"
// (a tag left on the ID); that reads as ID here too.
Status id_and_rest(const std::string& item, const std::string& knob, int64_t* id,
                   std::string* rest) {
  const size_t colon = item.find(':');
  std::string head = colon == std::string::npos ? item : item.substr(0, colon);
  if (const size_t star = head.find('*'); star != std::string::npos && star > 0) head.resize(star);
  if (colon == std::string::npos || !to_int(head, id))
    return invalid_argument("--" + knob + ": expected ID:..., got '" + item + "'");
  *rest = item.substr(colon + 1);
  return ok_status();
}

Status parse_in_shapes(const std::string& text, Knobs* knobs) {
  for (const std::string& item : split(text, '+')) {
    int64_t id;
    std::string rest;
    NG_RETURN_IF_ERROR(id_and_rest(item, "in-shapes", &id, &rest));
    InShape& in = knobs->in_shapes[id];
    if (rest == "-") {
      in.rank0 = true;
      in.dims = Dims{};
      continue;
    }
    const size_t star = rest.find('*');
    const std::string shape = rest.substr(0, star);
    if (!shape.empty()) {
      NG_ASSIGN_OR_RETURN(Dims d, parse_dims(shape, "--in-shapes"));
      in.dims = d;
    }
    if (star == std::string::npos) continue;
    const std::string layout = rest.substr(star + 1);
    if (layout.empty()) return invalid_argument("--in-shapes: empty strides in '" + item + "'");
    if (std::isalpha(static_cast<unsigned char>(layout[0]))) {
      if (!std::all_of(layout.begin(), layout.end(), [](char c) { return c >= 'a' && c <= 'l'; }))
        return invalid_argument("--in-shapes: bad tag '" + layout + "' (letters a..l, e.g. acdb)");
      in.tag = layout;
    } else {
      NG_ASSIGN_OR_RETURN(Dims st, parse_dims(layout, "--in-shapes strides"));
      in.strides = st;
    }
    if (!in.dims && !in.tag.empty()) continue;  // resolved against the file's shape
    if (in.dims && in.strides && in.strides->size() != in.dims->size())
      return invalid_argument("--in-shapes: " + std::to_string(in.strides->size()) +
                              " strides for rank " + std::to_string(in.dims->size()));
  }
  return ok_status();
}

Status parse_op_attrs(const std::string& text, Knobs* knobs) {
  for (const std::string& item : split(text, '+')) {
    int64_t id;
    std::string rest;
    NG_RETURN_IF_ERROR(id_and_rest(item, "op-attrs", &id, &rest));
    for (const std::string& attr : split(rest, '*')) {
      const size_t colon = attr.find(':');
      if (colon == std::string::npos || colon == 0)
        return invalid_argument("--op-attrs: expected ID:NAME:VALUE[*NAME:VALUE], got '" + item +
                                "'");
      knobs->op_attrs.push_back({id, attr.substr(0, colon), attr.substr(colon + 1)});
    }
  }
  return ok_status();
}

// Per-id maps "ID:VALUE+ID:VALUE".
Status parse_id_map(const std::string& text, const std::string& knob,
                    std::map<int64_t, std::string>* out) {
  for (const std::string& item : split(text, '+')) {
    int64_t id;
    std::string rest;
    NG_RETURN_IF_ERROR(id_and_rest(item, knob, &id, &rest));
    (*out)[id] = rest;
  }
  return ok_status();
}

// --op-kind=ID:undef: the op goes, and its consumers read the input that
// carries the data through (a unary op's only input; a binary op's produced one).
Status remove_op(Graph* graph, int64_t op_id) {
  std::set<int64_t> produced;
  for (const Op& o : graph->ops()) {
    for (const LogicalTensor& lt : o.outputs()) produced.insert(lt.id);
  }
  const Op op = *graph->op(op_id);
  if (op.outputs().size() != 1 || op.inputs().empty() || op.inputs().size() > 2)
    return invalid_argument("--op-kind: " + op.label() + " is not a unary or binary op");
  // The input that passes through: a unary op's only one; of a binary op's,
  // the one with a producer.
  const LogicalTensor* through = nullptr;
  int with_producer = 0;
  for (const LogicalTensor& in : op.inputs()) {
    const bool has = produced.count(in.id) != 0;
    with_producer += has ? 1 : 0;
    if (through == nullptr || (has && op.inputs().size() == 2)) through = &in;
  }
  if (op.inputs().size() == 2 && with_producer != 1)
    return invalid_argument("--op-kind: " + op.label() +
                            ": cannot tell which input passes through (both or neither have "
                            "producers)");
  const int64_t out_id = op.outputs().front().id;
  NG_RETURN_IF_ERROR(graph->replace_all_uses_with(out_id, *through));
  NG_RETURN_IF_ERROR(graph->erase_op(op_id));
  if (graph->output_ports()) {
    std::vector<int64_t> ports = *graph->output_ports();
    for (int64_t& p : ports) p = p == out_id ? through->id : p;
    graph->set_output_ports(ports);
  }
  return ok_status();
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

bool is_case_knob(const std::string& key) {
  static const char* const kKnobs[] = {"dt",
                                       "in-shapes",
                                       "op-attrs",
                                       "op-kind",
                                       "mb",
                                       "attr-fpmath",
                                       "expected-n-partitions",
                                       "tensor-property"};
  return std::any_of(std::begin(kKnobs), std::end(kKnobs), [&](const char* k) { return key == k; });
}

Status parse_case_knob(const std::string& key, const std::string& value, Knobs* knobs) {
  if (!is_case_knob(key)) return invalid_argument("unknown option --" + key);
  if (!value.empty()) knobs->text[key] = value;
  if (value.empty()) return ok_status();  // "as in the file"
  if (key == "dt") {
    if (value == "undef") return ok_status();
    if (value.find(':') == std::string::npos) {
      NG_ASSIGN_OR_RETURN(DataType dt, parse_dtype(value));
      if (dt != DataType::kF32 && dt != DataType::kBF16 && dt != DataType::kF16)
        return invalid_argument("--dt: expected undef, f32, bf16 or f16, got '" + value + "'");
      knobs->dt = value;
      return ok_status();
    }
    std::map<int64_t, std::string> m;
    NG_RETURN_IF_ERROR(parse_id_map(value, "dt", &m));
    for (const auto& [id, name] : m) {
      auto dt = parse_dtype(name);
      if (!dt.ok()) return dt.status().with_context("--dt");
      knobs->tensor_dts[id] = *dt;
    }
    return ok_status();
  }
  if (key == "in-shapes") return parse_in_shapes(value, knobs);
  if (key == "op-attrs") return parse_op_attrs(value, knobs);
  if (key == "op-kind") return parse_id_map(value, "op-kind", &knobs->op_kinds);
  if (key == "tensor-property") {
    NG_RETURN_IF_ERROR(parse_id_map(value, "tensor-property", &knobs->tensor_properties));
    for (const auto& [id, p] : knobs->tensor_properties) {
      auto prop = parse_property_type(p);
      if (!prop.ok()) return prop.status().with_context("--tensor-property");
    }
    return ok_status();
  }
  if (key == "mb") {
    if (!parse_int(value, 0, int64_t{1} << 40, &knobs->mb))
      return invalid_argument("--mb must be a non-negative integer, got '" + value + "'");
    return ok_status();
  }
  if (key == "expected-n-partitions") {
    if (!parse_int(value, 0, 1 << 20, &knobs->expected_n_partitions))
      return invalid_argument("--expected-n-partitions must be a non-negative integer");
    return ok_status();
  }
  // attr-fpmath: MODE[:true|false], as benchdnn spells it.
  const size_t colon = value.find(':');
  const std::string mode = value.substr(0, colon);
  if (colon != std::string::npos && value.substr(colon + 1) != "true" &&
      value.substr(colon + 1) != "false")
    return invalid_argument("--attr-fpmath: expected MODE[:true|false], got '" + value + "'");
  static const char* const kModes[] = {"strict", "bf16", "f16", "tf32", "any"};
  if (std::none_of(std::begin(kModes), std::end(kModes), [&](const char* m) { return mode == m; }))
    return invalid_argument("--attr-fpmath: unknown mode '" + mode + "'");
  knobs->fpmath = value;
  return ok_status();
}

Status apply_knobs(const Knobs& knobs, Graph* graph) {
  for (const auto& entry : knobs.op_kinds) {
    const int64_t id = entry.first;  // lambdas below capture it (not a binding: C++17)
    const std::string& kind_name = entry.second;
    const Op* found = graph->op(id);
    if (found == nullptr)
      return invalid_argument("--op-kind: the graph has no op " + std::to_string(id));
    if (kind_name == "undef") {
      NG_RETURN_IF_ERROR(remove_op(graph, id));
      continue;
    }
    auto kind = parse_op_kind(kind_name);
    if (!kind.ok()) return kind.status().with_context("--op-kind");
    Op replaced(found->id(), *kind, found->name());
    for (const auto& [k, v] : found->attrs()) replaced.set_attr(k, v);
    for (const LogicalTensor& lt : found->inputs()) replaced.add_input(lt);
    for (const LogicalTensor& lt : found->outputs()) replaced.add_output(lt);
    NG_RETURN_IF_ERROR(graph->replace_op(id, std::move(replaced)).with_context("--op-kind"));
  }
  const std::set<int64_t> stats = statistics_tensors(*graph);
  std::set<int64_t> all_ids;
  for (const Op& op : graph->ops()) {
    for (const auto* ports : {&op.inputs(), &op.outputs()})
      for (const LogicalTensor& lt : *ports) all_ids.insert(lt.id);
  }
  for (const auto& [id, dt] : knobs.tensor_dts) {
    if (!all_ids.count(id))
      return invalid_argument("--dt: tensor " + std::to_string(id) + " is not in the graph");
  }
  for (const auto& [id, p] : knobs.tensor_properties) {
    if (!all_ids.count(id))
      return invalid_argument("--tensor-property: tensor " + std::to_string(id) +
                              " is not in the graph");
  }
  std::optional<DataType> all_dt;
  if (!knobs.dt.empty()) {
    NG_ASSIGN_OR_RETURN(DataType dt, parse_dtype(knobs.dt));
    all_dt = dt;
  }
  // Tensors our ops produce are re-inferred by finalize; an opaque op's
  // outputs keep their declared shape (we cannot infer it).
  std::set<int64_t> produced, seen;
  for (const Op& op : graph->ops()) {
    if (op_kind_is_opaque(op.kind())) continue;
    for (const LogicalTensor& lt : op.outputs()) produced.insert(lt.id);
  }
  std::set<int64_t> graph_produced;
  for (const Op& op : graph->ops()) {
    for (const LogicalTensor& lt : op.outputs()) graph_produced.insert(lt.id);
  }
  const bool reshape = !knobs.in_shapes.empty() || knobs.mb > 0;
  // One tensor's new description; the first failure is kept.
  auto describe = [&](LogicalTensor& lt) -> Status {
    // Floating-point data only: integer and quantized tensors keep their dtype.
    if (all_dt && !stats.count(lt.id) && is_float_compute_dtype(lt.dtype)) lt.dtype = *all_dt;
    if (auto d = knobs.tensor_dts.find(lt.id); d != knobs.tensor_dts.end()) lt.dtype = d->second;
    if (auto p = knobs.tensor_properties.find(lt.id); p != knobs.tensor_properties.end())
      lt.property = *parse_property_type(p->second);
    if (!reshape) return ok_status();
    if (produced.count(lt.id)) {  // re-inferred by finalize
      lt.dims.clear();
      lt.rank_unknown = true;
      lt.strides.clear();
      return ok_status();
    }
    if (auto it = knobs.in_shapes.find(lt.id); it != knobs.in_shapes.end()) {
      const InShape& in = it->second;
      if (in.dims) {
        lt.dims = *in.dims;
        lt.rank_unknown = false;
      }
      lt.strides.clear();
      if (in.strides) lt.strides = *in.strides;
      if (!in.tag.empty()) {
        NG_ASSIGN_OR_RETURN(lt.strides, tag_strides(in.tag, lt.dims, "--in-shapes"));
      }
      seen.insert(lt.id);
    }
    // --mb wins over --in-shapes (benchdnn's rule), on data inputs only.
    if (knobs.mb > 0 && !stats.count(lt.id) && !graph_produced.count(lt.id) && lt.rank() >= 2) {
      lt.dims[0] = knobs.mb;
      if (!lt.strides.empty()) {
        std::string tag;
        std::vector<size_t> axes(lt.dims.size());
        for (size_t k = 0; k < axes.size(); ++k) axes[k] = k;
        std::stable_sort(axes.begin(), axes.end(),
                         [&](size_t a, size_t b) { return lt.strides[a] > lt.strides[b]; });
        for (size_t a : axes) tag += static_cast<char>('a' + a);
        NG_ASSIGN_OR_RETURN(lt.strides, tag_strides(tag, lt.dims, "--mb"));
      }
    }
    return ok_status();
  };
  Status described = ok_status();
  NG_RETURN_IF_ERROR(graph->update_tensors([&](LogicalTensor& lt) {
    if (described.ok()) described = describe(lt);
  }));
  NG_RETURN_IF_ERROR(described);
  for (const auto& [id, in] : knobs.in_shapes) {
    if (!seen.count(id))
      return invalid_argument("--in-shapes: tensor " + std::to_string(id) +
                              " is not a graph input");
  }
  for (const OpAttrRewrite& r : knobs.op_attrs) {
    const Op* found = graph->op(r.op_id);
    if (found == nullptr)
      return invalid_argument("--op-attrs: the graph has no op " + std::to_string(r.op_id));
    Op edited = *found;
    NG_ASSIGN_OR_RETURN(AttrValue v, typed_value(edited, r.name, r.value));
    edited.set_attr(r.name, std::move(v));
    NG_RETURN_IF_ERROR(graph->replace_op(r.op_id, std::move(edited)).with_context("--op-attrs"));
  }
  if (!knobs.fpmath.empty()) {
    const size_t colon = knobs.fpmath.find(':');
    graph->fpmath_mode = knobs.fpmath.substr(0, colon);
    if (colon != std::string::npos)
      graph->fpmath_mode_apply_to_int = knobs.fpmath.substr(colon + 1);
  }
  return ok_status();
}

std::string repro_line(const Knobs& knobs, const std::string& case_path, int64_t seed) {
  std::string s = "--mode=" + knobs.mode;
  if (knobs.backend != "auto") s += " --backend=" + knobs.backend;
  if (seed != 1) s += " --seed=" + std::to_string(seed);
  for (const char* key : {"dt", "mb", "in-shapes", "op-attrs", "op-kind", "attr-fpmath",
                          "expected-n-partitions", "tensor-property"}) {
    if (auto it = knobs.text.find(key); it != knobs.text.end())
      s += std::string(" --") + key + "=" + it->second;
  }
  return s + " --case=" + case_path;
}

}  // namespace cli
}  // namespace normgrad
