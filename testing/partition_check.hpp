// Judging a compiled graph partition by partition, each on its own inputs.
//
// A graph's outputs compared with a whole-graph ref run charge a partition
// with every rounding upstream of it: a 16-bit diff_src that rounds one
// element the other way moves the next batch norm's diff_gamma by that
// element's share, which the next sum's bound never allowed for (its terms
// are the kernel's inputs, not ref's). So each partition runs on exactly the
// values the backend under test computed before it (the graph's inputs, then
// what earlier partitions wrote), ref runs its ops one by one on the same
// values, and each output is held to check_output's limits for that
// partition's kernel. `normgrad run --check` and `normgrad fuzz` both judge
// this way.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>

namespace normgrad {
namespace oracle {

struct PartitionOutputCheck {
  int64_t partition_id = 0;
  std::string ops;     // the partition's ops, as Partition::ops_string
  std::string kernel;  // the kernel that computed it
  LogicalTensor tensor;
  OutputVerdict verdict;
  // ref's value of the tensor on the partition's inputs, when asked for.
  std::optional<Buffer> want;
};

// Runs every compiled partition of `cg` in plan order on this backend's own
// values, and ref op by op on the same inputs (intermediates in their own
// dtype), and judges every partition output. `values` receives every tensor
// the backend computed, graph inputs included: a caller compares
// CompiledGraph::execute's outputs with them bit for bit. A partition whose
// input no earlier partition wrote and `inputs` lacks is an error.
// `keep_reference` keeps ref's value of each output in its check, for a
// caller's own limits; off, a large graph's check holds no second copy.
StatusOr<std::vector<PartitionOutputCheck>> check_partitions(
    const CompiledGraph& cg, const std::map<int64_t, Buffer>& inputs,
    std::map<int64_t, Buffer>* values, bool keep_reference = false);

// One line for a failing (or passing) output: partition, kernel, tensor, the
// error and its limits.
std::string describe(const PartitionOutputCheck& check);

}  // namespace oracle
}  // namespace normgrad
