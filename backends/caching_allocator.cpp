// CachingAllocator: size classes, the free lists, and the bound on what is kept.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

#include <normgrad/backends/caching_allocator.hpp>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace normgrad {

namespace {
// Blocks are aligned to this much (cache lines, AVX-512 vectors); larger
// requested alignments are honoured by the class rounding below them.
constexpr size_t kMinAlignment = 64;
constexpr size_t kPage = 4096;
constexpr size_t kLargeBlock = size_t{1} << 20;
}  // namespace

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes <= kLargeBlock) return (bytes + kPage - 1) / kPage * kPage + (bytes == 0 ? kPage : 0);
  // Eighths of the power of two at or below `bytes`: at most 12.5% unused.
  size_t top = kLargeBlock;
  while (top <= bytes / 2) top *= 2;
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::System CachingAllocator::default_system() {
  System s;
  s.allocate = [](size_t bytes, size_t alignment) -> void* {
    void* p = nullptr;
    return posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
  };
  s.release = [](void* p) { std::free(p); };
  return s;
}

CachingAllocator::CachingAllocator(int64_t max_cached_bytes, System system)
    : max_cached_(max_cached_bytes), system_(std::move(system)) {
  hook_.allocate = [this](size_t bytes, size_t alignment) { return allocate(bytes, alignment); };
  hook_.deallocate = [this](void* p) { deallocate(p); };
}

CachingAllocator::~CachingAllocator() {
  empty_cache();
  // Blocks still handed out belong to their holders' deleters, which may run
  // after this pool is gone only at process exit: leave them.
}

void* CachingAllocator::allocate(size_t bytes, size_t alignment) {
  const size_t cls = size_class(bytes);
  const size_t align = alignment > kMinAlignment ? alignment : kMinAlignment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // An exact class match: classes are coarse enough that steady training
    // steps ask for the same classes again.
    for (auto it = free_.find(cls); it != free_.end() && it->first == cls; ++it) {
      if (reinterpret_cast<uintptr_t>(it->second) % align != 0) continue;
      void* p = it->second;
      free_.erase(it);
      live_[p] = cls;
      stats_.cached_bytes -= static_cast<int64_t>(cls);
      stats_.allocated_bytes += static_cast<int64_t>(cls);
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      ++stats_.hits;
      return p;
    }
  }
  void* p = system_.allocate(cls, align);
  if (p == nullptr) {
    // Out of memory with blocks sitting in the cache: give them back and try
    // once more before failing (an 800 MiB request once failed under a
    // 1.4 GiB address-space limit with 704 MiB cached).
    if (stats().cached_bytes == 0) return nullptr;
    empty_cache();
    p = system_.allocate(cls, align);
    if (p == nullptr) return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_[p] = cls;
  stats_.allocated_bytes += static_cast<int64_t>(cls);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.misses;
  return p;
}

void CachingAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    std::fprintf(stderr, "normgrad: CachingAllocator::deallocate of a block it did not hand out\n");
    return;
  }
  const size_t cls = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(cls);
  free_.emplace(cls, p);
  stats_.cached_bytes += static_cast<int64_t>(cls);
  trim_locked();
}

void CachingAllocator::trim_locked() {
  // Over the bound: the largest cached blocks go first.
  while (stats_.cached_bytes > max_cached_ && !free_.empty()) {
    auto last = std::prev(free_.end());
    stats_.cached_bytes -= static_cast<int64_t>(last->first);
    system_.release(last->second);
    free_.erase(last);
    ++stats_.released;
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [cls, p] : free_) {
    system_.release(p);
    ++stats_.released;
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::set_max_cached_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  max_cached_ = bytes;
  trim_locked();
}

namespace {
bool g_heap_retention = false;
}  // namespace

bool set_heap_retention(bool on) {
#ifdef __GLIBC__
  // glibc's defaults (mallopt(3)): 128 KiB for both thresholds.
  constexpr int kDefaultThreshold = 128 * 1024;
  const int mmap_threshold = on ? static_cast<int>(kHeapBlockMaxBytes) : kDefaultThreshold;
  // Never trim the heap's top while on: INT_MAX is as large as mallopt takes.
  const int trim_threshold = on ? INT_MAX : kDefaultThreshold;
  if (mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1 ||
      mallopt(M_TRIM_THRESHOLD, trim_threshold) != 1)
    return false;
  g_heap_retention = on;
  return true;
#else
  (void)on;
  return false;
#endif
}

bool heap_retention() {
  return g_heap_retention;
}

CachingAllocator& default_caching_allocator() {
  // Never destroyed: tensors handed to Python may return their blocks during
  // interpreter shutdown, after static destructors would have run.
  static CachingAllocator* pool = new CachingAllocator();
  return *pool;
}

}  // namespace normgrad
