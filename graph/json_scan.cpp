// The fast graph-JSON reader: text straight into ops, giving up on doubt.
#include <normgrad/graph/json_scan.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

namespace normgrad {

StatusOr<LogicalTensor> finish_tensor(TensorFields f, const std::string& where) {
  auto at = [&](const char* field, const std::string& what) {
    return invalid_argument(where + field + ": " + what);
  };
  LogicalTensor lt;
  lt.id = f.id;
  if (lt.id < 0) return at(".id", "tensor ids must be >= 0, got " + std::to_string(lt.id));
  auto dtype = parse_dtype(f.dtype);
  if (!dtype.ok()) return dtype.status().with_context(where + ".dtype");
  lt.dtype = *dtype;
  lt.dims = std::move(f.shape);
  // oneDNN's dumps: [INT64_MIN] is an unknown rank ("infer me"), INT64_MIN or
  // -1 in a longer shape an unknown dim, [] a rank-0 scalar.
  if (lt.dims.size() == 1 && lt.dims[0] == kUnknownDim) {
    lt.dims.clear();
    lt.rank_unknown = true;
  }
  if (lt.dims.size() > static_cast<size_t>(kMaxRank)) {
    return at(".shape",
              "rank " + std::to_string(lt.dims.size()) + " exceeds " + std::to_string(kMaxRank));
  }
  for (int64_t& d : lt.dims) {
    if (d == -1) d = kUnknownDim;
    if (d < 0 && d != kUnknownDim) {
      return at(".shape",
                "dims must be >= 0 (or -1 / INT64_MIN for unknown), got " + std::to_string(d));
    }
  }
  if (f.stride) {
    lt.strides = std::move(*f.stride);
    // A one-element INT64_MIN stride means "not known", whatever the rank.
    const bool unknown = std::all_of(lt.strides.begin(), lt.strides.end(),
                                     [](int64_t s) { return s == kUnknownDim || s == -1; });
    if (unknown || lt.rank_unknown) lt.strides.clear();
    if (!lt.strides.empty() && lt.strides.size() != lt.dims.size()) {
      return at(".stride", std::to_string(lt.strides.size()) + " strides for rank " +
                               std::to_string(lt.dims.size()));
    }
    for (int64_t& s : lt.strides) {
      if (s == -1) s = kUnknownDim;
      if (s < 0 && s != kUnknownDim)
        return at(".stride", "strides must be >= 0, got " + std::to_string(s));
    }
  }
  if (f.layout_type) {
    auto layout = parse_layout_type(*f.layout_type);
    if (!layout.ok()) return layout.status().with_context(where + ".layout_type");
    lt.layout = *layout;
  }
  if (f.property_type) {
    auto property = parse_property_type(*f.property_type);
    if (!property.ok()) return property.status().with_context(where + ".property_type");
    lt.property = *property;
  }
  // The fast reader passes no path: it asks only whether the tensor is valid,
  // and the checked reader builds the message.
  if (where.empty()) {
    if (!lt.is_valid()) return invalid_argument("invalid tensor");
  } else {
    NG_RETURN_IF_ERROR(lt.validate(where));
  }
  return lt;
}

namespace {

// A cursor over the text. Each reader skips the blanks before its token and
// returns false, consuming what it may, when the token is not what it takes.
class Scanner {
 public:
  Scanner(const char* begin, const char* end) : p_(begin), end_(end) {}

  const char* pos() const { return p_; }
  bool at_end() {
    blanks();
    return p_ == end_;
  }
  bool eat(char c) {
    blanks();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // A string with no escapes, control or non-ASCII bytes (those the checked
  // reader validates), as a view into the text.
  bool string(std::string_view* s) {
    if (!eat('"')) return false;
    const char* begin = p_;
    for (; p_ != end_; ++p_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *s = std::string_view(begin, static_cast<size_t>(p_ - begin));
        ++p_;
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
    }
    return false;
  }
  bool key(std::string_view* k) { return string(k) && eat(':'); }
  // An integer token that fits in int64 (a fraction or exponent: false).
  bool integer(int64_t* v) {
    const char* begin = nullptr;
    bool is_integer = false;
    if (!number_token(&begin, &is_integer) || !is_integer) return false;
    const auto r = std::from_chars(begin, p_, *v);
    return r.ec == std::errc() && r.ptr == p_;
  }
  // Any number, as the checked reader reads it (correctly rounded to double).
  bool number(double* v) {
    const char* begin = nullptr;
    bool is_integer = false;
    if (!number_token(&begin, &is_integer)) return false;
    const auto r = std::from_chars(begin, p_, *v);
    return r.ec == std::errc() && r.ptr == p_ && std::isfinite(*v);
  }
  bool word(std::string_view w) {
    blanks();
    if (static_cast<size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w)
      return false;
    p_ += w.size();
    return true;
  }
  bool int_array(Dims* out) {
    out->clear();
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      int64_t v = 0;
      if (!integer(&v)) return false;
      out->push_back(v);
    } while (eat(','));
    return eat(']');
  }
  // Skips any JSON value; its text is checked when the checked reader parses it.
  bool skip_value() {
    blanks();
    int depth = 0;
    do {
      if (p_ == end_) return false;
      const char c = *p_;
      if (c == '"') {
        for (++p_; p_ != end_ && *p_ != '"'; ++p_) {
          if (*p_ == '\\' && ++p_ == end_) return false;
        }
        if (p_ == end_) return false;
        ++p_;
      } else if (c == '[' || c == '{') {
        ++depth;
        ++p_;
      } else if (c == ']' || c == '}') {
        if (--depth < 0) return false;
        ++p_;
      } else {
        ++p_;
      }
      if (depth > 0) blanks();
    } while (depth > 0);
    // A scalar: the rest of its token.
    while (p_ != end_ && (std::isalnum(static_cast<unsigned char>(*p_)) || *p_ == '.' ||
                          *p_ == '-' || *p_ == '+'))
      ++p_;
    return true;
  }

 private:
  void blanks() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  // JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number_token(const char** begin, bool* is_integer) {
    blanks();
    *begin = p_;
    auto digits = [&] {
      const char* d = p_;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ - d;
    };
    if (p_ != end_ && *p_ == '-') ++p_;
    const char* first = p_;
    const auto n = digits();
    if (n == 0 || (n > 1 && *first == '0')) return false;
    *is_integer = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (digits() == 0) return false;
      *is_integer = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (digits() == 0) return false;
      *is_integer = false;
    }
    return true;
  }

  const char* p_;
  const char* end_;
};

// Each key at most once: the checked reader says what a repeated one means.
bool first_time(uint32_t* seen, uint32_t bit) {
  if (*seen & bit) return false;
  *seen |= bit;
  return true;
}

bool read_tensor(Scanner& s, LogicalTensor* out) {
  if (!s.eat('{')) return false;
  TensorFields f;
  uint32_t seen = 0;
  std::string_view k, v;
  do {
    if (!s.key(&k)) return false;
    if (k == "id") {
      if (!first_time(&seen, 1) || !s.integer(&f.id)) return false;
    } else if (k == "dtype") {
      if (!first_time(&seen, 2) || !s.string(&v)) return false;
      f.dtype = v;
    } else if (k == "shape") {
      if (!first_time(&seen, 4) || !s.int_array(&f.shape)) return false;
    } else if (k == "stride") {
      f.stride.emplace();
      if (!first_time(&seen, 8) || !s.int_array(&*f.stride)) return false;
    } else if (k == "layout_type") {
      if (!first_time(&seen, 16) || !s.string(&v)) return false;
      f.layout_type = std::string(v);
    } else if (k == "property_type") {
      if (!first_time(&seen, 32) || !s.string(&v)) return false;
      f.property_type = std::string(v);
    } else {
      return false;
    }
  } while (s.eat(','));
  if (!s.eat('}') || (seen & 7) != 7) return false;
  auto lt = finish_tensor(std::move(f), std::string());
  if (!lt.ok()) return false;
  *out = std::move(lt).value();
  return true;
}

bool read_f32(Scanner& s, float* out) {
  double d = 0;
  if (!s.number(&d) || std::fabs(d) > std::numeric_limits<float>::max()) return false;
  *out = static_cast<float>(d);
  return true;
}

// An attribute's value, read as its type says.
bool read_attr_value(Scanner& s, AttrKind kind, AttrValue* out) {
  switch (kind) {
    case AttrKind::kS64: {
      int64_t v = 0;
      if (!s.integer(&v)) return false;
      *out = v;
      return true;
    }
    case AttrKind::kS64s: {
      Dims v;
      if (!s.int_array(&v)) return false;
      *out = std::move(v);
      return true;
    }
    case AttrKind::kF32: {
      float v = 0;
      if (!read_f32(s, &v)) return false;
      *out = v;
      return true;
    }
    case AttrKind::kF32s: {
      std::vector<float> v;
      if (!s.eat('[')) return false;
      if (!s.eat(']')) {
        do {
          float x = 0;
          if (!read_f32(s, &x)) return false;
          v.push_back(x);
        } while (s.eat(','));
        if (!s.eat(']')) return false;
      }
      *out = std::move(v);
      return true;
    }
    case AttrKind::kBool: {
      // oneDNN's dump writes bools as 0/1.
      int64_t v = 0;
      if (s.word("true") || s.word("false")) {
        *out = *(s.pos() - 4) == 't';  // "true" ends 4 back; "false" has 'a' there
        return true;
      }
      if (!s.integer(&v) || (v != 0 && v != 1)) return false;
      *out = v == 1;
      return true;
    }
    case AttrKind::kString: {
      std::string_view v;
      if (!s.string(&v)) return false;
      *out = std::string(v);
      return true;
    }
  }
  return false;
}

// {"type": T, "value": V}, in either order: V is read once T is known.
bool read_attr(Scanner& s, AttrValue* out) {
  if (!s.eat('{')) return false;
  std::string_view k, type;
  const char* value_at = nullptr;
  const char* value_end = nullptr;
  uint32_t seen = 0;
  do {
    if (!s.key(&k)) return false;
    if (k == "type") {
      if (!first_time(&seen, 1) || !s.string(&type)) return false;
    } else if (k == "value") {
      if (!first_time(&seen, 2)) return false;
      value_at = s.pos();
      if (!s.skip_value()) return false;
      value_end = s.pos();
    } else {
      return false;
    }
  } while (s.eat(','));
  if (!s.eat('}') || seen != 3) return false;
  auto kind = parse_attr_kind(std::string(type));
  if (!kind.ok()) return false;
  Scanner value(value_at, value_end);
  return read_attr_value(value, *kind, out) && value.at_end();
}

bool read_op(Scanner& s, Graph* g) {
  if (!s.eat('{')) return false;
  int64_t id = 0;
  std::string_view k, kind_name, name;
  std::vector<std::pair<std::string, AttrValue>> attrs;
  std::vector<LogicalTensor> ports[2];
  uint32_t seen = 0;
  do {
    if (!s.key(&k)) return false;
    if (k == "id") {
      if (!first_time(&seen, 1) || !s.integer(&id)) return false;
    } else if (k == "kind") {
      if (!first_time(&seen, 2) || !s.string(&kind_name)) return false;
    } else if (k == "name") {
      if (!first_time(&seen, 4) || !s.string(&name)) return false;
    } else if (k == "attrs") {
      if (!first_time(&seen, 8) || !s.eat('{')) return false;
      if (!s.eat('}')) {
        do {
          std::string_view key;
          AttrValue v;
          if (!s.key(&key) || !read_attr(s, &v)) return false;
          attrs.emplace_back(std::string(key), std::move(v));
        } while (s.eat(','));
        if (!s.eat('}')) return false;
      }
    } else if (k == "inputs" || k == "outputs") {
      const int side = k == "inputs" ? 0 : 1;
      if (!first_time(&seen, 16u << side) || !s.eat('[')) return false;
      if (!s.eat(']')) {
        do {
          ports[side].emplace_back();
          if (!read_tensor(s, &ports[side].back())) return false;
        } while (s.eat(','));
        if (!s.eat(']')) return false;
      }
    } else {
      return false;
    }
  } while (s.eat(','));
  if (!s.eat('}') || (seen & (1 | 2 | 16 | 32)) != (1 | 2 | 16 | 32)) return false;
  const std::string spelling(kind_name);
  auto kind = parse_op_kind(spelling);
  if (!kind.ok()) return false;
  // A repeated attribute key: the checked reader's document keeps the last.
  for (size_t i = 0; i < attrs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (attrs[i].first == attrs[j].first) return false;
    }
  }
  Op op(id, *kind, std::string(name));
  if (spelling != op_kind_name(*kind)) op.set_spelling(spelling);
  for (auto& [key, value] : attrs) op.set_attr(key, std::move(value));
  for (LogicalTensor& lt : ports[0]) op.add_input(std::move(lt));
  for (LogicalTensor& lt : ports[1]) op.add_output(std::move(lt));
  return g->add_op(std::move(op)).ok();
}

}  // namespace

bool scan_graph_json(const std::string& text, size_t op_limit, Graph* g, std::string* root_rest) {
  Scanner s(text.data(), text.data() + text.size());
  if (!s.eat('{')) return false;
  *root_rest = "{";
  std::vector<std::string_view> keys;
  bool graph_seen = false;
  if (s.eat('}')) return false;  // no "graph": the checked reader says so
  do {
    std::string_view k;
    if (!s.key(&k)) return false;
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) return false;
    keys.push_back(k);
    if (k != "graph") {
      const char* begin = s.pos();
      if (!s.skip_value()) return false;
      root_rest->append(root_rest->size() > 1 ? "," : "").append("\"").append(k).append("\":");
      root_rest->append(begin, s.pos());
      continue;
    }
    graph_seen = true;
    if (!s.eat('[')) return false;
    if (s.eat(']')) continue;
    size_t n_ops = 0;
    do {
      if (++n_ops > op_limit || !read_op(s, g)) return false;
    } while (s.eat(','));
    if (!s.eat(']')) return false;
  } while (s.eat(','));
  root_rest->append("}");
  return s.eat('}') && s.at_end() && graph_seen;
}

}  // namespace normgrad
