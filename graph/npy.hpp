// NumPy .npy tensor files: the tensor format of `normgrad run`.
//
// f32 <-> '<f4' and f16 <-> '<f2'. bf16 is written as '<f4' (exact) and read
// from '<f4' (rounded to nearest even) or '<u2' (raw bits). Headers are parsed
// strictly: a shape or dtype that disagrees with the expected tensor, a header
// that lies about its length, or a truncated payload is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <normgrad/graph/logical_tensor.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

struct NpyArray {
  std::string descr;  // '<f4', '<f2', '<u2', ...
  Dims shape;
  std::vector<char> data;  // C order, little endian
};

StatusOr<NpyArray> parse_npy(const std::string& bytes, int64_t max_payload_bytes);
StatusOr<NpyArray> read_npy_file(const std::string& path, int64_t max_payload_bytes);

// Reads `path` into a dense buffer of `expected` (dtype and dims), converting as
// described above. `buffer` must hold expected.element_count() elements.
Status read_npy_into(const std::string& path, const LogicalTensor& expected, void* buffer);
// Writes a dense buffer of `desc` to `path`.
Status write_npy(const std::string& path, const LogicalTensor& desc, const void* buffer);

}  // namespace normgrad
