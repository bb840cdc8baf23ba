// Staging for the JIT's backward driver (jit_staging.hpp): strided tensors
// copied to and from dense per-thread buffers.
#include <normgrad/backends/jit/jit_staging.hpp>

#include <cstring>
#include <vector>

namespace normgrad {
namespace jit {
namespace {

// Walks the rows of `dims` (all but the last dim, row-major order), calling
// fn(row, offset of the row in elements under `strides`); offsets advance
// like an odometer, with no division per row.
template <typename Fn>
void for_each_row(const Dims& dims, const Dims& strides, const Fn& fn) {
  const size_t rank = dims.size();
  if (rank == 0) return;
  int64_t outer = 1;
  for (size_t k = 0; k + 1 < rank; ++k) outer *= dims[k];
  std::vector<int64_t> idx(rank, 0);
  int64_t off = 0;
  for (int64_t row = 0; row < outer; ++row) {
    fn(row, off);
    for (size_t k = rank - 1; k-- > 0;) {  // next row: carry through the outer dims
      off += strides[k];
      if (++idx[k] < dims[k]) break;
      off -= strides[k] * dims[k];
      idx[k] = 0;
    }
  }
}

// Pixels [r0, r0 + len) of a tensor (every index but the channel's, in
// row-major order), each pixel's C values, between strided memory and a dense
// [len][C] buffer.
template <bool kGather>
void move_pixels(char* dense, char* strided, const Dims& strides, const Dims& dims, int axis,
                 int64_t es, int64_t r0, int64_t len) {
  const auto rank = static_cast<int>(dims.size());
  const int64_t c = dims[axis], cs = strides[axis];
  for (int64_t p = r0; p < r0 + len; ++p) {
    int64_t off = 0, rest = p;
    for (int k = rank - 1; k >= 0; --k) {
      if (k == axis) continue;
      off += (rest % dims[k]) * strides[k];
      rest /= dims[k];
    }
    char* row = dense + (p - r0) * c * es;
    char* mem = strided + off * es;
    if (cs == 1) {
      if (kGather) {
        std::memcpy(row, mem, static_cast<size_t>(c * es));
      } else {
        std::memcpy(mem, row, static_cast<size_t>(c * es));
      }
      continue;
    }
    for (int64_t j = 0; j < c; ++j) {
      if (kGather) {
        std::memcpy(row + j * es, mem + j * cs * es, static_cast<size_t>(es));
      } else {
        std::memcpy(mem + j * cs * es, row + j * es, static_cast<size_t>(es));
      }
    }
  }
}

}  // namespace

void gather_pixels(char* dense, const char* strided, const Dims& strides, const Dims& dims,
                   int axis, int64_t es, int64_t r0, int64_t len) {
  move_pixels<true>(dense, const_cast<char*>(strided), strides, dims, axis, es, r0, len);
}

void scatter_pixels(const char* dense, char* strided, const Dims& strides, const Dims& dims,
                    int axis, int64_t es, int64_t r0, int64_t len) {
  move_pixels<false>(const_cast<char*>(dense), strided, strides, dims, axis, es, r0, len);
}

// Per-thread staging buffers, grown on demand and kept: fresh pages would
// fault on every task.
char* stage_buffer(int which, size_t bytes) {
  thread_local std::vector<char> buffers[3];
  std::vector<char>& b = buffers[which];
  if (b.size() < bytes + 64) b.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(b.data());
  return b.data() + ((64 - p % 64) % 64);
}

// Copies the elements of `dims` (row-major order) from strided `src` into dense `dst`.
void gather_dense(const char* src, const Dims& strides, const Dims& dims, int64_t es, char* dst) {
  if (dims.empty()) return;
  const int64_t inner = dims.back(), is = strides.back();
  for_each_row(dims, strides, [&](int64_t row, int64_t off) {
    const char* s = src + off * es;
    char* d = dst + row * inner * es;
    if (is == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner * es));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * es, s + j * is * es, static_cast<size_t>(es));
    }
  });
}

// The reverse: dense `src` into strided `dst`.
void scatter_dense(const char* src, char* dst, const Dims& strides, const Dims& dims, int64_t es) {
  if (dims.empty()) return;
  const int64_t inner = dims.back(), is = strides.back();
  for_each_row(dims, strides, [&](int64_t row, int64_t off) {
    const char* s = src + row * inner * es;
    char* d = dst + off * es;
    if (is == 1) {
      std::memcpy(d, s, static_cast<size_t>(inner * es));
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * is * es, s + j * es, static_cast<size_t>(es));
    }
  });
}

// The sub-tensor of one channel (dims without the channel axis, and their strides).
void channel_view(const Dims& dims, const Dims& strides, int axis, Dims* sub_dims,
                  Dims* sub_strides) {
  sub_dims->clear();
  sub_strides->clear();
  for (size_t k = 0; k < dims.size(); ++k) {
    if (static_cast<int>(k) == axis) continue;
    sub_dims->push_back(dims[k]);
    sub_strides->push_back(strides[k]);
  }
}

}  // namespace jit
}  // namespace normgrad
