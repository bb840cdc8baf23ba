// Staging for the JIT's backward driver (private): strided data the kernels
// cannot walk in place is copied into dense per-thread buffers and back.
#pragma once

#include <cstddef>
#include <cstdint>

#include <normgrad/graph/logical_tensor.hpp>

namespace normgrad {
namespace jit {

// Per-thread staging buffer `which` (0..2), at least `bytes` long and
// 64-byte aligned, grown on demand and kept: fresh pages would fault on
// every task.
char* stage_buffer(int which, size_t bytes);
// Copies the elements of `dims` (row-major order) from strided `src` into dense `dst`.
void gather_dense(const char* src, const Dims& strides, const Dims& dims, int64_t es, char* dst);
// The reverse: dense `src` into strided `dst`.
void scatter_dense(const char* src, char* dst, const Dims& strides, const Dims& dims, int64_t es);
// Pixels [r0, r0 + len) of a tensor (every index but the channel's, in
// row-major order), each pixel's C values, from strided memory into a dense
// [len][C] buffer, and back.
void gather_pixels(char* dense, const char* strided, const Dims& strides, const Dims& dims,
                   int axis, int64_t es, int64_t r0, int64_t len);
void scatter_pixels(const char* dense, char* strided, const Dims& strides, const Dims& dims,
                    int axis, int64_t es, int64_t r0, int64_t len);
// The sub-tensor of one channel (dims without the channel axis, and their strides).
void channel_view(const Dims& dims, const Dims& strides, int axis, Dims* sub_dims,
                  Dims* sub_strides);

}  // namespace jit
}  // namespace normgrad
