// CachingAllocator: a bounded, thread-safe pool of host blocks behind the
// Allocator hook, so that repeated executions reuse memory instead of
// faulting fresh pages in.
//
// glibc serves allocations above its mmap threshold (32 MiB at most) with a
// new mapping each time and unmaps them on free, so a training step that
// allocates its activations and gradients afresh pays a page fault per 4 KiB
// on every step (on a VM, more than the kernels take). Like a GPU caching
// allocator, this pool keeps freed blocks by size class and hands them out
// again; blocks beyond `max_cached_bytes` go back to the system. It serves
// CompiledGraph::execute's intermediates and scratch through allocator(),
// and the Python package's outputs (a tensor returns its block through its
// DLPack deleter).
//
// What it keeps must not add to the process's peak: by default
// (CachePolicy::kPeak) free blocks are kept only while the blocks in use
// and the cached ones together stay within the most the pool has ever had
// in use at once, plus a sixteenth of that (kPeakSlackDivisor), so at the
// moment its own use peaks it holds at most that sixteenth idle. A miss
// beyond that gives cached blocks back first, the largest first. Blocks of 2 MiB and
// more are their own mappings, aligned to 2 MiB and advised as transparent
// huge pages, and go back with munmap: what is given back really leaves
// the process (glibc's heap would keep it), and a fresh block faults in
// 2 MiB at a time (on a VM, 30 times faster than 4 KiB pages).
// A miss that must give cached mappings back takes their pages instead: it
// moves them into the new block (mremap: no copy, no page fault) and gives
// back only what is left over. A training step asks for other classes in
// its backward than in its forward (two 3.25 MiB blocks freed, a 6.5 MiB one
// wanted); given back and mapped afresh, those blocks faulted their pages in
// again every step.
// Every live pool is locked around fork(), so a child never inherits one
// held by another thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <normgrad/backends/backend.hpp>

namespace normgrad {

class CachingAllocator {
 public:
  struct Stats {
    int64_t allocated_bytes = 0;       // in blocks handed out now
    int64_t cached_bytes = 0;          // in free blocks kept for reuse
    int64_t peak_allocated_bytes = 0;  // the most ever handed out at once
    int64_t hits = 0;                  // allocations served from the cache
    int64_t misses = 0;                // allocations that went to the system
    int64_t released = 0;              // blocks given back to the system
    int64_t recycled = 0;              // misses built from cached blocks' pages
  };

  // Where blocks come from and go back to: huge-page mappings from
  // kHugeBlockBytes up, posix_memalign and free below; tests give one that
  // fails on purpose. release gets the bytes allocate was asked for.
  struct System {
    std::function<void*(size_t bytes, size_t alignment)> allocate;  // nullptr: no memory
    std::function<void(void*, size_t bytes)> release;
    // Optional: a mapping of `bytes` aligned to `alignment` whose head holds
    // the pages of `pieces` in order, moved there (not copied); each piece is
    // a range within one of this system's mappings, and what lies beyond
    // `bytes` goes back to the system. The pieces are gone afterwards,
    // whatever it returns; nullptr: no memory. Without it a miss gives
    // cached blocks back and allocates afresh.
    std::function<void*(const std::vector<std::pair<void*, size_t>>& pieces, size_t bytes,
                        size_t alignment)>
        remap;
  };
  static constexpr size_t kHugeBlockBytes = size_t{2} << 20;
  // Larger requests (and alignments above kHugeBlockBytes) get nullptr.
  static constexpr size_t kMaxBlockBytes = size_t{1} << 48;

  // kPeak: cached blocks only within the pool's peak use and a sixteenth
  // (the default).
  // kLimit: every freed block up to max_cached_bytes (trades memory for
  // fewer fresh blocks; for comparison).
  enum class CachePolicy { kPeak, kLimit };
  static constexpr int64_t kPeakSlackDivisor = 16;
  static System default_system();

  // Free blocks beyond `max_cached_bytes` go back to the system.
  explicit CachingAllocator(int64_t max_cached_bytes = int64_t{4} << 30,
                            System system = default_system());
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` (a size class: 4 KiB steps below 1 MiB, then eighths of
  // a power of two), aligned to max(alignment, 64). When the system has no
  // memory for it, the cached blocks go back first and the request is tried
  // once more; nullptr when that fails too. Zero bytes gives a valid block of
  // the smallest class.
  void* allocate(size_t bytes, size_t alignment = 64);
  // A block from allocate(); nullptr is ignored. A pointer this pool did not
  // hand out is reported on stderr and left alone (never freed twice).
  void deallocate(void* p);
  // deallocate() for a pointer that may not be this pool's: false (and
  // nothing done, nothing reported) when it is not.
  bool try_deallocate(void* p);
  // Gives every cached block back to the system.
  void empty_cache();
  Stats stats() const;
  void set_max_cached_bytes(int64_t bytes);
  // Starts the peak over from what is in use now (kPeak then keeps within
  // the new one).
  void reset_peak();
  void set_policy(CachePolicy policy);
  CachePolicy policy() const;

  // The hook view of this pool, for CompiledGraph::execute.
  const Allocator& allocator() const { return hook_; }

  // The size class of a request (exposed for tests).
  static size_t size_class(size_t bytes);

 private:
  void trim_locked();
  // Under kPeak, gives back cached blocks until a new block of `cls` bytes
  // keeps the pool within its peak use.
  void make_room_locked(size_t cls);
  // What the cache must give up, under kPeak, for a new block of `cls`.
  int64_t room_needed_locked(size_t cls) const;
  // When a miss of `cls` must give cached blocks back: takes the largest
  // mappings, up to `cls` bytes of them, out of the cache as ranges for System::remap
  // (a block's tail past them stays cached when it is a mapping's worth,
  // else rides along to be given back). Returns the new block's ranges.
  std::vector<size_t> take_pieces_locked(size_t cls, std::vector<std::pair<void*, size_t>>* pieces);
  void release_largest_locked();
  void release_locked(void* p, size_t cls);

  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;       // size class -> cached block
  std::unordered_map<void*, size_t> live_;  // handed-out block -> size class
  // A block built from moved ranges: their sizes in address order. Each lies
  // within one kernel mapping, as mremap needs, so a block made of several
  // is moved range by range. Blocks without an entry are one range.
  std::unordered_map<void*, std::vector<size_t>> ranges_;
  Stats stats_;
  int64_t max_cached_;
  CachePolicy policy_ = CachePolicy::kPeak;
  System system_;
  Allocator hook_;
};

// The process-wide pool the Python package uses.
CachingAllocator& default_caching_allocator();

// glibc's heap as a pool that every allocator in the process shares.
//
// glibc maps blocks above its mmap threshold afresh and unmaps them on
// free, and gives the top of its heap back to the system past its trim
// threshold; both thresholds move with the blocks freed, so a training
// step's activations and gradients (up to tens of MiB each) fault their
// pages in again step after step. With retention on, blocks up to
// kHeapBlockMaxBytes (the largest mmap threshold glibc allows) come from the
// heap and freed memory stays there for the next allocation, torch's or
// normgrad's: the page faults go, and nothing is held that the process's
// other allocations cannot reuse (unlike a pool of normgrad's own). Off puts
// glibc's documented defaults back (not its moving thresholds: no call
// restores those). Returns false where the C library is not glibc (nothing
// changed).
constexpr int64_t kHeapBlockMaxBytes = int64_t{32} << 20;
bool set_heap_retention(bool on);
// Whether set_heap_retention(true) is in force.
bool heap_retention();

}  // namespace normgrad
