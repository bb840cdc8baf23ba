// CachingAllocator: size classes, the free lists, and the bound on what is kept.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include <normgrad/backends/caching_allocator.hpp>

#include <pthread.h>
#include <sys/mman.h>

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

namespace {
// A mapping of exactly `bytes` at an address aligned to `alignment` (a
// power of two of at least 2 MiB): map that much more, then unmap the
// unaligned head and the tail. Advised as transparent huge pages; where the
// kernel has none (or THP is off) it is an ordinary mapping.
void* map_aligned(size_t bytes, size_t alignment) {
  const size_t len = bytes + alignment;
  void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + alignment - 1) & ~(uintptr_t{alignment} - 1);
  const size_t head = aligned - begin;
  const size_t tail = len - head - bytes;
  if (head != 0) munmap(raw, head);
  if (tail != 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
  return p;
}

// System::remap for mappings: a fresh aligned mapping of `bytes`, then each
// piece's pages moved over its head in order (mremap replaces what the
// fresh mapping had there, pages it never faulted in). A piece that cannot
// move (the kernel's mapping limit) is given back, and its range of the new
// block faults in as a fresh one would.
void* remap_pieces(const std::vector<std::pair<void*, size_t>>& pieces, size_t bytes,
                   size_t alignment) {
  void* base = map_aligned(bytes, alignment);
  size_t off = 0;
  for (const auto& [p, n] : pieces) {
    const size_t take = base == nullptr || off >= bytes ? 0 : std::min(n, bytes - off);
    if (take > 0 && mremap(p, take, take, MREMAP_MAYMOVE | MREMAP_FIXED,
                           static_cast<char*>(base) + off) == MAP_FAILED)
      munmap(p, take);
    if (take < n) munmap(static_cast<char*>(p) + take, n - take);
    off += take;
  }
  return base;
}

// fork() copies a pool's mutex as it is; if another thread held it then
// (freeing a tensor while a DataLoader forks its workers), the child's pool
// would stay locked for good. So every live pool is listed, and fork locks
// them all first and unlocks them in both processes after.
struct ForkGuard {
  std::mutex mu;
  std::vector<std::mutex*> pools;
};

ForkGuard& fork_guard() {
  static ForkGuard* guard = new ForkGuard();  // never destroyed: pools may outlive statics
  return *guard;
}

void lock_pools_before_fork() {
  ForkGuard& g = fork_guard();
  g.mu.lock();
  for (std::mutex* m : g.pools) m->lock();
}

void unlock_pools_after_fork() {
  ForkGuard& g = fork_guard();
  for (auto it = g.pools.rbegin(); it != g.pools.rend(); ++it) (*it)->unlock();
  g.mu.unlock();
}

void list_pool(std::mutex* m) {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(lock_pools_before_fork, unlock_pools_after_fork, unlock_pools_after_fork);
  });
  std::lock_guard<std::mutex> lock(fork_guard().mu);
  fork_guard().pools.push_back(m);
}

void unlist_pool(std::mutex* m) {
  std::lock_guard<std::mutex> lock(fork_guard().mu);
  auto& pools = fork_guard().pools;
  pools.erase(std::remove(pools.begin(), pools.end(), m), pools.end());
}
}  // namespace

CachingAllocator::System CachingAllocator::default_system() {
  System s;
  s.allocate = [](size_t bytes, size_t alignment) -> void* {
    if (bytes >= kHugeBlockBytes) return map_aligned(bytes, std::max(alignment, kHugeBlockBytes));
    void* p = nullptr;
    return posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
  };
  s.release = [](void* p, size_t bytes) {
    if (bytes >= kHugeBlockBytes) {
      munmap(p, bytes);
    } else {
      std::free(p);
    }
  };
  s.remap = [](const std::vector<std::pair<void*, size_t>>& pieces, size_t bytes,
               size_t alignment) {
    return remap_pieces(pieces, bytes, std::max(alignment, kHugeBlockBytes));
  };
  return s;
}

CachingAllocator::CachingAllocator(int64_t max_cached_bytes, System system)
    : max_cached_(max_cached_bytes), system_(std::move(system)) {
  hook_.allocate = [this](size_t bytes, size_t alignment) { return allocate(bytes, alignment); };
  hook_.deallocate = [this](void* p) { deallocate(p); };
  list_pool(&mu_);
}

CachingAllocator::~CachingAllocator() {
  unlist_pool(&mu_);
  empty_cache();
  // Blocks still handed out belong to their holders' deleters, which may run
  // after this pool is gone only at process exit: leave them.
}

void* CachingAllocator::allocate(size_t bytes, size_t alignment) {
  // No system has this much; the class rounding and the aligned mapping's
  // slack would overflow near SIZE_MAX.
  if (bytes > kMaxBlockBytes || alignment > kHugeBlockBytes) return nullptr;
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
  std::vector<std::pair<void*, size_t>> pieces;
  std::vector<size_t> ranges;
  {
    // Make room and count the block as in use under one lock: two threads
    // that each made room for their own miss, before either counted its
    // block, kept the cache sized for one miss and overshot the peak bound.
    std::lock_guard<std::mutex> lock(mu_);
    if (system_.remap && cls >= kHugeBlockBytes) ranges = take_pieces_locked(cls, &pieces);
    make_room_locked(cls);
    stats_.allocated_bytes += static_cast<int64_t>(cls);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }
  void* p = pieces.empty() ? system_.allocate(cls, align) : system_.remap(pieces, cls, align);
  if (p == nullptr && stats().cached_bytes > 0) {
    // Out of memory with blocks sitting in the cache: give them back and try
    // once more before failing (an 800 MiB request once failed under a
    // 1.4 GiB address-space limit with 704 MiB cached).
    empty_cache();
    p = system_.allocate(cls, align);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) {
    // The reservation goes; the peak keeps it (it was asked for).
    stats_.allocated_bytes -= static_cast<int64_t>(cls);
    return nullptr;
  }
  live_[p] = cls;
  ++stats_.misses;
  if (!pieces.empty()) {
    ++stats_.recycled;
    if (ranges.size() > 1) ranges_[p] = std::move(ranges);
  }
  return p;
}

void CachingAllocator::deallocate(void* p) {
  if (p != nullptr && !try_deallocate(p))
    std::fprintf(stderr, "normgrad: CachingAllocator::deallocate of a block it did not hand out\n");
}

bool CachingAllocator::try_deallocate(void* p) {
  if (p == nullptr) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return false;
  const size_t cls = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(cls);
  free_.emplace(cls, p);
  stats_.cached_bytes += static_cast<int64_t>(cls);
  trim_locked();
  return true;
}

void CachingAllocator::release_locked(void* p, size_t cls) {
  system_.release(p, cls);
  ranges_.erase(p);
  ++stats_.released;
}

void CachingAllocator::release_largest_locked() {
  auto last = std::prev(free_.end());
  stats_.cached_bytes -= static_cast<int64_t>(last->first);
  release_locked(last->second, last->first);
  free_.erase(last);
}

void CachingAllocator::trim_locked() {
  // Over the bound: the largest cached blocks go first.
  while (stats_.cached_bytes > max_cached_ && !free_.empty()) release_largest_locked();
}

int64_t CachingAllocator::room_needed_locked(size_t cls) const {
  if (policy_ != CachePolicy::kPeak) return 0;
  // After this miss the pool uses allocated + cls; what it may keep idle is
  // what that leaves of its peak use (the new one, if this raises it), and a
  // sixteenth of the peak more: without it a ResNet-50 step (torch's
  // tensors from the pool too) missed 90-136 times per step, with it 44-45,
  // at the same peak RSS within the noise (518-520 MiB, 884-898 MiB).
  const int64_t in_use = stats_.allocated_bytes + static_cast<int64_t>(cls);
  const int64_t peak = std::max(stats_.peak_allocated_bytes, in_use);
  const int64_t keep = peak - in_use + peak / kPeakSlackDivisor;
  return stats_.cached_bytes - keep;
}

void CachingAllocator::make_room_locked(size_t cls) {
  while (room_needed_locked(cls) > 0 && !free_.empty()) release_largest_locked();
}

std::vector<size_t> CachingAllocator::take_pieces_locked(
    size_t cls, std::vector<std::pair<void*, size_t>>* pieces) {
  // Only when the bound makes the cache give something back (otherwise a
  // cached block of another class may be asked for again later in the
  // step). Then the largest blocks, up to the new block's size: what the
  // bound still needs gone after that, make_room_locked gives back.
  std::vector<size_t> ranges;
  if (room_needed_locked(cls) <= 0) return ranges;
  // A block built of more ranges than this is given back, not moved: each
  // range is a kernel mapping of its own (the process has a limit).
  constexpr size_t kMaxRanges = 16;
  size_t got = 0;
  while (got < cls && !free_.empty()) {
    const auto last = std::prev(free_.end());  // the largest cached block
    const size_t size = last->first;
    if (size < kHugeBlockBytes) break;  // heap blocks are not mappings
    void* const block = last->second;
    std::vector<size_t> own{size};
    if (auto it = ranges_.find(block); it != ranges_.end()) own = it->second;
    if (ranges.size() + own.size() > kMaxRanges) break;
    ranges_.erase(block);
    free_.erase(last);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    // The block's head moves into the new one, range by range; a range
    // across the cut is split there.
    const size_t use = std::min(size, cls - got);
    std::vector<size_t> tail_ranges;
    size_t off = 0;
    for (const size_t n : own) {
      const size_t head = off >= use ? 0 : std::min(n, use - off);
      if (head > 0) {
        pieces->emplace_back(static_cast<char*>(block) + off, head);
        ranges.push_back(head);
      }
      if (head < n) tail_ranges.push_back(n - head);
      off += n;
    }
    got += use;
    if (use == size) continue;
    // The tail (the last block taken): cached while a mapping's worth, else
    // given back past the new block's end by the move.
    void* const tail = static_cast<char*>(block) + use;
    const size_t tail_size = size - use;
    if (tail_size >= kHugeBlockBytes) {
      free_.emplace(tail_size, tail);
      stats_.cached_bytes += static_cast<int64_t>(tail_size);
      if (tail_ranges.size() > 1) ranges_[tail] = std::move(tail_ranges);
    } else {
      size_t t = 0;
      for (const size_t n : tail_ranges) {
        pieces->emplace_back(static_cast<char*>(tail) + t, n);
        t += n;
      }
    }
  }
  if (got < cls && !ranges.empty()) ranges.push_back(cls - got);  // the fresh rest
  return ranges;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [cls, p] : free_) release_locked(p, cls);
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

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void CachingAllocator::set_policy(CachePolicy policy) {
  std::lock_guard<std::mutex> lock(mu_);
  policy_ = policy;
}

CachingAllocator::CachePolicy CachingAllocator::policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_;
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
