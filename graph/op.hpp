// Op: one node of the graph, with its kind, typed attributes and ordered ports.
//
// Attributes are typed as in oneDNN's JSON: s64, s64[], f32, f32[], bool and
// string. Inputs and outputs are logical tensors in the op's port order; tensors
// are joined into a graph by their ids.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <normgrad/graph/logical_tensor.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

enum class OpKind : uint8_t {
#define NG_OP_KIND(id, name) id,
#include <normgrad/graph/op_kinds.def>
  kCount
};

const char* op_kind_name(OpKind kind);
StatusOr<OpKind> parse_op_kind(const std::string& name);

enum class AttrKind : uint8_t { kS64, kS64s, kF32, kF32s, kBool, kString };
const char* attr_kind_name(AttrKind kind);  // "s64", "s64[]", "f32", "f32[]", "bool", "string"
StatusOr<AttrKind> parse_attr_kind(const std::string& name);

using AttrValue =
    std::variant<int64_t, std::vector<int64_t>, float, std::vector<float>, bool, std::string>;
AttrKind attr_value_kind(const AttrValue& value);
std::string attr_value_to_string(const AttrValue& value);

class Op {
 public:
  Op() = default;
  Op(int64_t id, OpKind kind, std::string name = "")
      : id_(id), kind_(kind), name_(std::move(name)) {}

  int64_t id() const { return id_; }
  OpKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  Op& set_attr(const std::string& key, AttrValue value);
  // Literals convert to the attribute's schema type, so set_attr("epsilon",
  // 1e-5) and set_attr("epsilon", 0) store f32, set_attr("groups", 4) an s64,
  // and set_attr("data_format", "NCX") a string (not a bool). An integer that
  // an f32 cannot hold exactly stays s64, and the schema check says so.
  Op& set_attr(const std::string& key, double value);
  Op& set_attr(const std::string& key, bool value) { return set_attr(key, AttrValue(value)); }
  Op& set_attr(const std::string& key, const char* value);
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Op& set_attr(const std::string& key, T value) {
    return set_integer_attr(key, static_cast<int64_t>(value));
  }
  bool has_attr(const std::string& key) const { return attrs_.count(key) != 0; }
  const std::map<std::string, AttrValue>& attrs() const { return attrs_; }
  void erase_attr(const std::string& key) { attrs_.erase(key); }
  // Typed getters; the schema has already checked presence and kind for a verified op.
  StatusOr<float> attr_f32(const std::string& key) const;
  StatusOr<int64_t> attr_s64(const std::string& key) const;
  StatusOr<bool> attr_bool(const std::string& key) const;
  StatusOr<std::string> attr_string(const std::string& key) const;
  StatusOr<std::vector<int64_t>> attr_s64s(const std::string& key) const;

  Op& add_input(LogicalTensor lt);
  Op& add_output(LogicalTensor lt);
  const std::vector<LogicalTensor>& inputs() const { return inputs_; }
  const std::vector<LogicalTensor>& outputs() const { return outputs_; }
  std::vector<LogicalTensor>& mutable_inputs() { return inputs_; }
  std::vector<LogicalTensor>& mutable_outputs() { return outputs_; }

  // The kind as the JSON spelled it when that was an older alias (ReLUBackprop);
  // written back unchanged. Empty: the kind's own name.
  void set_spelling(std::string spelling) { spelling_ = std::move(spelling); }
  const char* kind_spelling() const;

  // "BatchNormTrainingBackward 'bn3'" (or "... #7" without a name): the prefix of every message.
  std::string label() const;

 private:
  Op& set_integer_attr(const std::string& key, int64_t value);

  int64_t id_ = -1;
  OpKind kind_ = OpKind::kEnd;
  std::string name_;
  std::string spelling_;
  std::map<std::string, AttrValue> attrs_;
  std::vector<LogicalTensor> inputs_;
  std::vector<LogicalTensor> outputs_;
};

// One op's identity, for CSE and the backends' plan caches: kind, attributes,
// and every port's dtype, dims, strides and layout, with the tensor ids when
// asked (CSE compares inputs by id; a plan cache does not care which tensor).
std::string op_signature(const Op& op, bool with_input_ids, bool with_output_ids);

}  // namespace normgrad
