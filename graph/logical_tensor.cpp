// LogicalTensor: overflow-checked sizes, validation and printing.
#include <normgrad/graph/logical_tensor.hpp>

#include <algorithm>
#include <sstream>

namespace normgrad {

const char* layout_type_name(LayoutType layout) {
  switch (layout) {
    case LayoutType::kUndef:
      return "undef";
    case LayoutType::kAny:
      return "any";
    case LayoutType::kStrided:
      return "strided";
    case LayoutType::kOpaque:
      return "opaque";
  }
  return "undef";
}

StatusOr<LayoutType> parse_layout_type(const std::string& name) {
  if (name == "strided") return LayoutType::kStrided;
  if (name == "any") return LayoutType::kAny;
  if (name == "undef") return LayoutType::kUndef;
  if (name == "opaque") return LayoutType::kOpaque;
  return invalid_argument("unknown layout_type '" + name + "'");
}

const char* property_type_name(PropertyType property) {
  switch (property) {
    case PropertyType::kUndef:
      return "undef";
    case PropertyType::kVariable:
      return "variable";
    case PropertyType::kConstant:
      return "constant";
    case PropertyType::kHostScalar:
      return "host_scalar";
  }
  return "undef";
}

StatusOr<PropertyType> parse_property_type(const std::string& name) {
  if (name == "undef") return PropertyType::kUndef;
  if (name == "variable") return PropertyType::kVariable;
  if (name == "constant") return PropertyType::kConstant;
  if (name == "host_scalar") return PropertyType::kHostScalar;
  return invalid_argument("unknown property_type '" + name + "'");
}

StatusOr<int64_t> checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    return out_of_range(what + ": size overflows int64 (" + std::to_string(a) + " x " +
                        std::to_string(b) + ")");
  }
  return r;
}

StatusOr<int64_t> checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    return out_of_range(what + ": size overflows int64 (" + std::to_string(a) + " + " +
                        std::to_string(b) + ")");
  }
  return r;
}

StatusOr<int64_t> checked_product(const Dims& dims, const std::string& what) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d < 0)
      return invalid_argument(what + ": dims must be known and >= 0, got " + dims_to_string(dims));
    NG_ASSIGN_OR_RETURN(p, checked_mul(p, d, what));
  }
  return p;
}

Dims dense_strides(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) {
    // Saturating: callers validate the product first, so this never wraps for valid tensors.
    const int64_t next = dims[i + 1] > 0 ? dims[i + 1] : 1;
    int64_t r;
    s[i] = __builtin_mul_overflow(s[i + 1], next, &r) ? std::numeric_limits<int64_t>::max() : r;
  }
  return s;
}

Dims channels_last_strides(const Dims& dims) {
  if (dims.size() < 3) return dense_strides(dims);
  Dims order(dims.size());  // the NXC dims, outermost first
  order[0] = dims[0];
  for (size_t k = 2; k < dims.size(); ++k) order[k - 1] = dims[k];
  order.back() = dims[1];
  const Dims nxc = dense_strides(order);
  Dims s(dims.size());
  s[0] = nxc[0];
  s[1] = nxc.back();
  for (size_t k = 2; k < dims.size(); ++k) s[k] = nxc[k - 1];
  return s;
}

bool same_layout(const Dims& dims, const Dims& a, const Dims& b) {
  if (a.size() != dims.size() || b.size() != dims.size()) return false;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] > 1 && a[k] != b[k]) return false;
  }
  return true;
}

std::string dims_to_string(const Dims& dims) {
  if (dims.empty()) return "scalar";
  std::ostringstream os;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << 'x';
    if (dims[i] == kUnknownDim) {
      os << '?';
    } else {
      os << dims[i];
    }
  }
  return os.str();
}

bool LogicalTensor::dims_known() const {
  if (rank_unknown) return false;
  for (int64_t d : dims) {
    if (d == kUnknownDim || d < 0) return false;
  }
  return true;
}

bool LogicalTensor::strides_known() const {
  if (strides.size() != dims.size()) return false;
  for (int64_t s : strides) {
    if (s == kUnknownDim) return false;
  }
  return true;
}

Dims LogicalTensor::effective_strides() const {
  if (strides_known()) return strides;
  return dense_strides(dims);
}

namespace {

// The elements the strides address (max offset + 1) of a tensor whose dims
// are known, or -1 when a product or sum overflows: the common case without
// building the error messages, which the checked path below does.
int64_t quick_buffer_elements(const LogicalTensor& t) {
  int64_t count = 1;
  for (int64_t d : t.dims) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count)) return -1;
  }
  if (count == 0) return 0;
  const bool given = t.strides_known();
  int64_t max_offset = 0, dense = 1;
  for (size_t i = t.dims.size(); i-- > 0;) {
    const int64_t stride = given ? t.strides[i] : dense;
    int64_t span;
    if (__builtin_mul_overflow(t.dims[i] - 1, stride, &span) ||
        __builtin_add_overflow(max_offset, span, &max_offset))
      return -1;
    if (!given && __builtin_mul_overflow(dense, std::max<int64_t>(1, t.dims[i]), &dense)) return -1;
  }
  int64_t n;
  return __builtin_add_overflow(max_offset, 1, &n) ? -1 : n;
}

}  // namespace

StatusOr<int64_t> LogicalTensor::element_count() const {
  return checked_product(dims, "tensor " + std::to_string(id));
}

StatusOr<int64_t> LogicalTensor::buffer_elements() const {
  if (dims_known()) {
    if (const int64_t n = quick_buffer_elements(*this); n >= 0) return n;
  }
  const std::string what = "tensor " + std::to_string(id);
  NG_ASSIGN_OR_RETURN(int64_t count, element_count());
  if (count == 0) return int64_t{0};
  const Dims s = effective_strides();
  int64_t max_offset = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    NG_ASSIGN_OR_RETURN(int64_t span, checked_mul(dims[i] - 1, s[i], what));
    NG_ASSIGN_OR_RETURN(max_offset, checked_add(max_offset, span, what));
  }
  return checked_add(max_offset, 1, what);
}

StatusOr<int64_t> LogicalTensor::buffer_bytes() const {
  NG_ASSIGN_OR_RETURN(int64_t elems, buffer_elements());
  if (int64_t b; !__builtin_mul_overflow(elems, int64_t{dtype_size(dtype)}, &b)) return b;
  return checked_mul(elems, dtype_size(dtype), "tensor " + std::to_string(id) + " bytes");
}

bool LogicalTensor::is_valid() const {
  if (rank() > kMaxRank) return false;
  for (int64_t d : dims) {
    if (d != kUnknownDim && d < 0) return false;
  }
  if (!strides.empty()) {
    if (strides.size() != dims.size()) return false;
    for (int64_t st : strides) {
      if (st != kUnknownDim && st < 0) return false;
    }
  }
  if (!dims_known()) return true;
  const int64_t n = quick_buffer_elements(*this);
  int64_t bytes;
  return n >= 0 && !__builtin_mul_overflow(n, int64_t{dtype_size(dtype)}, &bytes);
}

Status LogicalTensor::validate(const std::string& what) const {
  if (rank() > kMaxRank) {
    return invalid_argument(what + ": rank " + std::to_string(rank()) + " exceeds the maximum " +
                            std::to_string(kMaxRank));
  }
  for (int64_t d : dims) {
    if (d != kUnknownDim && d < 0) {
      return invalid_argument(what + ": dims must be >= 0, got " + dims_to_string(dims));
    }
  }
  if (!strides.empty()) {
    if (strides.size() != dims.size()) {
      return invalid_argument(what + ": " + std::to_string(strides.size()) + " strides for rank " +
                              std::to_string(dims.size()));
    }
    for (int64_t s : strides) {
      if (s != kUnknownDim && s < 0) {
        return invalid_argument(what + ": strides must be >= 0, got " + dims_to_string(strides));
      }
    }
  }
  if (dims_known()) {
    NG_ASSIGN_OR_RETURN(int64_t bytes, buffer_bytes());
    (void)bytes;
  }
  return ok_status();
}

bool LogicalTensor::non_overlapping() const {
  if (!dims_known()) return true;
  for (int64_t d : dims) {
    if (d == 0) return true;
  }
  // Sorted by stride, each dim must step past everything the smaller strides cover.
  std::vector<std::pair<int64_t, int64_t>> sd;  // (stride, dim)
  const Dims s = effective_strides();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] > 1) sd.emplace_back(s[i], dims[i]);
  }
  std::sort(sd.begin(), sd.end());
  int64_t covered = 1;  // elements spanned by the dims so far
  for (const auto& [stride, dim] : sd) {
    if (stride < covered) return false;
    int64_t span;
    if (__builtin_mul_overflow(stride, dim, &span)) return true;  // sizes are validated elsewhere
    covered = span;
  }
  return true;
}

std::string LogicalTensor::to_string() const {
  return "id " + std::to_string(id) + " " + dtype_name(dtype) + " " +
         (rank_unknown ? std::string("?(unknown rank)") : dims_to_string(dims));
}

bool same_metadata(const LogicalTensor& a, const LogicalTensor& b) {
  return a.id == b.id && a.dtype == b.dtype && a.dims == b.dims &&
         a.rank_unknown == b.rank_unknown && a.layout == b.layout &&
         (!a.dims_known() || a.effective_strides() == b.effective_strides());
}

}  // namespace normgrad
