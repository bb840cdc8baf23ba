// Backend and Kernel: the interface every backend implements.
//
// A backend declares the patterns it has kernels for (patterns(); the
// partitioner matches them), answers supports(partition) for a partition one
// of its patterns matched with OK or the reason it declines (sizes, strides,
// ISA: what the pattern's structure does not say), and compiles a supported
// partition into a Kernel. A Kernel is immutable after
// compile and may be executed from many threads at once; it receives dense or
// strided buffers already checked against the partition's tensors.
#pragma once

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/graph/partition.hpp>
#include <normgrad/graph/status.hpp>
#include <normgrad/passes/pattern.hpp>

namespace normgrad {

// oneDNN Graph's allocator hook: where intermediates between partitions and
// the kernels' scratch memory come from during an execution. Both functions
// must be set; allocate returns memory aligned to `alignment` (or nullptr).
struct Allocator {
  std::function<void*(size_t bytes, size_t alignment)> allocate;
  std::function<void(void*)> deallocate;
};

// The allocator of the execution running on this thread: set by
// CompiledGraph::execute and CompiledPartition::execute for their duration;
// nullptr means the heap. Kernels allocate scratch on the calling thread.
const Allocator* current_allocator();
class AllocatorScope {
 public:
  explicit AllocatorScope(const Allocator* a);
  ~AllocatorScope();
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;

 private:
  const Allocator* previous_;
};

// A std::vector allocator on 64-byte lines, as frameworks allocate tensors
// and as streaming stores and full-vector memory operands want (from
// malloc's 16-byte alignment every vector load of such an array splits two
// cache lines).
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const LineAllocator&) const { return true; }
  bool operator!=(const LineAllocator&) const { return false; }
};
template <typename T>
using LineVector = std::vector<T, LineAllocator<T>>;

// Scratch bytes from the current allocator (or the heap), 64-byte aligned,
// released on destruction. data() is nullptr when the allocation failed.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(ScratchBuffer&& other) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();
  char* data_ = nullptr;
  size_t size_ = 0;
  const Allocator* owner_ = nullptr;
};

// The buffers of one partition execution, by tensor id: the caller's inputs
// and outputs, and scratch (from the current allocator) for tensors produced
// and consumed inside the partition. Kernels that run a partition piece by
// piece (ref op by op, oneDNN's primitive chains) share it.
class PartitionBuffers {
 public:
  PartitionBuffers(const Partition& p, const std::vector<const void*>& in,
                   const std::vector<void*>& out);
  // Where `lt` is read from: a partition input or a tensor written earlier.
  StatusOr<const void*> read(const LogicalTensor& lt) const;
  // Where `lt` is written: a partition output, or fresh scratch.
  StatusOr<void*> write(const LogicalTensor& lt);

 private:
  std::map<int64_t, void*> buffers_;
  std::map<int64_t, ScratchBuffer> scratch_;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // e.g. "ref:batch_norm_bwd" or oneDNN's "bnorm_jit:avx512_core".
  virtual std::string name() const = 0;
  // Extra facts for verbose lines, e.g. the JIT's code-generation time.
  virtual std::string info() const { return ""; }
  // Everything the kernel's code and walk depend on, where the name does
  // not say it all (the JIT forward: its conf's key): two kernels of one
  // partition with the same config run alike (`normgrad tune` drops a
  // variant that leaves it as it was).
  virtual std::string config() const { return name(); }
  // inputs and outputs follow the partition's port order.
  virtual Status execute(const std::vector<const void*>& inputs,
                         const std::vector<void*>& outputs) const = 0;
};

// What a backend may need beyond the partition: the communicators of the
// AllReduce groups (CompileOptions::communicators).
struct CompileContext {
  CommunicatorMap communicators;
  // CompileOptions::jit_variant: a named kernel variant for A/B measurements.
  std::string jit_variant;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // In this backend's order of preference: fused patterns first.
  virtual std::vector<Pattern> patterns() const = 0;
  // `partition` carries the pattern, anchor and backend the partitioner set.
  virtual Status supports(const Partition& partition, const CompileContext& ctx) const = 0;
  virtual StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                          const CompileContext& ctx) const = 0;
  // Whether the backend's own settings (its environment variables) are
  // valid; a compile that could use the backend fails with this error
  // rather than quietly running elsewhere.
  virtual Status configuration() const { return ok_status(); }
  // The named kernel variants CompileOptions::jit_variant may ask this
  // backend for (`normgrad tune` times them); none by default.
  virtual std::vector<std::string> variants() const { return {}; }
  // Whether CompileOptions::jit_variant `name` is one this backend takes
  // (with its parameter in range), before any compile asks for it.
  virtual Status check_variant(const std::string& name) const {
    return unimplemented("variant '" + name + "': this backend has no kernel variants");
  }
};

// The registry: one entry per backend normgrad knows, in auto-selection
// order. `backend` is nullptr when this build leaves it out; `reference`
// marks the float64 oracle, the slow fallback a compile never takes silently;
// `collective` a backend of synchronized partitions only, which runs across
// processes; `baseline` the vendor library that benchmarks and `normgrad
// tune` state ratios against.
struct BackendEntry {
  const char* name;
  const Backend* backend;
  bool reference = false;
  bool collective = false;
  bool baseline = false;
};
const std::vector<BackendEntry>& backend_registry();
// nullptr when no backend has that name.
const BackendEntry* find_backend_entry(const std::string& name);
// The registry's backends built into this library, in auto-selection order.
const std::vector<const Backend*>& available_backends();
// Names a user may force: "auto", then the registry's.
const std::vector<std::string>& known_backend_names();
// nullptr when `name` is not built into this library.
const Backend* find_backend(const std::string& name);

// The reference backend's float64 kernel for one verified, shape-inferred op,
// on strided buffers in port order: the oracle the tests and `normgrad run
// --check` measure the other backends against.
Status reference_execute(const Op& op, const std::vector<const void*>& inputs,
                         const std::vector<void*>& outputs);

// The cache model the kernels decide with, and the bench's traffic bounds
// use: sizes from sysfs (AMD and Intel alike), the defaults otherwise. A VM
// may report the host's whole L3 (480 MiB seen); no x86 core of today gets
// more than its complex's share, so an implausible per-CPU share of over
// 16 MiB is taken as 32 MiB.
struct CacheSizes {
  int64_t l2_bytes = 1 << 20;   // per core
  int64_t l3_bytes = 32 << 20;  // shared
};
const CacheSizes& cache_sizes();

// Caps the threads every backend uses: the JIT runs in its own oneTBB arena of
// n threads, oneDNN's OpenMP pool gets n threads, ref is single-threaded
// anyway. n = 0 lifts the cap (the default: every core the process may use).
// Affects executions that start after the call.
void set_num_threads(int n);
// The cap set by set_num_threads (0: none).
int num_threads();
// The same as set_num_threads (kept for callers of the first API).
void set_backend_threads(int n);

// Where the JIT runs its parallel loops. oneTBB (the default): its own
// arena. OpenMP: the process's libgomp pool, the one torch's CPU ops and
// oneDNN use; a kernel called right after a torch op then runs on the
// threads still spinning from it, where an oneTBB arena would compete with
// them for the cores (normgrad.torch chooses it when torch runs on OpenMP).
// The work items and their order within each are the same: the same bits.
// The initial choice is NORMGRAD_THREADING (tbb or openmp) when set.
enum class ThreadRuntime { kTbb, kOpenMP };
// Unimplemented for kOpenMP when the library was built without libgomp.
Status set_thread_runtime(ThreadRuntime runtime);
ThreadRuntime thread_runtime();
// Whether this build can run on OpenMP.
bool has_openmp_runtime();

}  // namespace normgrad
