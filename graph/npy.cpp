// .npy reading and writing with strict header parsing.
#include <normgrad/graph/npy.hpp>

#include <cstring>
#include <fstream>

#include <normgrad/graph/json_io.hpp>

namespace normgrad {
namespace {

// The .npy descriptor each dtype is written as (bf16 as exact f32).
std::string npy_descr(DataType dt) {
  switch (dt) {
    case DataType::kF16:
      return "<f2";
    case DataType::kS8:
      return "|i1";
    case DataType::kU8:
      return "|u1";
    case DataType::kS32:
      return "<i4";
    case DataType::kS64:
      return "<i8";
    case DataType::kF64:
      return "<f8";
    default:
      return "<f4";
  }
}

constexpr char kMagic[] = "\x93NUMPY";

// Skips spaces; returns false at the end.
bool skip_ws(const std::string& h, size_t& p) {
  while (p < h.size() && (h[p] == ' ' || h[p] == '\t' || h[p] == '\n')) ++p;
  return p < h.size();
}

// Parses the Python dict literal of a .npy header: {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }
Status parse_header_dict(const std::string& h, NpyArray& out, bool& fortran) {
  size_t p = 0;
  bool have_descr = false, have_order = false, have_shape = false;
  if (!skip_ws(h, p) || h[p] != '{') return invalid_argument("npy header: expected '{'");
  ++p;
  while (true) {
    if (!skip_ws(h, p)) return invalid_argument("npy header: unterminated dict");
    if (h[p] == '}') break;
    if (h[p] != '\'' && h[p] != '"') return invalid_argument("npy header: expected a quoted key");
    const char q = h[p++];
    const size_t key_end = h.find(q, p);
    if (key_end == std::string::npos) return invalid_argument("npy header: unterminated key");
    const std::string key = h.substr(p, key_end - p);
    p = key_end + 1;
    if (!skip_ws(h, p) || h[p] != ':')
      return invalid_argument("npy header: expected ':' after '" + key + "'");
    ++p;
    if (!skip_ws(h, p)) return invalid_argument("npy header: missing value for '" + key + "'");
    if (key == "descr") {
      if (h[p] != '\'' && h[p] != '"')
        return invalid_argument("npy header: descr must be a string");
      const char vq = h[p++];
      const size_t e = h.find(vq, p);
      if (e == std::string::npos) return invalid_argument("npy header: unterminated descr");
      out.descr = h.substr(p, e - p);
      p = e + 1;
      have_descr = true;
    } else if (key == "fortran_order") {
      if (h.compare(p, 4, "True") == 0) {
        fortran = true;
        p += 4;
      } else if (h.compare(p, 5, "False") == 0) {
        fortran = false;
        p += 5;
      } else {
        return invalid_argument("npy header: fortran_order must be True or False");
      }
      have_order = true;
    } else if (key == "shape") {
      if (h[p] != '(') return invalid_argument("npy header: shape must be a tuple");
      ++p;
      out.shape.clear();
      while (true) {
        if (!skip_ws(h, p)) return invalid_argument("npy header: unterminated shape");
        if (h[p] == ')') {
          ++p;
          break;
        }
        if (h[p] < '0' || h[p] > '9')
          return invalid_argument("npy header: shape entries must be non-negative integers");
        int64_t v = 0;
        while (p < h.size() && h[p] >= '0' && h[p] <= '9') {
          if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, h[p] - '0', &v)) {
            return out_of_range("npy header: shape entry overflows int64");
          }
          ++p;
        }
        out.shape.push_back(v);
        if (out.shape.size() > static_cast<size_t>(kMaxRank))
          return invalid_argument("npy header: rank exceeds " + std::to_string(kMaxRank));
        if (!skip_ws(h, p)) return invalid_argument("npy header: unterminated shape");
        if (h[p] == ',')
          ++p;
        else if (h[p] != ')')
          return invalid_argument("npy header: malformed shape tuple");
      }
      have_shape = true;
    } else {
      return invalid_argument("npy header: unknown key '" + key + "'");
    }
    if (!skip_ws(h, p)) return invalid_argument("npy header: unterminated dict");
    if (h[p] == ',')
      ++p;
    else if (h[p] != '}')
      return invalid_argument("npy header: expected ',' or '}'");
  }
  if (!have_descr || !have_order || !have_shape) {
    return invalid_argument("npy header: needs descr, fortran_order and shape");
  }
  return ok_status();
}

int64_t descr_size(const std::string& d) {
  if (d == "<f4") return 4;
  if (d == "<f2" || d == "<u2") return 2;
  if (d == "<f8" || d == "<i8") return 8;
  if (d == "|i1" || d == "|u1") return 1;
  if (d == "<i4") return 4;
  return 0;
}

}  // namespace

StatusOr<NpyArray> parse_npy(const std::string& bytes, int64_t max_payload_bytes) {
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    return invalid_argument("not a .npy file (bad magic)");
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len =
        static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return invalid_argument("npy: truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    return invalid_argument("npy: unsupported format version " + std::to_string(major));
  }
  if (header_len > bytes.size() - offset)
    return invalid_argument("npy: header length " + std::to_string(header_len) +
                            " runs past the end of the file");
  NpyArray arr;
  bool fortran = false;
  NG_RETURN_IF_ERROR(parse_header_dict(bytes.substr(offset, header_len), arr, fortran));
  const int64_t esize = descr_size(arr.descr);
  if (esize == 0)
    return invalid_argument("npy: dtype '" + arr.descr +
                            "' is not supported (<f4, <f2, <u2, <f8, |i1, |u1, <i4, <i8)");
  NG_ASSIGN_OR_RETURN(int64_t count, checked_product(arr.shape, "npy shape"));
  NG_ASSIGN_OR_RETURN(int64_t payload, checked_mul(count, esize, "npy payload"));
  if (payload > max_payload_bytes)
    return out_of_range("npy: payload of " + std::to_string(payload) +
                        " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  if (fortran && arr.shape.size() > 1 && count > 1)
    return invalid_argument("npy: fortran_order arrays are not supported");
  const size_t start = offset + header_len;
  if (bytes.size() - start != static_cast<size_t>(payload)) {
    return invalid_argument("npy: payload is " + std::to_string(bytes.size() - start) +
                            " bytes, the header's shape " + dims_to_string(arr.shape) + " needs " +
                            std::to_string(payload));
  }
  arr.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(start), bytes.end());
  return arr;
}

StatusOr<NpyArray> read_npy_file(const std::string& path, int64_t max_payload_bytes) {
  NG_ASSIGN_OR_RETURN(
      std::string bytes,
      read_text_file(path, static_cast<size_t>(max_payload_bytes) + (size_t{1} << 20)));
  auto arr = parse_npy(bytes, max_payload_bytes);
  if (!arr.ok()) return arr.status().with_context(path);
  return arr;
}

Status read_npy_into(const std::string& path, const LogicalTensor& expected, void* buffer) {
  NG_ASSIGN_OR_RETURN(int64_t count, expected.element_count());
  NG_ASSIGN_OR_RETURN(int64_t bytes, checked_mul(count, 8, "npy read"));
  NG_ASSIGN_OR_RETURN(NpyArray arr, read_npy_file(path, bytes));
  if (arr.shape != expected.dims) {
    return invalid_argument(path + ": shape " + dims_to_string(arr.shape) +
                            " does not match tensor " + std::to_string(expected.id) + "'s " +
                            dims_to_string(expected.dims));
  }
  const char* src = arr.data.data();
  auto mismatch = [&]() {
    return invalid_argument(path + ": dtype '" + arr.descr + "' cannot hold tensor " +
                            std::to_string(expected.id) + " of dtype " +
                            dtype_name(expected.dtype) + " (use " + npy_descr(expected.dtype) +
                            (expected.dtype == DataType::kBF16 ? " or <u2)" : ")"));
  };
  switch (expected.dtype) {
    case DataType::kF32:
      if (arr.descr != "<f4") return mismatch();
      std::memcpy(buffer, src, static_cast<size_t>(count) * 4);
      return ok_status();
    case DataType::kF16:
      if (arr.descr != "<f2") return mismatch();
      std::memcpy(buffer, src, static_cast<size_t>(count) * 2);
      return ok_status();
    case DataType::kBF16:
      if (arr.descr == "<u2") {
        std::memcpy(buffer, src, static_cast<size_t>(count) * 2);
        return ok_status();
      }
      if (arr.descr != "<f4") return mismatch();
      for (int64_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        static_cast<uint16_t*>(buffer)[i] = f32_to_bf16_bits(f);
      }
      return ok_status();
    case DataType::kS8:
    case DataType::kU8:
    case DataType::kS32:
    case DataType::kS64:
    case DataType::kF64:
      if (arr.descr != npy_descr(expected.dtype)) return mismatch();
      std::memcpy(buffer, src, static_cast<size_t>(count * dtype_size(expected.dtype)));
      return ok_status();
    default:
      break;
  }
  return mismatch();
}

Status write_npy(const std::string& path, const LogicalTensor& desc, const void* buffer) {
  NG_ASSIGN_OR_RETURN(int64_t count, desc.element_count());
  std::string shape = "(";
  for (size_t i = 0; i < desc.dims.size(); ++i)
    shape += std::to_string(desc.dims[i]) + (desc.dims.size() == 1      ? ","
                                             : i + 1 < desc.dims.size() ? ", "
                                                                        : "");
  shape += ")";
  if (!is_loadable_dtype(desc.dtype)) {
    return invalid_argument(path + ": tensor " + std::to_string(desc.id) + " of dtype " +
                            dtype_name(desc.dtype) + " has no .npy form here");
  }
  const std::string descr = npy_descr(desc.dtype);
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so the data starts on a 64-byte boundary; the header ends in '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return not_found(path + ": cannot open for writing");
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  const char hl_bytes[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(hl_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (desc.dtype == DataType::kBF16) {
    for (int64_t i = 0; i < count; ++i) {
      const float f = bf16_bits_to_f32(static_cast<const uint16_t*>(buffer)[i]);
      out.write(reinterpret_cast<const char*>(&f), 4);
    }
  } else {
    out.write(static_cast<const char*>(buffer),
              static_cast<std::streamsize>(count * dtype_size(desc.dtype)));
  }
  if (!out) return internal_error(path + ": write failed");
  return ok_status();
}

}  // namespace normgrad
