// Borrowing NumPy arrays (buffer protocol) and PyTorch tensors (DLPack).
#include "arrays.hpp"

#include "dlpack_view.hpp"

namespace normgrad {
namespace python {
namespace {

DataType from_dlpack(const DLDataType& t, bool* bits16) {
  *bits16 = false;
  if (t.lanes != 1) return DataType::kUndef;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 32   ? DataType::kF32
             : t.bits == 16 ? DataType::kF16
             : t.bits == 64 ? DataType::kF64
                            : DataType::kUndef;
    case kDLBfloat:
      return t.bits == 16 ? DataType::kBF16 : DataType::kUndef;
    case kDLInt:
      if (t.bits == 16) *bits16 = true;
      return t.bits == 8    ? DataType::kS8
             : t.bits == 32 ? DataType::kS32
             : t.bits == 64 ? DataType::kS64
                            : DataType::kUndef;
    case kDLUInt:
      if (t.bits == 16) *bits16 = true;
      return t.bits == 8 ? DataType::kU8 : DataType::kUndef;
    default:
      return DataType::kUndef;
  }
}

DataType from_format(const std::string& f, size_t itemsize, bool* bits16) {
  *bits16 = false;
  const char c = f.empty() ? '?' : f.back();  // skip byte-order prefixes such as '<' or '='
  switch (c) {
    case 'f':
      return DataType::kF32;
    case 'e':
      return DataType::kF16;
    case 'd':
      return DataType::kF64;
    case 'b':
      return DataType::kS8;
    case 'B':
      return DataType::kU8;
    case 'h':
    case 'H':
      *bits16 = true;
      return DataType::kUndef;
    case 'i':
    case 'l':
    case 'q':
      return itemsize == 4 ? DataType::kS32 : itemsize == 8 ? DataType::kS64 : DataType::kUndef;
    default:
      return DataType::kUndef;
  }
}

}  // namespace

ArrayView::ArrayView(ArrayView&& o) noexcept {
  *this = std::move(o);
}

ArrayView& ArrayView::operator=(ArrayView&& o) noexcept {
  if (this != &o) {
    if (managed_ && managed_->deleter) managed_->deleter(managed_);
    data = o.data, dtype = o.dtype, bits16 = o.bits16, writable = o.writable;
    dims = std::move(o.dims), strides = std::move(o.strides);
    keep_ = std::move(o.keep_);
    managed_ = o.managed_;
    o.managed_ = nullptr;
  }
  return *this;
}

ArrayView::~ArrayView() {
  if (managed_ && managed_->deleter) managed_->deleter(managed_);
}

ArrayView ArrayView::of(py::handle obj, const std::string& what) {
  ArrayView v;
  const bool is_numpy = py::isinstance<py::array>(obj);
  if (!is_numpy && py::hasattr(obj, "__dlpack__")) {
    if (py::hasattr(obj, "__dlpack_device__")) {
      auto dev = obj.attr("__dlpack_device__")().cast<py::tuple>();
      if (dev[0].cast<int>() != kDLCPU)
        raise(invalid_argument(what +
                               ": the tensor is not on the CPU (normgrad runs on host memory)"));
    }
    py::object capsule = obj.attr("__dlpack__")();
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (m == nullptr) {
      PyErr_Clear();
      raise(invalid_argument(what + ": __dlpack__ did not return a 'dltensor' capsule"));
    }
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // ours now: we call the deleter
    v.managed_ = m;
    v.keep_ = py::reinterpret_borrow<py::object>(obj);
    const DLTensor& t = m->dl_tensor;
    v.dtype = from_dlpack(t.dtype, &v.bits16);
    if (v.dtype == DataType::kUndef && !v.bits16)
      raise(invalid_argument(what + ": unsupported DLPack dtype (code " +
                             std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) +
                             " bits)"));
    v.data = static_cast<char*>(t.data) + t.byte_offset;
    v.dims.assign(t.shape, t.shape + t.ndim);
    if (t.strides) {
      v.strides.assign(t.strides, t.strides + t.ndim);
    } else {
      v.strides = dense_strides(v.dims);
    }
    // PyTorch exports through DLPack whether or not autograd tracks the
    // tensor; writes into an output are the caller's intent.
    v.writable = true;
    return v;
  }
  if (!py::isinstance<py::buffer>(obj))
    raise(invalid_argument(what +
                           ": expected a NumPy array, a PyTorch CPU tensor or another "
                           "object with the buffer protocol or __dlpack__, got " +
                           std::string(py::str(py::type::of(obj)))));
  py::buffer buf = py::reinterpret_borrow<py::buffer>(obj);
  py::buffer_info info = buf.request();
  v.dtype = from_format(info.format, static_cast<size_t>(info.itemsize), &v.bits16);
  if (v.dtype == DataType::kUndef && !v.bits16)
    raise(invalid_argument(what + ": unsupported element format '" + info.format + "'"));
  v.data = info.ptr;
  v.writable = !info.readonly;
  v.dims.assign(info.shape.begin(), info.shape.end());
  for (py::ssize_t s : info.strides) {
    if (s % info.itemsize != 0)
      raise(invalid_argument(what + ": a stride of " + std::to_string(s) +
                             " bytes is not a whole number of elements"));
    v.strides.push_back(s / info.itemsize);
  }
  v.keep_ = py::reinterpret_borrow<py::object>(obj);
  return v;
}

void check_matches(const ArrayView& view, const LogicalTensor& want, const std::string& what) {
  const bool bits_ok =
      view.bits16 && (want.dtype == DataType::kBF16 || want.dtype == DataType::kF16);
  if (view.dtype != want.dtype && !bits_ok) {
    raise(invalid_argument(
        what + " (tensor " + std::to_string(want.id) + "): dtype " +
        (view.bits16 ? std::string("int16/uint16") : dtype_name(view.dtype)) + ", expected " +
        dtype_name(want.dtype) +
        (want.dtype == DataType::kBF16 ? " (torch.bfloat16, or uint16 bit patterns)" : "")));
  }
  if (view.dims != want.dims)
    raise(invalid_argument(what + " (tensor " + std::to_string(want.id) + "): shape " +
                           dims_to_string(view.dims) + ", expected " + dims_to_string(want.dims)));
  const Dims ws = want.effective_strides();
  for (size_t k = 0; k < view.dims.size(); ++k) {
    if (view.dims[k] > 1 && view.strides[k] != ws[k]) {
      raise(invalid_argument(what + " (tensor " + std::to_string(want.id) + "): strides " +
                             dims_to_string(view.strides) + " (elements), expected " +
                             dims_to_string(ws) +
                             "; declare the tensor with these strides (channels_last is NXC) or "
                             "pass a contiguous array"));
    }
  }
}

ArrayView view_for(py::handle obj, const LogicalTensor& want, const std::string& what,
                   bool output) {
  ArrayView v = ArrayView::of(obj, what);
  check_matches(v, want, what);
  if (output && !v.writable) raise(invalid_argument(what + ": the array is read-only"));
  return v;
}

py::array new_array(const LogicalTensor& lt) {
  std::vector<py::ssize_t> shape(lt.dims.begin(), lt.dims.end());
  switch (lt.dtype) {
    case DataType::kF32:
      return py::array_t<float>(shape);
    case DataType::kF16:
      return py::array(py::dtype("float16"), shape);
    case DataType::kBF16:
      return py::array_t<uint16_t>(shape);
    case DataType::kF64:
      return py::array_t<double>(shape);
    case DataType::kS64:
      return py::array_t<int64_t>(shape);
    case DataType::kS32:
      return py::array_t<int32_t>(shape);
    case DataType::kS8:
      return py::array_t<int8_t>(shape);
    case DataType::kU8:
      return py::array_t<uint8_t>(shape);
    default:
      raise(unimplemented(std::string("no NumPy array for ") + dtype_name(lt.dtype) + " tensor " +
                          std::to_string(lt.id)));
  }
}

}  // namespace python
}  // namespace normgrad
