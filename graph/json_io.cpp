// JSON I/O for graphs: a location-tracking reader over nlohmann::json and a writer.
#include <normgrad/graph/json_io.hpp>

#include <normgrad/graph/json_scan.hpp>
#include <normgrad/graph/limits.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace normgrad {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Nesting depth of JSON text, scanning strings correctly; stops early past `limit`.
int json_depth(const std::string& text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return max_depth;
}

const char* json_type(const Json& j) {
  return j.type_name();
}

Status at(const std::string& where, const std::string& what) {
  return invalid_argument(where + ": " + what);
}

Status check_keys(const Json& obj, const std::string& where,
                  std::initializer_list<const char*> known) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      return at(where, "unknown key '" + it.key() + "' (expected " + list + ")");
    }
  }
  return ok_status();
}

StatusOr<const Json*> member(const Json& obj, const std::string& where, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return at(where, std::string("missing key '") + key + "'");
  return &*it;
}

StatusOr<int64_t> as_int(const Json& j, const std::string& where) {
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_unsigned()) {
    const auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return at(where, "integer " + std::to_string(u) + " does not fit in int64");
    }
    return static_cast<int64_t>(u);
  }
  return at(where, std::string("expected an integer, got ") + json_type(j));
}

StatusOr<std::string> as_string(const Json& j, const std::string& where) {
  if (!j.is_string()) return at(where, std::string("expected a string, got ") + json_type(j));
  return j.get<std::string>();
}

StatusOr<std::vector<int64_t>> as_int_array(const Json& j, const std::string& where) {
  if (!j.is_array())
    return at(where, std::string("expected an array of integers, got ") + json_type(j));
  std::vector<int64_t> v;
  v.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    NG_ASSIGN_OR_RETURN(int64_t x, as_int(j[i], where + "[" + std::to_string(i) + "]"));
    v.push_back(x);
  }
  return v;
}

StatusOr<float> as_f32(const Json& j, const std::string& where) {
  if (!j.is_number()) return at(where, std::string("expected a number, got ") + json_type(j));
  const double d = j.get<double>();
  if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
    return at(where, "value " + std::to_string(d) + " does not fit in f32");
  }
  return static_cast<float>(d);
}

StatusOr<bool> as_bool(const Json& j, const std::string& where) {
  if (j.is_boolean()) return j.get<bool>();
  // oneDNN's dump writes bools as 0/1.
  if (j.is_number_integer() || j.is_number_unsigned()) {
    const auto v = j.get<int64_t>();
    if (v == 0 || v == 1) return v == 1;
  }
  return at(where, std::string("expected a bool (true, false, 0 or 1), got ") + j.dump());
}

StatusOr<AttrValue> parse_attr(const Json& j, const std::string& where) {
  if (!j.is_object()) return at(where, std::string("expected an object, got ") + json_type(j));
  NG_RETURN_IF_ERROR(check_keys(j, where, {"type", "value"}));
  NG_ASSIGN_OR_RETURN(const Json* type_j, member(j, where, "type"));
  NG_ASSIGN_OR_RETURN(const Json* value_j, member(j, where, "value"));
  NG_ASSIGN_OR_RETURN(std::string type, as_string(*type_j, where + ".type"));
  auto kind = parse_attr_kind(type);
  if (!kind.ok()) return kind.status().with_context(where + ".type");
  const std::string vw = where + ".value";
  switch (*kind) {
    case AttrKind::kS64: {
      NG_ASSIGN_OR_RETURN(int64_t v, as_int(*value_j, vw));
      return AttrValue(v);
    }
    case AttrKind::kS64s: {
      NG_ASSIGN_OR_RETURN(std::vector<int64_t> v, as_int_array(*value_j, vw));
      return AttrValue(std::move(v));
    }
    case AttrKind::kF32: {
      NG_ASSIGN_OR_RETURN(float v, as_f32(*value_j, vw));
      return AttrValue(v);
    }
    case AttrKind::kF32s: {
      if (!value_j->is_array()) return at(vw, "expected an array of numbers");
      std::vector<float> v;
      for (size_t i = 0; i < value_j->size(); ++i) {
        NG_ASSIGN_OR_RETURN(float x, as_f32((*value_j)[i], vw + "[" + std::to_string(i) + "]"));
        v.push_back(x);
      }
      return AttrValue(std::move(v));
    }
    case AttrKind::kBool: {
      NG_ASSIGN_OR_RETURN(bool v, as_bool(*value_j, vw));
      return AttrValue(v);
    }
    case AttrKind::kString: {
      NG_ASSIGN_OR_RETURN(std::string v, as_string(*value_j, vw));
      return AttrValue(std::move(v));
    }
  }
  return at(where, "unreachable attribute kind");
}

StatusOr<LogicalTensor> parse_tensor(const Json& j, const std::string& where) {
  if (!j.is_object()) return at(where, std::string("expected an object, got ") + json_type(j));
  NG_RETURN_IF_ERROR(
      check_keys(j, where, {"id", "dtype", "shape", "stride", "layout_type", "property_type"}));
  TensorFields f;
  NG_ASSIGN_OR_RETURN(const Json* id_j, member(j, where, "id"));
  NG_ASSIGN_OR_RETURN(f.id, as_int(*id_j, where + ".id"));
  NG_ASSIGN_OR_RETURN(const Json* dt_j, member(j, where, "dtype"));
  NG_ASSIGN_OR_RETURN(f.dtype, as_string(*dt_j, where + ".dtype"));
  NG_ASSIGN_OR_RETURN(const Json* shape_j, member(j, where, "shape"));
  NG_ASSIGN_OR_RETURN(f.shape, as_int_array(*shape_j, where + ".shape"));
  if (auto it = j.find("stride"); it != j.end()) {
    NG_ASSIGN_OR_RETURN(f.stride, as_int_array(*it, where + ".stride"));
  }
  if (auto it = j.find("layout_type"); it != j.end()) {
    NG_ASSIGN_OR_RETURN(f.layout_type, as_string(*it, where + ".layout_type"));
  }
  if (auto it = j.find("property_type"); it != j.end()) {
    NG_ASSIGN_OR_RETURN(f.property_type, as_string(*it, where + ".property_type"));
  }
  return finish_tensor(std::move(f), where);
}

StatusOr<Op> parse_op(const Json& j, const std::string& where) {
  if (!j.is_object()) return at(where, std::string("expected an object, got ") + json_type(j));
  NG_RETURN_IF_ERROR(check_keys(j, where, {"id", "name", "kind", "attrs", "inputs", "outputs"}));
  NG_ASSIGN_OR_RETURN(const Json* id_j, member(j, where, "id"));
  NG_ASSIGN_OR_RETURN(int64_t id, as_int(*id_j, where + ".id"));
  NG_ASSIGN_OR_RETURN(const Json* kind_j, member(j, where, "kind"));
  NG_ASSIGN_OR_RETURN(std::string kind_name, as_string(*kind_j, where + ".kind"));
  auto kind = parse_op_kind(kind_name);
  if (!kind.ok()) return kind.status().with_context(where + ".kind");
  std::string name;
  if (auto it = j.find("name"); it != j.end()) {
    NG_ASSIGN_OR_RETURN(name, as_string(*it, where + ".name"));
  }
  Op op(id, *kind, name);
  if (kind_name != op_kind_name(*kind)) op.set_spelling(kind_name);
  if (auto it = j.find("attrs"); it != j.end()) {
    if (!it->is_object())
      return at(where + ".attrs", std::string("expected an object, got ") + json_type(*it));
    for (auto a = it->begin(); a != it->end(); ++a) {
      NG_ASSIGN_OR_RETURN(AttrValue v, parse_attr(a.value(), where + ".attrs." + a.key()));
      op.set_attr(a.key(), std::move(v));
    }
  }
  for (const char* port : {"inputs", "outputs"}) {
    NG_ASSIGN_OR_RETURN(const Json* arr, member(j, where, port));
    const std::string pw = where + "." + port;
    if (!arr->is_array()) return at(pw, std::string("expected an array, got ") + json_type(*arr));
    for (size_t i = 0; i < arr->size(); ++i) {
      NG_ASSIGN_OR_RETURN(LogicalTensor lt,
                          parse_tensor((*arr)[i], pw + "[" + std::to_string(i) + "]"));
      if (port[0] == 'i') {
        op.add_input(std::move(lt));
      } else {
        op.add_output(std::move(lt));
      }
    }
  }
  return op;
}

}  // namespace

StatusOr<std::string> read_text_file(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return invalid_argument(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open file");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return invalid_argument(path + ": cannot determine the file size");
  if (static_cast<uint64_t>(size) > max_bytes) {
    return out_of_range(path + ": file is " + std::to_string(size) + " bytes, the limit is " +
                        std::to_string(max_bytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) return invalid_argument(path + ": read failed");
  return text;
}

namespace {

// The root's members other than "graph", checked and set on `g`.
Status apply_root(const Json& root, Graph& g) {
  const std::string where = "<root>";
  if (!root.is_object())
    return at(where, std::string("expected an object, got ") + json_type(root));
  NG_RETURN_IF_ERROR(
      check_keys(root, where,
                 {"version", "engine_kind", "fpmath_mode", "fpmath_mode_apply_to_int",
                  "input_ports", "output_ports", "graph"}));
  if (auto it = root.find("version"); it != root.end()) {
    NG_ASSIGN_OR_RETURN(g.version, as_string(*it, "version"));
  }
  if (auto it = root.find("engine_kind"); it != root.end()) {
    NG_ASSIGN_OR_RETURN(g.engine_kind, as_string(*it, "engine_kind"));
    // benchdnn takes the engine from its --engine knob, not from the file: a
    // gpu-tagged graph loads and is partitioned for the CPU (the CLI says so).
    if (g.engine_kind != "cpu" && g.engine_kind != "gpu") {
      return at("engine_kind", "unknown engine '" + g.engine_kind + "' (expected cpu or gpu)");
    }
  }
  if (auto it = root.find("fpmath_mode"); it != root.end()) {
    NG_ASSIGN_OR_RETURN(g.fpmath_mode, as_string(*it, "fpmath_mode"));
    static const char* const kModes[] = {"strict", "bf16", "f16", "tf32", "any"};
    bool known = false;
    for (const char* m : kModes) known = known || g.fpmath_mode == m;
    if (!known) return at("fpmath_mode", "unknown mode '" + g.fpmath_mode + "'");
  }
  if (auto it = root.find("fpmath_mode_apply_to_int"); it != root.end()) {
    // Written as the string "true"/"false" by oneDNN's dump; a bool is accepted too.
    if (it->is_string()) {
      const std::string s = it->get<std::string>();
      if (s != "true" && s != "false")
        return at("fpmath_mode_apply_to_int", "expected 'true' or 'false', got '" + s + "'");
      g.fpmath_mode_apply_to_int = s;
    } else {
      NG_ASSIGN_OR_RETURN(bool b, as_bool(*it, "fpmath_mode_apply_to_int"));
      g.fpmath_mode_apply_to_int = b ? "true" : "false";
    }
  }
  if (auto it = root.find("input_ports"); it != root.end()) {
    NG_ASSIGN_OR_RETURN(std::vector<int64_t> ports, as_int_array(*it, "input_ports"));
    g.set_input_ports(std::move(ports));
  }
  if (auto it = root.find("output_ports"); it != root.end()) {
    NG_ASSIGN_OR_RETURN(std::vector<int64_t> ports, as_int_array(*it, "output_ports"));
    g.set_output_ports(std::move(ports));
  }
  return ok_status();
}

}  // namespace

StatusOr<Graph> graph_from_json(const std::string& text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes ||
      static_cast<int64_t>(text.size()) > resource_limits().max_json_bytes) {
    return out_of_range("JSON text is " + std::to_string(text.size()) + " bytes, the limit is " +
                        std::to_string(limits.max_bytes));
  }
  const int depth = json_depth(text, limits.max_depth);
  if (depth > limits.max_depth) {
    return out_of_range("JSON nesting deeper than the limit of " +
                        std::to_string(limits.max_depth));
  }
  const size_t op_limit = std::min(
      limits.max_ops, static_cast<size_t>(std::max<int64_t>(0, resource_limits().max_ops)));
  if (limits.fast_reader) {
    // The fast reader first (graph/json_scan.hpp); where it gives up, the
    // checked reader below reads the text again and says what is wrong.
    Graph fast;
    std::string root_rest;
    if (scan_graph_json(text, op_limit, &fast, &root_rest)) {
      Json root;
      try {
        root = Json::parse(root_rest);
      } catch (const Json::exception&) {
        root = nullptr;  // a root member the checked reader must judge
      }
      if (root.is_object()) {
        NG_RETURN_IF_ERROR(apply_root(root, fast));
        return fast;
      }
    }
  }
  // Each op of "graph" is converted and added as soon as its object is
  // parsed, then dropped from the document (the parser callback returns
  // false), so memory holds the text, the graph and one op's JSON, not a
  // DOM of the whole file (which for 10^5 ops was over 1 GB).
  Graph g;
  Status op_error;
  size_t n_ops = 0;
  bool in_graph = false;
  struct StopParse {};  // thrown from the callback after an op error; caught below
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key) in_graph = parsed == "graph";
    if (!in_graph || depth != 2 || event != Json::parse_event_t::object_end) return true;
    const std::string ow = "graph[" + std::to_string(n_ops) + "]";
    if (++n_ops > op_limit) {
      op_error =
          out_of_range("graph: more than " + std::to_string(op_limit) + " ops exceed the limit");
      throw StopParse{};
    }
    auto op = parse_op(parsed, ow);
    Status added = op.ok() ? g.add_op(std::move(op).value()) : op.status();
    if (!added.ok()) {
      op_error = op.ok() ? added.with_context(ow) : added;
      throw StopParse{};
    }
    return false;  // converted: not kept in the document
  };
  Json root;
  try {
    root = Json::parse(text, on_event);
  } catch (const StopParse&) {
    return op_error;
  } catch (const Json::exception& e) {
    return invalid_argument(std::string("malformed JSON: ") + e.what());
  }
  NG_RETURN_IF_ERROR(apply_root(root, g));
  const std::string where = "<root>";
  NG_ASSIGN_OR_RETURN(const Json* ops, member(root, where, "graph"));
  // What is left of "graph": [] when every element was an op object (each
  // taken above), the first element of another type otherwise.
  if (!ops->is_array())
    return at("graph", std::string("expected an array, got ") + json_type(*ops));
  for (const Json& left : *ops) {
    if (!left.is_object()) {
      return at("graph", std::string("expected an array of op objects, got an element of type ") +
                             json_type(left));
    }
  }
  return g;
}

StatusOr<Graph> load_graph(const std::string& path, const JsonLimits& limits) {
  const size_t cap =
      std::min(limits.max_bytes, static_cast<size_t>(resource_limits().max_json_bytes));
  NG_ASSIGN_OR_RETURN(std::string text, read_text_file(path, cap));
  auto g = graph_from_json(text, limits);
  if (!g.ok()) return g.status().with_context(path);
  return g;
}

namespace {

// A pretty printer with nlohmann's dump(2) layout, written straight into one
// string: the ops of a large graph need no document of their own. Strings
// and floats go through nlohmann (its escaping, its shortest round-trip
// form), integers through to_chars.
class PrettyWriter {
 public:
  explicit PrettyWriter(std::string* out, int indent) : out_(*out), indent_(indent) {}
  void begin(char bracket) {
    out_ += bracket;
    ++indent_;
    first_ = true;
  }
  void end(char bracket) {
    --indent_;
    if (!first_) newline();
    out_ += bracket;
    first_ = false;
  }
  void key(const char* k) {
    item();
    out_ += '"';
    out_ += k;
    out_ += "\": ";
  }
  void key_json(const std::string& k) {  // a name that may need escaping
    item();
    string(k);
    out_ += ": ";
  }
  void item() {
    if (!first_) out_ += ',';
    newline();
    first_ = true;  // the value that follows opens no item of its own
  }
  void value(int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out_.append(buf, r.ptr);
    first_ = false;
  }
  void value_json(const OrderedJson& j) {
    out_ += j.dump();
    first_ = false;
  }
  void value(const std::string& v) {
    string(v);
    first_ = false;
  }
  void ints(const std::vector<int64_t>& v) {
    begin('[');
    for (int64_t x : v) {
      item();
      value(x);
    }
    end(']');
  }

 private:
  // Plain printable ASCII as it is; anything to escape through nlohmann.
  void string(const std::string& v) {
    for (char c : v) {
      if (c < 0x20 || c == '"' || c == '\\' || static_cast<unsigned char>(c) >= 0x7f) {
        out_ += OrderedJson(v).dump();
        return;
      }
    }
    out_ += '"';
    out_ += v;
    out_ += '"';
  }
  void newline() {
    out_ += '\n';
    out_.append(static_cast<size_t>(2 * indent_), ' ');
  }
  std::string& out_;
  int indent_;
  bool first_ = true;
};

void write_tensor(PrettyWriter& w, const LogicalTensor& lt) {
  w.begin('{');
  w.key("id");
  w.value(lt.id);
  w.key("dtype");
  w.value(std::string(dtype_name(lt.dtype)));
  w.key("shape");
  w.ints(lt.rank_unknown ? std::vector<int64_t>{kUnknownDim} : lt.dims);
  w.key("stride");
  if (!lt.strides.empty()) {
    w.ints(lt.strides);
  } else if (lt.dims_known() && lt.layout != LayoutType::kOpaque) {
    w.ints(dense_strides(lt.dims));
  } else {
    w.ints({kUnknownDim});  // oneDNN's "not known"
  }
  w.key("layout_type");
  w.value(std::string(layout_type_name(lt.layout)));
  w.key("property_type");
  w.value(std::string(property_type_name(lt.property)));
  w.end('}');
}

void write_attr(PrettyWriter& w, const AttrValue& v) {
  w.begin('{');
  w.key("type");
  w.value(std::string(attr_kind_name(attr_value_kind(v))));
  w.key("value");
  if (const bool* b = std::get_if<bool>(&v)) {
    w.value(int64_t{*b ? 1 : 0});  // oneDNN's reader and writer use 0/1 for bools
  } else if (const int64_t* i = std::get_if<int64_t>(&v)) {
    w.value(*i);
  } else if (const std::vector<int64_t>* is = std::get_if<std::vector<int64_t>>(&v)) {
    w.ints(*is);
  } else {
    OrderedJson j;
    std::visit([&](const auto& x) { j = x; }, v);
    if (j.is_array() && !j.empty()) {
      w.begin('[');
      for (const OrderedJson& e : j) {
        w.item();
        w.value_json(e);
      }
      w.end(']');
    } else {
      w.value_json(j);
    }
  }
  w.end('}');
}

}  // namespace

std::string graph_to_json(const Graph& graph) {
  // The file-level keys as one small document, then the ops written one by
  // one: linear in the graph, the same text as dump(2) of a whole document.
  OrderedJson root;
  root["version"] = graph.version;
  root["engine_kind"] = graph.engine_kind;
  root["fpmath_mode"] = graph.fpmath_mode;
  if (graph.fpmath_mode_apply_to_int)
    root["fpmath_mode_apply_to_int"] = *graph.fpmath_mode_apply_to_int;
  if (graph.input_ports()) root["input_ports"] = *graph.input_ports();
  if (graph.output_ports()) root["output_ports"] = *graph.output_ports();
  std::string out = root.dump(2);
  out.resize(out.size() - 2);                           // the closing "\n}"
  out.reserve(out.size() + 2048 * graph.ops().size());  // about what an op takes
  out += ",\n  \"graph\": ";
  PrettyWriter w(&out, 1);
  w.begin('[');
  for (const Op& op : graph.ops()) {
    w.item();
    w.begin('{');
    w.key("id");
    w.value(op.id());
    w.key("name");
    w.value(op.name());
    w.key("kind");
    w.value(std::string(op.kind_spelling()));
    w.key("attrs");
    w.begin('{');
    for (const auto& [key, value] : op.attrs()) {
      w.key_json(key);
      write_attr(w, value);
    }
    w.end('}');
    for (const char* side : {"inputs", "outputs"}) {
      w.key(side);
      w.begin('[');
      for (const LogicalTensor& lt : side[0] == 'i' ? op.inputs() : op.outputs()) {
        w.item();
        write_tensor(w, lt);
      }
      w.end(']');
    }
    w.end('}');
  }
  w.end(']');
  out += "\n}\n";
  return out;
}

Status save_graph(const Graph& graph, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return not_found(path + ": cannot open for writing");
  out << graph_to_json(graph);
  if (!out) return internal_error(path + ": write failed");
  return ok_status();
}

}  // namespace normgrad
