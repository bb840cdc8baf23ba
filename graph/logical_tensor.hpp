// LogicalTensor: the metadata of one tensor edge in the graph, and dims arithmetic.
//
// A logical tensor has an id, a dtype, dims (each >= 0, or kUnknownDim before
// shape inference; `rank_unknown` when even the rank is not known, as oneDNN's
// one-element INT64_MIN shape says; an empty dims list with a known rank is a
// rank-0 scalar), strides for the `strided` layout and a property. Every product of dims and every
// byte size goes through the overflow-checked helpers here, so a lying shape becomes an error
// instead of a wrapped size.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <normgrad/graph/data_type.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

using Dims = std::vector<int64_t>;

// oneDNN writes unknown dims and strides as INT64_MIN.
constexpr int64_t kUnknownDim = std::numeric_limits<int64_t>::min();
constexpr int kMaxRank = 12;

// kOpaque is a backend-private layout in oneDNN's dumps: carried through, never read by us.
enum class LayoutType : uint8_t { kUndef, kAny, kStrided, kOpaque };
enum class PropertyType : uint8_t { kUndef, kVariable, kConstant, kHostScalar };

const char* layout_type_name(LayoutType layout);
StatusOr<LayoutType> parse_layout_type(const std::string& name);
const char* property_type_name(PropertyType property);
StatusOr<PropertyType> parse_property_type(const std::string& name);

// a * b and a + b on int64, or an out_of_range error naming `what`.
StatusOr<int64_t> checked_mul(int64_t a, int64_t b, const std::string& what);
StatusOr<int64_t> checked_add(int64_t a, int64_t b, const std::string& what);
// Product of dims (1 for rank 0), overflow-checked; dims must be known and >= 0.
StatusOr<int64_t> checked_product(const Dims& dims, const std::string& what);
// Row-major dense strides for dims (all known).
Dims dense_strides(const Dims& dims);
// The strides of NCX-ordered `dims` laid out channels last (N, spatial...,
// C dense): a framework's channels_last tensor. Rank < 3: dense_strides.
Dims channels_last_strides(const Dims& dims);
// Whether strides `a` and `b` of `dims` address the same elements: they may
// differ only on axes of extent 1 (torch's channels_last of an N x C x 1 x 1
// tensor is dense too).
bool same_layout(const Dims& dims, const Dims& a, const Dims& b);
// "2x3x4"; unknown dims print as "?", rank 0 as "scalar".
std::string dims_to_string(const Dims& dims);

struct LogicalTensor {
  int64_t id = -1;
  DataType dtype = DataType::kUndef;
  Dims dims;     // empty with a known rank: a scalar
  Dims strides;  // empty or unknown entries: dense row-major
  bool rank_unknown = false;
  LayoutType layout = LayoutType::kStrided;
  PropertyType property = PropertyType::kUndef;

  LogicalTensor() = default;
  LogicalTensor(int64_t id_in, DataType dt, Dims dims_in)
      : id(id_in), dtype(dt), dims(std::move(dims_in)) {}

  int rank() const { return static_cast<int>(dims.size()); }
  bool rank_known() const { return !rank_unknown; }
  bool dims_known() const;
  // True when the strides given (if any) are all known.
  bool strides_known() const;
  // Strides to use for addressing: the given ones if known, dense otherwise.
  Dims effective_strides() const;
  // Element count, overflow-checked.
  StatusOr<int64_t> element_count() const;
  // Size in elements of the buffer that the strides address (max offset + 1),
  // overflow-checked; equals element_count() for dense tensors.
  StatusOr<int64_t> buffer_elements() const;
  StatusOr<int64_t> buffer_bytes() const;
  // Checks known dims >= 0, rank <= kMaxRank, strides >= 0 and matching rank,
  // and that the buffer byte size fits in int64. `what` names the tensor.
  // True when validate() would pass, without building its messages.
  bool is_valid() const;
  Status validate(const std::string& what) const;
  // True when no two logical elements share an address (dims of size 1 and
  // empty tensors never overlap). Inputs may alias (a broadcast view); outputs may not.
  bool non_overlapping() const;
  // "id 3 f32 2x3x4".
  std::string to_string() const;
};

// Same id, dtype, dims, layout and effective strides.
bool same_metadata(const LogicalTensor& a, const LogicalTensor& b);

}  // namespace normgrad
