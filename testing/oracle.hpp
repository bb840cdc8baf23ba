// The test oracle, shared by the tests and `normgrad run --check`: valid
// random inputs (with true batch statistics), tensor buffers, error metrics
// and per-dtype thresholds. A library of its own (testing/), so the tests do
// not reach into the command line's sources.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <normgrad/backends/backend.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace oracle {

// Owned dense-or-strided storage for one tensor.
struct Buffer {
  LogicalTensor desc;
  LineVector<char> bytes;  // 64-byte aligned, as frameworks allocate tensors
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

StatusOr<Buffer> allocate(const LogicalTensor& desc);

// Fills every input of `graph` (the user's finalized graph); `lowered` is the
// same graph after the pass pipeline, whose canonical ops decide roles and
// statistics. Inputs found as DIR/<id>.npy
// (when `dir` is not empty) are read; the rest are random from `seed`:
// data uniform in [-1, 1), variance in [0.5, 2), gamma in [0.5, 1.5) and never
// all ones. A BatchNormTrainingBackward's mean and variance, when random, are
// the true (biased) batch statistics of its src, computed in float64 on the
// rounded data (1/sqrt(var + eps) in the inverse-std convention); a zero
// variance becomes 1 so the inputs stay valid. A BatchNormBackwardApply's
// count, when random, is its src's elements per channel (one process).
// `sources`, when not null, receives "file", "random", "batch-stats" or
// "local-count" per tensor id.
// `data_offset` shifts the data of every batch-norm src (e.g. 1e4) to expose
// cancellation in one-pass statistics.
StatusOr<std::map<int64_t, Buffer>> make_inputs(const Graph& graph, const Graph& lowered,
                                                const std::string& dir, uint64_t seed,
                                                std::map<int64_t, std::string>* sources,
                                                double data_offset = 0.0);

// Runs `cg` on `inputs` (by tensor id; ids `cg` does not read are left out)
// into fresh buffers: its outputs by id.
StatusOr<std::map<int64_t, Buffer>> run_outputs(const CompiledGraph& cg,
                                                const std::map<int64_t, Buffer>& inputs);

struct ErrorStats {
  double max_abs = 0.0;
  double rel_l2 = 0.0;  // ||got - want|| / ||want|| (absolute L2 when want is all zero)
  int64_t nan_mismatch = 0;
  int64_t differing = 0;  // elements that differ at all
  int64_t elements = 0;
};

ErrorStats compare(const Buffer& got, const Buffer& want);

// Relative L2 limits. Data outputs (reduction_length 0), as benchdnn's:
// 6e-7 f32, 4.9e-3 f16, 3.9e-2 bf16 (s8/u8: 1e-2). Per-channel reductions of M
// terms (diff_gamma, diff_beta, batch statistics): max(base, 4 * 2^-23 *
// sqrt(M)) with base 1e-5 f32 and 1e-2 f16/bf16 (docs/cli.md gives the why).
double threshold_for(DataType dt, int64_t reduction_length);

// The test suite's limits for 16-bit data outputs, tighter than benchdnn's
// (which `run --check` keeps): relative L2 1e-3 for f16 and 1e-2 for bf16
// against float64 computed from the same rounded inputs (one output rounding
// costs about 2.5e-4 and 2e-3); others as threshold_for.
double test_threshold_for(DataType dt, int64_t reduction_length);

// The largest |got - want| / (2 ulp(want) + 2 eps rms(want)) over the
// elements (<= 1 passes), eps and ulp of want's dtype: one bound per element
// that holds near zero too, so a result that is right in L2 but wrong in a
// few elements (a tail left zero) fails. NaN and Inf must match exactly. An
// all-zero reference gives 0 (no scale to bound against; compare's absolute
// L2 still applies).
double element_bound_ratio(const Buffer& got, const Buffer& want);

// M (elements per channel) when output `tensor_id` of the graph is a
// per-channel reduction of a batch norm, else 0.
int64_t reduction_length(const Graph& graph, int64_t tensor_id);

}  // namespace oracle
}  // namespace normgrad
