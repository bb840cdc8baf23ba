// Shared pieces of the oneDNN backend: the engine, memory descriptors built
// from logical tensors, the plan cache, and turning dnnl::error into Status.
//
// Built only with NORMGRAD_WITH_DNNL (Debian's oneDNN 2.6, primitives API).
// Every call into oneDNN goes through `guard`, so no exception crosses the
// backend boundary.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include <normgrad/backends/backend.hpp>

#include <normgrad/graph/logical_tensor.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace dnnl_impl {

// One CPU engine per process.
const dnnl::engine& cpu_engine();

// f32 and bf16 map to oneDNN; anything else is refused with a reason.
StatusOr<dnnl::memory::data_type> to_dnnl(DataType dt);

// A memory descriptor for `lt` whose oneDNN dim i is our dim perm[i] (identity
// when perm is empty), keeping the tensor's own strides, so any strided
// layout is described exactly.
StatusOr<dnnl::memory::desc> make_md(const LogicalTensor& lt, DataType dt,
                                     const std::vector<int>& perm = {});

// oneDNN's batch-norm dim order (N, C, spatial...) as a perm for make_md: its
// dim i is our dim perm[i], with the channel at `channel_axis`.
std::vector<int> channel_second_perm(int rank, int channel_axis);

// A per-channel tensor (statistics, scale, shift; bf16 or f32, strided 1-D
// allowed) as dense f32, oneDNN's only statistics type.
std::vector<float> channel_values_f32(const void* p, const LogicalTensor& lt, int64_t c);

// Runs `fn`, turning dnnl::error (and any other exception) into a Status:
// while building (`what` without "execute") every oneDNN error is a decline
// (kUnimplemented); while executing, unimplemented/invalid arguments/out of
// memory/other map to kUnimplemented/kInvalidArgument/kOutOfRange/kInternal.
Status guard(const std::string& what, const std::function<void()>& fn);

// The CPU ISA oneDNN dispatches to (ONEDNN_MAX_CPU_ISA caps it), e.g. "avx2".
std::string effective_isa_name();

// A build-time decline of `primitive` on `dt` data, said as what is missing:
// "oneDNN 2.6 has no bf16 batch_normalization_backward on this CPU (avx2);
// it needs AVX-512 (avx512_core) [oneDNN: ... (status 3)]". Other statuses
// pass through unchanged.
Status explain_decline(Status s, const char* primitive, DataType dt);

// A per-execute user scratchpad for `pd`, as oneDNN's library scratchpad is
// not thread-safe.
struct Scratchpad {
  ScratchBuffer bytes;  // from the execution's allocator
  dnnl::memory mem;
};
Scratchpad make_scratchpad(const dnnl::primitive_desc_base& pd);

// Thread-safe cache of compiled plans by signature string.
template <typename Plan>
class PlanCache {
 public:
  StatusOr<std::shared_ptr<const Plan>> get_or_build(
      const std::string& key, const std::function<StatusOr<std::shared_ptr<const Plan>>()>& build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    auto plan = build();  // outside the lock: building can take milliseconds
    if (!plan.ok()) return plan.status();
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.emplace(key, *plan).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans_;
};

}  // namespace dnnl_impl
}  // namespace normgrad
