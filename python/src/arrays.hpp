// Host arrays as normgrad sees them: a borrowed pointer with dtype, dims and
// element strides, taken without copying from anything that speaks the
// buffer protocol (NumPy) or DLPack (PyTorch CPU tensors).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include <normgrad/graph/logical_tensor.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace python {

namespace py = pybind11;

// Raised as normgrad.Error (registered in module.cpp).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void raise(const Status& s) {
  throw Error(s.to_string());
}
inline void check(const Status& s) {
  if (!s.ok()) raise(s);
}
template <typename T>
T unwrap(StatusOr<T> r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}

struct DLManagedTensor;

// A view of one array. `bits16` marks 16-bit integers, which may carry bf16
// or f16 bit patterns (NumPy has no bf16). Move-only: a DLPack view calls
// the producer's deleter when it dies.
class ArrayView {
 public:
  ArrayView() = default;
  ArrayView(ArrayView&& o) noexcept;
  ArrayView& operator=(ArrayView&& o) noexcept;
  ArrayView(const ArrayView&) = delete;
  ArrayView& operator=(const ArrayView&) = delete;
  ~ArrayView();

  // `what` names the array in messages ("input 3").
  static ArrayView of(py::handle obj, const std::string& what);

  void* data = nullptr;
  DataType dtype = DataType::kUndef;
  bool bits16 = false;
  bool writable = true;
  Dims dims, strides;  // strides in elements

 private:
  py::object keep_;  // the buffer's owner
  DLManagedTensor* managed_ = nullptr;
};

// Checks that `view` can stand for `want` (the compiled graph's tensor):
// dtype (16-bit integers for bf16/f16 bits), dims, and strides, where dims
// of size 1 may have any stride. Raises normgrad.Error naming `what`.
void check_matches(const ArrayView& view, const LogicalTensor& want, const std::string& what);

// ArrayView::of(obj) checked against `want` (check_matches); an `output` must
// also be writable. Raises normgrad.Error naming `what`.
ArrayView view_for(py::handle obj, const LogicalTensor& want, const std::string& what, bool output);

// A new NumPy array for `lt` (dense; bf16 as uint16 bit patterns).
py::array new_array(const LogicalTensor& lt);

}  // namespace python
}  // namespace normgrad
