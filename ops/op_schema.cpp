// OpSchema: structural verification and the shared message helpers.
#include <normgrad/ops/op_schema.hpp>

#include <algorithm>
#include <cmath>

namespace normgrad {

OpSchema& OpSchema::input(std::string name, bool optional) {
  assert((optional || inputs_.empty() || !inputs_.back().optional) &&
         "required ports must precede optional ones");
  inputs_.push_back({std::move(name), optional});
  return *this;
}

OpSchema& OpSchema::output(std::string name, bool optional) {
  assert((optional || outputs_.empty() || !outputs_.back().optional) &&
         "required ports must precede optional ones");
  outputs_.push_back({std::move(name), optional});
  return *this;
}

OpSchema& OpSchema::input_counts(std::set<size_t> counts) {
  input_counts_ = std::move(counts);
  return *this;
}

OpSchema& OpSchema::output_counts(std::set<size_t> counts) {
  output_counts_ = std::move(counts);
  return *this;
}

OpSchema& OpSchema::attr(std::string name, AttrKind kind, bool required,
                         std::optional<AttrValue> default_value,
                         std::vector<std::string> allowed_strings) {
  attrs_.push_back(
      {std::move(name), kind, required, std::move(default_value), std::move(allowed_strings)});
  return *this;
}

OpSchema& OpSchema::rule(Rule rule) {
  rules_.push_back(std::move(rule));
  return *this;
}

OpSchema& OpSchema::shape_rule(ShapeRule rule) {
  shape_rule_ = std::move(rule);
  return *this;
}

const AttrSpec* OpSchema::find_attr(const std::string& name) const {
  for (const AttrSpec& a : attrs_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string OpSchema::input_name(size_t i) const {
  return i < inputs_.size() ? inputs_[i].name : "?";
}
std::string OpSchema::output_name(size_t i) const {
  return i < outputs_.size() ? outputs_[i].name : "?";
}

namespace {

size_t required_count(const std::vector<PortSpec>& ports) {
  size_t n = 0;
  for (const PortSpec& p : ports) n += p.optional ? 0 : 1;
  return n;
}

std::string count_range(size_t lo, size_t hi) {
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
}

Status check_count(const std::string& who, const char* what, size_t n,
                   const std::vector<PortSpec>& ports, const std::set<size_t>& allowed) {
  if (allowed.empty()) {
    const size_t lo = required_count(ports);
    if (n >= lo && n <= ports.size()) return ok_status();
    return invalid_argument(who + ": has " + std::to_string(n) + " " + what + ", expected " +
                            count_range(lo, ports.size()));
  }
  if (allowed.count(n) != 0) return ok_status();
  std::string list;
  for (size_t c : allowed) list += (list.empty() ? "" : " or ") + std::to_string(c);
  return invalid_argument(who + ": has " + std::to_string(n) + " " + what + ", expected " + list);
}

const std::vector<DataType>& allowed_dtypes(const std::vector<DataType>& given) {
  static const std::vector<DataType> kFloats = {DataType::kF32, DataType::kBF16, DataType::kF16};
  return given.empty() ? kFloats : given;
}

bool dtype_allowed(DataType dt, const std::vector<DataType>& given) {
  const std::vector<DataType>& allowed = allowed_dtypes(given);
  return std::find(allowed.begin(), allowed.end(), dt) != allowed.end();
}

Status check_dtype(const std::string& where, DataType dt, const std::vector<DataType>& given) {
  const std::vector<DataType>& allowed = allowed_dtypes(given);
  if (std::find(allowed.begin(), allowed.end(), dt) != allowed.end()) return ok_status();
  std::string list;
  for (DataType a : allowed) list += (list.empty() ? "" : ", ") + std::string(dtype_name(a));
  return invalid_argument(where + ": dtype " + dtype_name(dt) + " is not supported (expected " +
                          list + ")");
}

}  // namespace

OpSchema& OpSchema::inplace(size_t in, size_t out) {
  inplace_.emplace_back(in, out);
  return *this;
}

OpSchema& OpSchema::per_channel(bool is_input, size_t port) {
  (is_input ? per_channel_inputs_ : per_channel_outputs_).insert(port);
  return *this;
}

OpSchema& OpSchema::dtypes(std::vector<DataType> allowed) {
  dtypes_ = std::move(allowed);
  return *this;
}

Status OpSchema::verify_structure(const Op& op) const {
  const size_t nin = op.inputs().size();
  const size_t nout = op.outputs().size();
  if (!count_allowed(nin, inputs_, input_counts_) ||
      !count_allowed(nout, outputs_, output_counts_) || !attrs_plain(op)) {
    return verify_structure_slow(op);
  }
  return verify_ports(op);
}

// The counts are fine when this holds (check_count's success conditions).
bool OpSchema::count_allowed(size_t n, const std::vector<PortSpec>& ports,
                             const std::set<size_t>& allowed) {
  if (allowed.empty()) return n >= required_count(ports) && n <= ports.size();
  return allowed.count(n) != 0;
}

// Every attribute known, of its kind and (strings) an allowed value, and
// every required one present: what verify_structure_slow checks with messages.
bool OpSchema::attrs_plain(const Op& op) const {
  for (const auto& [key, value] : op.attrs()) {
    const AttrSpec* spec = find_attr(key);
    if (spec == nullptr || attr_value_kind(value) != spec->kind) return false;
    if (const auto* s = std::get_if<std::string>(&value); s && !spec->allowed_strings.empty()) {
      if (std::find(spec->allowed_strings.begin(), spec->allowed_strings.end(), *s) ==
          spec->allowed_strings.end())
        return false;
    }
  }
  for (const AttrSpec& a : attrs_) {
    if (a.required && !op.has_attr(a.name)) return false;
  }
  return true;
}

Status OpSchema::verify_structure_slow(const Op& op) const {
  const std::string who = op.label();
  const size_t nin = op.inputs().size();
  const size_t nout = op.outputs().size();
  NG_RETURN_IF_ERROR(check_count(who, "inputs", nin, inputs_, input_counts_));
  NG_RETURN_IF_ERROR(check_count(who, "outputs", nout, outputs_, output_counts_));
  for (const auto& [key, value] : op.attrs()) {
    const AttrSpec* spec = find_attr(key);
    if (spec == nullptr) {
      std::string known;
      for (const AttrSpec& a : attrs_) known += (known.empty() ? "" : ", ") + a.name;
      return invalid_argument(who + ": unknown attribute '" + key +
                              "' (known: " + (known.empty() ? "none" : known) + ")");
    }
    if (attr_value_kind(value) != spec->kind) {
      return invalid_argument(who + ": attribute '" + key + "' has type " +
                              attr_kind_name(attr_value_kind(value)) + ", expected " +
                              attr_kind_name(spec->kind));
    }
    if (const auto* s = std::get_if<std::string>(&value); s && !spec->allowed_strings.empty()) {
      bool found = false;
      std::string allowed;
      for (const std::string& a : spec->allowed_strings) {
        found = found || a == *s;
        allowed += (allowed.empty() ? "" : ", ") + a;
      }
      if (!found) {
        return invalid_argument(who + ": attribute '" + key + "' is '" + *s +
                                "', expected one of " + allowed);
      }
    }
  }
  for (const AttrSpec& a : attrs_) {
    if (a.required && !op.has_attr(a.name)) {
      return invalid_argument(who + ": required attribute '" + a.name + "' is missing");
    }
  }
  return verify_ports(op);
}

Status OpSchema::verify_ports(const Op& op) const {
  const size_t nin = op.inputs().size();
  const size_t nout = op.outputs().size();
  for (size_t i = 0; i < nin; ++i) {
    const LogicalTensor& lt = op.inputs()[i];
    // The port's name only for a message: building it for every port was a
    // measured share of finalizing a large graph.
    const auto where = [&] { return port_label(op, true, i, input_name(i)); };
    if (lt.id < 0)
      return invalid_argument(where() + ": tensor id " + std::to_string(lt.id) + " is negative");
    if (lt.dtype == DataType::kUndef) return invalid_argument(where() + ": dtype is undef");
    if (!dtype_allowed(lt.dtype, dtypes_))
      NG_RETURN_IF_ERROR(check_dtype(where(), lt.dtype, dtypes_));
    if (!lt.is_valid()) NG_RETURN_IF_ERROR(lt.validate(where()));
  }
  for (size_t i = 0; i < nout; ++i) {
    const LogicalTensor& lt = op.outputs()[i];
    // The port's name only for a message: building it for every port was a
    // measured share of finalizing a large graph.
    const auto where = [&] { return port_label(op, false, i, output_name(i)); };
    if (lt.id < 0)
      return invalid_argument(where() + ": tensor id " + std::to_string(lt.id) + " is negative");
    if (lt.dtype == DataType::kUndef) return invalid_argument(where() + ": dtype is undef");
    if (!dtype_allowed(lt.dtype, dtypes_))
      NG_RETURN_IF_ERROR(check_dtype(where(), lt.dtype, dtypes_));
    if (!lt.is_valid()) NG_RETURN_IF_ERROR(lt.validate(where()));
  }
  for (const Rule& r : rules_) NG_RETURN_IF_ERROR(r(op));
  return ok_status();
}

Status OpSchema::infer_shapes(Op& op) const {
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    if (!op.inputs()[i].dims_known()) {
      return invalid_argument(port_label(op, true, i, input_name(i)) + ": shape is unknown (" +
                              dims_to_string(op.inputs()[i].dims) + ")");
    }
  }
  if (shape_rule_) NG_RETURN_IF_ERROR(shape_rule_(op));
  for (size_t i = 0; i < op.outputs().size(); ++i) {
    NG_RETURN_IF_ERROR(op.outputs()[i].validate(port_label(op, false, i, output_name(i))));
  }
  return ok_status();
}

std::string port_label(const Op& op, bool is_input, size_t index, const std::string& port_name) {
  return op.label() + ": " + (is_input ? "input " : "output ") + std::to_string(index) + " '" +
         port_name + "'";
}

Status set_or_check_dims(Op& op, size_t out_index, const std::string& out_name, const Dims& dims) {
  LogicalTensor& out = op.mutable_outputs()[out_index];
  // An output declared with no dims (`{}`, as the first API documented it)
  // takes the inferred shape; rank 0 is never inferred for a ranked result.
  if (!out.rank_known() || (out.dims.empty() && !dims.empty())) {
    out.dims = dims;
    out.rank_unknown = false;
    out.strides.clear();
    return ok_status();
  }
  bool agree = out.dims.size() == dims.size();
  for (size_t i = 0; agree && i < dims.size(); ++i) {
    agree = out.dims[i] == kUnknownDim || out.dims[i] == dims[i];
  }
  if (!agree) {
    return invalid_argument(port_label(op, false, out_index, out_name) + ": shape " +
                            dims_to_string(out.dims) + " does not match the inferred " +
                            dims_to_string(dims));
  }
  out.dims = dims;
  return ok_status();
}

}  // namespace normgrad
