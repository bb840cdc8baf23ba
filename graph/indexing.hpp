// Strided index walking: a logical index space and its element offsets.
//
// The reference backend and the test oracle address every tensor through its
// own strides, so they run any layout the IR can describe. These helpers
// enumerate a logical index space and hand out the matching element offsets;
// they favour obviousness over speed.
#pragma once

#include <cstdint>
#include <vector>

#include <normgrad/graph/logical_tensor.hpp>

namespace normgrad {

// Offset of logical index `idx` under `strides`.
inline int64_t offset_of(const std::vector<int64_t>& idx, const Dims& strides) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides[i];
  return off;
}

// Calls fn(idx) for every index of `dims` in row-major order, with axis `fixed_axis`
// (if >= 0) held at `fixed_value`.
template <typename Fn>
void for_each_index(const Dims& dims, int fixed_axis, int64_t fixed_value, Fn&& fn) {
  const int rank = static_cast<int>(dims.size());
  for (int i = 0; i < rank; ++i) {
    if (i != fixed_axis && dims[i] == 0) return;
  }
  std::vector<int64_t> idx(dims.size(), 0);
  if (fixed_axis >= 0) idx[fixed_axis] = fixed_value;
  while (true) {
    fn(static_cast<const std::vector<int64_t>&>(idx));
    int i = rank - 1;
    for (; i >= 0; --i) {
      if (i == fixed_axis) continue;
      if (++idx[i] < dims[i]) break;
      idx[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace normgrad
