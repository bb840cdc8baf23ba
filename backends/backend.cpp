// The list of built-in backends, assembled explicitly in one place.
#include <normgrad/backends/backend_registry.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <unistd.h>

namespace normgrad {

// The one list of backends: names, auto-selection order (fastest first; ref
// last, since it supports every valid partition) and roles. A backend this
// build leaves out keeps its entry, so its name is known but not available.
const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> entries = {
#ifdef NORMGRAD_WITH_JIT
      {"jit", jit_backend()},
#else
      {"jit", nullptr},
#endif
#ifdef NORMGRAD_WITH_DNNL
      {"dnnl", dnnl_backend(), false, false, true},
#else
      {"dnnl", nullptr, false, false, true},
#endif
#ifdef NORMGRAD_WITH_MPI
      {"mpi", mpi_backend(), false, true},
#else
      {"mpi", nullptr, false, true},
#endif
      {"ref", ref_backend(), true},
  };
  return entries;
}

const std::vector<const Backend*>& available_backends() {
  static const std::vector<const Backend*> backends = [] {
    std::vector<const Backend*> v;
    for (const BackendEntry& e : backend_registry()) {
      if (e.backend != nullptr) v.push_back(e.backend);
    }
    return v;
  }();
  return backends;
}

const std::vector<std::string>& known_backend_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"auto"};
    for (const BackendEntry& e : backend_registry()) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

const BackendEntry* find_backend_entry(const std::string& name) {
  for (const BackendEntry& e : backend_registry()) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

const Backend* find_backend(const std::string& name) {
  const BackendEntry* e = find_backend_entry(name);
  return e == nullptr ? nullptr : e->backend;
}

namespace {
thread_local const Allocator* t_allocator = nullptr;
}  // namespace

const Allocator* current_allocator() {
  return t_allocator;
}

AllocatorScope::AllocatorScope(const Allocator* a) : previous_(t_allocator) {
  if (a != nullptr) t_allocator = a;
}
AllocatorScope::~AllocatorScope() {
  t_allocator = previous_;
}

ScratchBuffer::ScratchBuffer(size_t bytes) : size_(bytes), owner_(t_allocator) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  data_ =
      static_cast<char*>(owner_ ? owner_->allocate(rounded, 64) : std::aligned_alloc(64, rounded));
}
ScratchBuffer::~ScratchBuffer() {
  release();
}
ScratchBuffer::ScratchBuffer(ScratchBuffer&& o) noexcept
    : data_(o.data_), size_(o.size_), owner_(o.owner_) {
  o.data_ = nullptr;
}
ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    owner_ = o.owner_;
    o.data_ = nullptr;
  }
  return *this;
}
void ScratchBuffer::release() {
  if (data_ == nullptr) return;
  if (owner_) {
    owner_->deallocate(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

PartitionBuffers::PartitionBuffers(const Partition& p, const std::vector<const void*>& in,
                                   const std::vector<void*>& out) {
  for (size_t i = 0; i < in.size() && i < p.inputs.size(); ++i)
    buffers_[p.inputs[i].id] = const_cast<void*>(in[i]);
  for (size_t i = 0; i < out.size() && i < p.outputs.size(); ++i)
    buffers_[p.outputs[i].id] = out[i];
}

StatusOr<const void*> PartitionBuffers::read(const LogicalTensor& lt) const {
  auto it = buffers_.find(lt.id);
  if (it == buffers_.end())
    return internal_error("tensor " + std::to_string(lt.id) + " is read before it is written");
  return static_cast<const void*>(it->second);
}

StatusOr<void*> PartitionBuffers::write(const LogicalTensor& lt) {
  if (auto it = buffers_.find(lt.id); it != buffers_.end()) return it->second;
  NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
  ScratchBuffer& buf = scratch_[lt.id] = ScratchBuffer(static_cast<size_t>(bytes));
  if (buf.data() == nullptr)
    return out_of_range("cannot allocate " + std::to_string(bytes) + " bytes for tensor " +
                        std::to_string(lt.id));
  return buffers_[lt.id] = buf.data();
}

namespace {
std::atomic<int>& thread_cap() {
  static std::atomic<int> cap{0};
  return cap;
}
}  // namespace

void set_num_threads(int n) {
  n = std::max(0, n);
  thread_cap().store(n);
#ifdef NORMGRAD_WITH_DNNL
  // OpenMP has no "unlimited": 0 gives it back every core.
  set_dnnl_threads(n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
#endif
}

int num_threads() {
  return thread_cap().load();
}

void set_backend_threads(int n) {
  set_num_threads(n);
}

bool has_openmp_runtime() {
#ifdef NORMGRAD_WITH_OPENMP
  return true;
#else
  return false;
#endif
}

namespace {
std::atomic<ThreadRuntime>& runtime_choice() {
  static std::atomic<ThreadRuntime> choice{[] {
    const char* v = std::getenv("NORMGRAD_THREADING");
    const bool omp = v != nullptr && std::string(v) == "openmp" && has_openmp_runtime();
    if (v != nullptr && std::string(v) != "openmp" && std::string(v) != "tbb")
      std::cerr << "normgrad: warning: NORMGRAD_THREADING=" << v
                << " is neither tbb nor openmp; using tbb\n";
    if (v != nullptr && std::string(v) == "openmp" && !has_openmp_runtime())
      std::cerr << "normgrad: warning: NORMGRAD_THREADING=openmp, but this build has no "
                   "OpenMP; using tbb\n";
    return omp ? ThreadRuntime::kOpenMP : ThreadRuntime::kTbb;
  }()};
  return choice;
}
}  // namespace

Status set_thread_runtime(ThreadRuntime runtime) {
  if (runtime == ThreadRuntime::kOpenMP && !has_openmp_runtime())
    return unimplemented("set_thread_runtime: this build of normgrad has no OpenMP (libgomp)");
  runtime_choice().store(runtime);
  return ok_status();
}

ThreadRuntime thread_runtime() {
  return runtime_choice().load();
}

namespace {

int64_t read_cache_size(int index) {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::string s;
  if (!(in >> s) || s.empty()) return 0;
  int64_t v = std::atoll(s.c_str());
  if (s.back() == 'K') v <<= 10;
  if (s.back() == 'M') v <<= 20;
  return v;
}

int read_cache_level(int index) {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/level");
  int level = 0;
  in >> level;
  return level;
}

}  // namespace

const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes c;
    for (int i = 0; i < 8; ++i) {
      const int level = read_cache_level(i);
      const int64_t size = read_cache_size(i);
      if (size <= 0) continue;
      if (level == 2) c.l2_bytes = size;
      if (level == 3) c.l3_bytes = size;
    }
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    if (c.l3_bytes / cpus > (int64_t{16} << 20)) c.l3_bytes = int64_t{32} << 20;
    return c;
  }();
  return sizes;
}

}  // namespace normgrad
