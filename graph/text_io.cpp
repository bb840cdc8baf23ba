// The text form: printer, and a small recursive-descent reader for the same grammar.
#include <normgrad/graph/text_io.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

namespace normgrad {
namespace {

std::string int_list(const Dims& v, bool rank_unknown = false) {
  if (rank_unknown) return "*";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + (v[i] == kUnknownDim ? std::string("?") : std::to_string(v[i]));
  return s;
}

std::string f32_text(float f) {
  if (std::isnan(f)) return "nanf";
  if (std::isinf(f)) return f > 0 ? "inff" : "-inff";
  // The shortest of %.6g..%.9g that reads back exactly (9 digits always do).
  char buf[32];
  for (int p = 6; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::string(buf) + "f";
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string attr_text(const AttrValue& v) {
  switch (attr_value_kind(v)) {
    case AttrKind::kS64:
      return std::to_string(std::get<int64_t>(v));
    case AttrKind::kF32:
      return f32_text(std::get<float>(v));
    case AttrKind::kBool:
      return std::get<bool>(v) ? "true" : "false";
    case AttrKind::kString:
      return quoted(std::get<std::string>(v));
    case AttrKind::kS64s:
      return "[" + int_list(std::get<std::vector<int64_t>>(v)) + "]";
    case AttrKind::kF32s: {
      const auto& l = std::get<std::vector<float>>(v);
      if (l.empty()) return "[]f";
      std::string s = "[";
      for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + f32_text(l[i]);
      return s + "]";
    }
  }
  return "";
}

std::string tensor_text(const LogicalTensor& lt) {
  std::string s = "%" + std::to_string(lt.id) + ":" + dtype_name(lt.dtype) + "[" +
                  int_list(lt.dims, lt.rank_unknown) + "]";
  if (!lt.strides.empty() && (!lt.dims_known() || lt.strides != dense_strides(lt.dims)))
    s += "{" + int_list(lt.strides) + "}";
  if (lt.layout != LayoutType::kStrided) s += std::string("@") + layout_type_name(lt.layout);
  if (lt.property != PropertyType::kUndef) s += std::string("!") + property_type_name(lt.property);
  return s;
}

std::string tensor_list(const std::vector<LogicalTensor>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + tensor_text(ts[i]);
  return s;
}

// --- reader ---------------------------------------------------------------

class Reader {
 public:
  Reader(const std::string& line, int line_no) : s_(line), line_(line_no) {}

  Status error(const std::string& what) const {
    return invalid_argument("line " + std::to_string(line_) + ":" + std::to_string(pos_ + 1) +
                            ": " + what);
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= s_.size();
  }
  bool accept(const std::string& tok) {
    skip_space();
    if (s_.compare(pos_, tok.size(), tok) != 0) return false;
    pos_ += tok.size();
    return true;
  }
  Status expect(const std::string& tok) {
    return accept(tok) ? ok_status() : error("expected '" + tok + "'");
  }
  std::string word() {  // letters, digits, '_' and '.'
    skip_space();
    const size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '_' || s_[pos_] == '.'))
      ++pos_;
    return s_.substr(b, pos_ - b);
  }
  StatusOr<int64_t> integer() {
    skip_space();
    if (accept("?")) return kUnknownDim;
    const char* b = s_.c_str() + pos_;
    char* e = nullptr;
    errno = 0;
    const long long v = std::strtoll(b, &e, 10);
    if (e == b || errno == ERANGE) return error("expected an integer");
    pos_ += static_cast<size_t>(e - b);
    return static_cast<int64_t>(v);
  }
  StatusOr<std::string> string() {
    NG_RETURN_IF_ERROR(expect("\""));
    std::string v;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      v += s_[pos_++];
    }
    if (pos_ >= s_.size()) return error("unterminated string");
    ++pos_;
    return v;
  }
  // A number: f32 when it has an `f` suffix, else s64.
  StatusOr<AttrValue> number() {
    skip_space();
    for (const char* special : {"nanf", "inff", "-inff"}) {
      if (accept(special)) {
        const float v = special[0] == 'n' ? NAN : special[0] == '-' ? -INFINITY : INFINITY;
        return AttrValue(v);
      }
    }
    const char* b = s_.c_str() + pos_;
    char* e = nullptr;
    const double d = std::strtod(b, &e);
    if (e == b) return error("expected a value");
    const size_t len = static_cast<size_t>(e - b);
    if (pos_ + len < s_.size() && s_[pos_ + len] == 'f') {
      pos_ += len + 1;
      return AttrValue(static_cast<float>(d));
    }
    const std::string lit = s_.substr(pos_, len);
    if (lit.find_first_of(".eE") != std::string::npos)
      return error("a float needs the f suffix (f32), e.g. " + lit + "f");
    NG_ASSIGN_OR_RETURN(int64_t v, integer());
    return AttrValue(v);
  }
  StatusOr<AttrValue> value() {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      NG_ASSIGN_OR_RETURN(std::string v, string());
      return AttrValue(v);
    }
    if (accept("true")) return AttrValue(true);
    if (accept("false")) return AttrValue(false);
    if (accept("[")) {
      if (accept("]")) {
        if (accept("f")) return AttrValue(std::vector<float>{});
        return AttrValue(std::vector<int64_t>{});
      }
      std::vector<AttrValue> items;
      do {
        NG_ASSIGN_OR_RETURN(AttrValue v, number());
        items.push_back(std::move(v));
      } while (accept(","));
      NG_RETURN_IF_ERROR(expect("]"));
      if (attr_value_kind(items[0]) == AttrKind::kF32) {
        std::vector<float> l;
        for (const AttrValue& v : items) {
          if (attr_value_kind(v) != AttrKind::kF32) return error("a list mixes f32 and s64");
          l.push_back(std::get<float>(v));
        }
        return AttrValue(l);
      }
      std::vector<int64_t> l;
      for (const AttrValue& v : items) {
        if (attr_value_kind(v) != AttrKind::kS64) return error("a list mixes f32 and s64");
        l.push_back(std::get<int64_t>(v));
      }
      return AttrValue(l);
    }
    return number();
  }
  StatusOr<std::vector<int64_t>> int_list_in(const char* open, const char* close) {
    NG_RETURN_IF_ERROR(expect(open));
    std::vector<int64_t> v;
    if (accept(close)) return v;
    do {
      NG_ASSIGN_OR_RETURN(int64_t x, integer());
      v.push_back(x);
    } while (accept(","));
    NG_RETURN_IF_ERROR(expect(close));
    return v;
  }
  StatusOr<LogicalTensor> tensor() {
    NG_RETURN_IF_ERROR(expect("%"));
    LogicalTensor lt;
    NG_ASSIGN_OR_RETURN(lt.id, integer());
    NG_RETURN_IF_ERROR(expect(":"));
    const std::string dt = word();
    auto parsed = parse_dtype(dt);
    if (!parsed.ok()) return error(parsed.status().message());
    lt.dtype = *parsed;
    if (accept("[*]")) {
      lt.rank_unknown = true;
    } else {
      NG_ASSIGN_OR_RETURN(lt.dims, int_list_in("[", "]"));
    }
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '{') {
      NG_ASSIGN_OR_RETURN(lt.strides, int_list_in("{", "}"));
    }
    if (accept("@")) {
      auto l = parse_layout_type(word());
      if (!l.ok()) return error(l.status().message());
      lt.layout = *l;
    }
    if (accept("!")) {
      auto p = parse_property_type(word());
      if (!p.ok()) return error(p.status().message());
      lt.property = *p;
    }
    return lt;
  }
  StatusOr<std::vector<LogicalTensor>> tensors_until(const char* close) {
    std::vector<LogicalTensor> v;
    if (accept(close)) return v;
    do {
      NG_ASSIGN_OR_RETURN(LogicalTensor t, tensor());
      v.push_back(std::move(t));
    } while (accept(","));
    NG_RETURN_IF_ERROR(expect(close));
    return v;
  }

  StatusOr<Op> op() {
    std::vector<LogicalTensor> outs;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '%') {
      do {
        NG_ASSIGN_OR_RETURN(LogicalTensor t, tensor());
        outs.push_back(std::move(t));
      } while (accept(","));
      NG_RETURN_IF_ERROR(expect("="));
    }
    const std::string kind = word();
    auto k = parse_op_kind(kind);
    if (!k.ok()) return error("unknown op kind '" + kind + "'");
    NG_RETURN_IF_ERROR(expect("#"));
    NG_ASSIGN_OR_RETURN(int64_t id, integer());
    std::string name;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      NG_ASSIGN_OR_RETURN(name, string());
    }
    Op op(id, *k, name);
    if (kind != op_kind_name(*k)) op.set_spelling(kind);
    NG_RETURN_IF_ERROR(expect("("));
    NG_ASSIGN_OR_RETURN(auto ins, tensors_until(")"));
    for (LogicalTensor& t : ins) op.add_input(std::move(t));
    for (LogicalTensor& t : outs) op.add_output(std::move(t));
    if (accept("{") && !accept("}")) {
      do {
        const std::string key = word();
        if (key.empty()) return error("expected an attribute name");
        NG_RETURN_IF_ERROR(expect("="));
        NG_ASSIGN_OR_RETURN(AttrValue v, value());
        op.set_attr(key, std::move(v));
      } while (accept(","));
      NG_RETURN_IF_ERROR(expect("}"));
    }
    if (!at_end()) return error("unexpected text after the op");
    return op;
  }

 private:
  const std::string& s_;
  int line_;
  size_t pos_ = 0;
};

}  // namespace

std::string graph_to_text(const Graph& g) {
  std::ostringstream out;
  std::string header;
  if (g.version != "3.0.0") header += " version=" + quoted(g.version);
  if (g.engine_kind != "cpu") header += " engine_kind=" + quoted(g.engine_kind);
  if (g.fpmath_mode != "strict") header += " fpmath_mode=" + quoted(g.fpmath_mode);
  if (g.fpmath_mode_apply_to_int)
    header += " fpmath_mode_apply_to_int=" + quoted(*g.fpmath_mode_apply_to_int);
  if (g.input_ports()) header += " input_ports=[" + int_list(*g.input_ports()) + "]";
  if (g.output_ports()) header += " output_ports=[" + int_list(*g.output_ports()) + "]";
  if (!header.empty()) out << "graph" << header << "\n";
  for (const Op& op : g.ops()) {
    if (!op.outputs().empty()) out << tensor_list(op.outputs()) << " = ";
    out << op.kind_spelling() << "#" << op.id();
    if (!op.name().empty()) out << " " << quoted(op.name());
    out << "(" << tensor_list(op.inputs()) << ")";
    if (!op.attrs().empty()) {
      out << " {";
      bool first = true;
      for (const auto& [k, v] : op.attrs()) {
        out << (first ? "" : ", ") << k << "=" << attr_text(v);
        first = false;
      }
      out << "}";
    }
    out << "\n";
  }
  return out.str();
}

StatusOr<Graph> graph_from_text(const std::string& text) {
  Graph g;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    Reader r(line, no);
    if (r.at_end() || r.accept("//")) continue;
    if (r.accept("graph ")) {
      while (!r.at_end()) {
        const std::string key = r.word();
        NG_RETURN_IF_ERROR(r.expect("="));
        if (key == "input_ports" || key == "output_ports") {
          NG_ASSIGN_OR_RETURN(auto ids, r.int_list_in("[", "]"));
          key == "input_ports" ? g.set_input_ports(ids) : g.set_output_ports(ids);
          continue;
        }
        NG_ASSIGN_OR_RETURN(std::string v, r.string());
        if (key == "version") {
          g.version = v;
        } else if (key == "engine_kind") {
          g.engine_kind = v;
        } else if (key == "fpmath_mode") {
          g.fpmath_mode = v;
        } else if (key == "fpmath_mode_apply_to_int") {
          g.fpmath_mode_apply_to_int = v;
        } else {
          return r.error("unknown graph field '" + key + "'");
        }
      }
      continue;
    }
    NG_ASSIGN_OR_RETURN(Op op, r.op());
    Status added = g.add_op(std::move(op));
    if (!added.ok()) return invalid_argument("line " + std::to_string(no) + ": " + added.message());
  }
  if (g.ops().empty()) return invalid_graph("the text holds no ops");
  return g;
}

std::vector<std::pair<int, std::string>> split_text_cases(const std::string& text) {
  std::vector<std::pair<int, std::string>> cases{{1, ""}};
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line == "// -----") {
      cases.push_back({no + 1, ""});
      continue;
    }
    cases.back().second += line + "\n";
  }
  return cases;
}

}  // namespace normgrad
