// Op: kind names, attribute kinds and typed attribute access.
#include <normgrad/graph/op.hpp>

#include <optional>
#include <sstream>

#include <normgrad/graph/op_checks.hpp>

namespace normgrad {
namespace {

const char* const kOpKindNames[] = {
#define NG_OP_KIND(id, name) name,
#include <normgrad/graph/op_kinds.def>
};

template <typename T>
StatusOr<T> get_typed(const Op& op, const std::map<std::string, AttrValue>& attrs,
                      const std::string& key, AttrKind expected) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return not_found(op.label() + ": attribute '" + key + "' is not set");
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  return invalid_argument(op.label() + ": attribute '" + key + "' has type " +
                          attr_kind_name(attr_value_kind(it->second)) + ", expected " +
                          attr_kind_name(expected));
}

}  // namespace

const char* op_kind_name(OpKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < static_cast<size_t>(OpKind::kCount) ? kOpKindNames[i] : "?";
}

StatusOr<OpKind> parse_op_kind(const std::string& name) {
  for (size_t i = 0; i < static_cast<size_t>(OpKind::kCount); ++i) {
    if (name == kOpKindNames[i]) return static_cast<OpKind>(i);
  }
  // Earlier versions of oneDNN Graph's op set said "Backprop" where it now says
  // "Backward" (ReLUBackprop, BiasAddBackprop, ConvolutionBackpropData, and
  // ConvolutionBackpropFilters for ConvolutionBackwardWeights); its own inputs
  // still carry some of them.
  std::string modern = name;
  if (const size_t at = modern.find("BackpropFilters"); at != std::string::npos) {
    modern.replace(at, 15, "BackwardWeights");
  } else if (const size_t at2 = modern.find("Backprop"); at2 != std::string::npos) {
    modern.replace(at2, 8, "Backward");
  }
  if (modern != name) {
    for (size_t i = 0; i < static_cast<size_t>(OpKind::kCount); ++i) {
      if (modern == kOpKindNames[i]) return static_cast<OpKind>(i);
    }
  }
  return invalid_argument("unknown op kind '" + name + "' (not a oneDNN Graph or TensorFlow op)");
}

const char* attr_kind_name(AttrKind kind) {
  switch (kind) {
    case AttrKind::kS64:
      return "s64";
    case AttrKind::kS64s:
      return "s64[]";
    case AttrKind::kF32:
      return "f32";
    case AttrKind::kF32s:
      return "f32[]";
    case AttrKind::kBool:
      return "bool";
    case AttrKind::kString:
      return "string";
  }
  return "?";
}

StatusOr<AttrKind> parse_attr_kind(const std::string& name) {
  for (AttrKind k : {AttrKind::kS64, AttrKind::kS64s, AttrKind::kF32, AttrKind::kF32s,
                     AttrKind::kBool, AttrKind::kString}) {
    if (name == attr_kind_name(k)) return k;
  }
  return invalid_argument("unknown attribute type '" + name + "'");
}

AttrKind attr_value_kind(const AttrValue& value) {
  switch (value.index()) {
    case 0:
      return AttrKind::kS64;
    case 1:
      return AttrKind::kS64s;
    case 2:
      return AttrKind::kF32;
    case 3:
      return AttrKind::kF32s;
    case 4:
      return AttrKind::kBool;
    default:
      return AttrKind::kString;
  }
}

std::string attr_value_to_string(const AttrValue& value) {
  std::ostringstream os;
  os.precision(9);
  if (auto* i = std::get_if<int64_t>(&value)) os << *i;
  if (auto* f = std::get_if<float>(&value)) os << *f;
  if (auto* b = std::get_if<bool>(&value)) os << (*b ? "true" : "false");
  if (auto* s = std::get_if<std::string>(&value)) os << *s;
  if (auto* v = std::get_if<std::vector<int64_t>>(&value)) {
    os << '[';
    for (size_t i = 0; i < v->size(); ++i) os << (i ? "," : "") << (*v)[i];
    os << ']';
  }
  if (auto* v = std::get_if<std::vector<float>>(&value)) {
    os << '[';
    for (size_t i = 0; i < v->size(); ++i) os << (i ? "," : "") << (*v)[i];
    os << ']';
  }
  return os.str();
}

Op& Op::set_attr(const std::string& key, double value) {
  return set_attr(key, AttrValue(static_cast<float>(value)));
}

Op& Op::set_attr(const std::string& key, const char* value) {
  return set_attr(key, AttrValue(std::string(value)));
}

Op& Op::set_integer_attr(const std::string& key, int64_t value) {
  const std::optional<AttrKind> kind = schema_attr_kind(kind_, key);
  if (kind == AttrKind::kF32) {
    const auto f = static_cast<float>(value);
    if (static_cast<int64_t>(f) == value) return set_attr(key, AttrValue(f));
  }
  return set_attr(key, AttrValue(value));
}

Op& Op::set_attr(const std::string& key, AttrValue value) {
  attrs_[key] = std::move(value);
  return *this;
}

StatusOr<float> Op::attr_f32(const std::string& key) const {
  return get_typed<float>(*this, attrs_, key, AttrKind::kF32);
}
StatusOr<int64_t> Op::attr_s64(const std::string& key) const {
  return get_typed<int64_t>(*this, attrs_, key, AttrKind::kS64);
}
StatusOr<bool> Op::attr_bool(const std::string& key) const {
  return get_typed<bool>(*this, attrs_, key, AttrKind::kBool);
}
StatusOr<std::string> Op::attr_string(const std::string& key) const {
  return get_typed<std::string>(*this, attrs_, key, AttrKind::kString);
}
StatusOr<std::vector<int64_t>> Op::attr_s64s(const std::string& key) const {
  return get_typed<std::vector<int64_t>>(*this, attrs_, key, AttrKind::kS64s);
}

Op& Op::add_input(LogicalTensor lt) {
  inputs_.push_back(std::move(lt));
  return *this;
}

Op& Op::add_output(LogicalTensor lt) {
  outputs_.push_back(std::move(lt));
  return *this;
}

const char* Op::kind_spelling() const {
  return spelling_.empty() ? op_kind_name(kind_) : spelling_.c_str();
}

std::string Op::label() const {
  std::string s = kind_spelling();
  if (!name_.empty()) return s + " '" + name_ + "'";
  return s + " #" + std::to_string(id_);
}

std::string op_signature(const Op& op, bool with_input_ids, bool with_output_ids) {
  std::string sig = op.kind_spelling();
  for (const auto& [k, v] : op.attrs()) sig += "|" + k + "=" + attr_value_to_string(v);
  auto port = [&](char tag, const LogicalTensor& lt, bool with_id) {
    sig += std::string("|") + tag;
    if (with_id) sig += std::to_string(lt.id) + ":";
    sig += std::string(dtype_name(lt.dtype)) + ":" +
           (lt.rank_unknown ? std::string("?") : dims_to_string(lt.dims)) + "/";
    if (lt.dims_known()) {
      for (int64_t s : lt.effective_strides()) sig += std::to_string(s) + ",";
    }
    sig += layout_type_name(lt.layout);
  };
  for (const LogicalTensor& lt : op.inputs()) port('i', lt, with_input_ids);
  for (const LogicalTensor& lt : op.outputs()) port('o', lt, with_output_ids);
  return sig;
}

}  // namespace normgrad
