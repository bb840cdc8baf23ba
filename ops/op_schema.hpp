// OpSchema: the contract of one op kind, built fluently, checked on every op.
//
// A schema lists the input and output ports (names, optional trailing ports,
// allowed counts), the attributes (kind, required or default, allowed string
// values), a dtype rule, and a shape rule that checks the input shapes and
// fills in the output dims. Messages name the op, the port and the rule:
//   BatchNormTrainingBackward 'bn3': input 4 'gamma' has 63 elements, expected C=64
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

struct PortSpec {
  std::string name;
  bool optional = false;
};

struct AttrSpec {
  std::string name;
  AttrKind kind = AttrKind::kF32;
  bool required = false;
  std::optional<AttrValue> default_value;
  std::vector<std::string> allowed_strings;  // empty: any string
};

class OpSchema {
 public:
  // Checks dtypes or attribute values of an op whose ports and attributes are well formed.
  using Rule = std::function<Status(const Op&)>;
  // Checks input shapes (all known) and sets or checks the output dims.
  using ShapeRule = std::function<Status(Op&)>;

  explicit OpSchema(OpKind kind) : kind_(kind) {}

  OpSchema& input(std::string name, bool optional = false);
  OpSchema& output(std::string name, bool optional = false);
  // Restricts the number of inputs or outputs (default: every count from required to all).
  // Input `in` and output `out` may share a buffer: every backend reads an
  // element of the input before it writes the same element of the output.
  OpSchema& inplace(size_t in, size_t out);
  // Ports of per-channel vectors (statistics, scale, shift, their gradients,
  // TensorFlow's U-typed reserve spaces), as opposed to the data ports:
  // benchdnn's --dt leaves them f32.
  OpSchema& per_channel(bool is_input, size_t port);
  // Ref (the oracle backend) does not run this kind, and `why` says so;
  // by default it runs every kind that has a schema.
  OpSchema& not_on_ref(std::string why) {
    ref_refusal_ = std::move(why);
    return *this;
  }
  OpSchema& input_counts(std::set<size_t> counts);
  OpSchema& output_counts(std::set<size_t> counts);
  OpSchema& attr(std::string name, AttrKind kind, bool required,
                 std::optional<AttrValue> default_value = std::nullopt,
                 std::vector<std::string> allowed_strings = {});
  // Extra checks, run in order after the structural ones.
  OpSchema& rule(Rule rule);
  // The dtypes every port may carry (default: f32, bf16, f16).
  OpSchema& dtypes(std::vector<DataType> allowed);
  OpSchema& shape_rule(ShapeRule rule);

  OpKind kind() const { return kind_; }
  const std::vector<PortSpec>& inputs() const { return inputs_; }
  const std::vector<PortSpec>& outputs() const { return outputs_; }
  const std::vector<AttrSpec>& attrs() const { return attrs_; }
  const AttrSpec* find_attr(const std::string& name) const;
  const std::vector<std::pair<size_t, size_t>>& inplace_pairs() const { return inplace_; }
  bool is_per_channel(bool is_input, size_t port) const {
    return (is_input ? per_channel_inputs_ : per_channel_outputs_).count(port) != 0;
  }
  // Empty when ref runs the kind, else why not.
  const std::string& ref_refusal() const { return ref_refusal_; }
  std::string input_name(size_t i) const;
  std::string output_name(size_t i) const;

  // Port counts, attributes (unknown, missing, wrong type, disallowed value),
  // per-tensor sanity and dtypes. Shapes are not needed.
  Status verify_structure(const Op& op) const;
  // Runs the shape rule; every input must have known dims.
  Status infer_shapes(Op& op) const;

 private:
  // verify_structure's parts: quick checks with no messages built, and the
  // checks with their messages, run only when a quick one fails.
  static bool count_allowed(size_t n, const std::vector<PortSpec>& ports,
                            const std::set<size_t>& allowed);
  bool attrs_plain(const Op& op) const;
  Status verify_structure_slow(const Op& op) const;
  Status verify_ports(const Op& op) const;

  OpKind kind_;
  std::vector<PortSpec> inputs_;
  std::vector<PortSpec> outputs_;
  std::set<size_t> input_counts_;
  std::set<size_t> output_counts_;
  std::vector<AttrSpec> attrs_;
  std::vector<Rule> rules_;
  std::vector<DataType> dtypes_;                    // empty: f32, bf16, f16
  std::vector<std::pair<size_t, size_t>> inplace_;  // (input port, output port)
  std::set<size_t> per_channel_inputs_, per_channel_outputs_;
  ShapeRule shape_rule_;
  std::string ref_refusal_;
};

// Message helpers shared by the schema files, so every rule reads alike.
std::string port_label(const Op& op, bool is_input, size_t index, const std::string& port_name);
// Sets `out.dims` to `dims` when unknown, or checks that the known ones agree.
Status set_or_check_dims(Op& op, size_t out_index, const std::string& out_name, const Dims& dims);

}  // namespace normgrad
