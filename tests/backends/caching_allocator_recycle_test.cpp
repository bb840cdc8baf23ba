// CachingAllocator's recycled misses: a miss that must give cached mappings
// back builds its block from their pages instead. The pages keep what was
// written to them (so they moved, and were not mapped afresh), a block made
// of several moved ranges moves again whole, a tail past the new block
// stays cached, nothing is given back that the new block could use, the
// peak bound holds, and blocks never overlap however they are cut and moved.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <gtest/gtest.h>

#include <normgrad/backends/caching_allocator.hpp>
#include "tests/backends/process_maps.hpp"

namespace normgrad {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMiB = size_t{1} << 20;

// Writes `tag` into the first word of every page of [p, p + bytes).
void tag_pages(void* p, size_t bytes, uint64_t tag) {
  for (size_t off = 0; off < bytes; off += kPage)
    std::memcpy(static_cast<char*>(p) + off, &tag, sizeof(tag));
}

uint64_t tag_at(const void* p, size_t off) {
  uint64_t t = 0;
  std::memcpy(&t, static_cast<const char*>(p) + off, sizeof(t));
  return t;
}

// Whether every page of [p + from, p + to) holds `tag`.
bool pages_hold(const void* p, size_t from, size_t to, uint64_t tag) {
  for (size_t off = from; off < to; off += kPage)
    if (tag_at(p, off) != tag) return false;
  return true;
}

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return true;
#endif
#endif
  return false;
}

// Whether [p, p + bytes) lies within one kernel mapping: what mremap needs
// of a range before Linux 6.17.
bool within_one_mapping(const void* p, size_t bytes) {
  const auto [lo, hi] = testing_util::mapping_of(p);
  return hi != 0 && reinterpret_cast<uintptr_t>(p) + bytes <= hi;
}

// The backward of a training step: two 3.25 MiB blocks freed, a 6.5 MiB one
// wanted beyond the peak's slack. The new block is their pages, moved: it
// reads what was written to them, and touching it faults nothing in. Every
// range handed to the move lies within one kernel mapping (newer kernels
// move ranges across several, older ones refuse).
TEST(CachingAllocator, MissesMoveThePagesTheyWouldGiveBack) {
  CachingAllocator::System checked = CachingAllocator::default_system();
  int split_ranges = 0;
  checked.remap = [&split_ranges, remap = checked.remap](
                      const std::vector<std::pair<void*, size_t>>& pieces, size_t bytes,
                      size_t alignment) {
    for (const auto& [p, n] : pieces) split_ranges += within_one_mapping(p, n) ? 0 : 1;
    return remap(pieces, bytes, alignment);
  };
  CachingAllocator pool(int64_t{4} << 30, checked);
  const size_t quarter = CachingAllocator::size_class(3 * kMiB + kMiB / 4);
  ASSERT_EQ(quarter, 3 * kMiB + kMiB / 4);
  void* a = pool.allocate(quarter);
  void* b = pool.allocate(quarter);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  tag_pages(a, quarter, 0xA);
  tag_pages(b, quarter, 0xB);
  pool.deallocate(a);
  pool.deallocate(b);
  const size_t half = 2 * quarter;  // 6.5 MiB, a class of its own
  ASSERT_EQ(CachingAllocator::size_class(half), half);
  const int64_t before = minor_faults();
  auto* c = static_cast<char*>(pool.allocate(half));
  ASSERT_NE(c, nullptr);
  const uint64_t first = tag_at(c, 0);
  const uint64_t second = tag_at(c, quarter);
  const int64_t faults = minor_faults() - before;
  EXPECT_EQ((std::set<uint64_t>{first, second}), (std::set<uint64_t>{0xA, 0xB}))
      << "the new block does not hold the freed blocks' pages";
  EXPECT_TRUE(pages_hold(c, 0, quarter, first));
  EXPECT_TRUE(pages_hold(c, quarter, half, second));
  auto s = pool.stats();
  EXPECT_EQ(s.recycled, 1);
  EXPECT_EQ(s.released, 0);  // nothing given back: the new block took it all
  EXPECT_EQ(s.cached_bytes, 0);
  if (!sanitized()) {
    // A fresh block of the same size, in a pool of its own, for scale.
    CachingAllocator other;
    void* fresh = other.allocate(half);
    ASSERT_NE(fresh, nullptr);
    const int64_t f0 = minor_faults();
    tag_pages(fresh, half, 1);
    const int64_t fresh_faults = minor_faults() - f0;
    const int64_t m0 = minor_faults();
    tag_pages(c, half, 2);
    const int64_t moved_faults = (minor_faults() - m0) + faults;
    EXPECT_LT(moved_faults * 4, fresh_faults)
        << "moved pages faulted in " << moved_faults << " times, a fresh block " << fresh_faults;
    other.deallocate(fresh);
  }

  // A block of two moved ranges moves again (each range its own mapping):
  // a 13 MiB miss takes it as its head, and the rest is fresh (zero).
  tag_pages(c, quarter, 0xC);
  tag_pages(c + quarter, quarter, 0xD);
  pool.deallocate(c);
  const size_t whole = CachingAllocator::size_class(13 * kMiB);
  ASSERT_EQ(whole, 13 * kMiB);
  auto* e = static_cast<char*>(pool.allocate(whole));
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(pages_hold(e, 0, quarter, 0xC));
  EXPECT_TRUE(pages_hold(e, quarter, half, 0xD));
  EXPECT_TRUE(pages_hold(e, half, whole, 0));
  s = pool.stats();
  EXPECT_EQ(s.recycled, 2);
  EXPECT_EQ(s.released, 0);

  // A 6.5 MiB miss with 13 MiB cached, beyond what the bound keeps: it takes
  // the block's head; the tail stays cached and serves the next 6.5 MiB
  // request as a hit, pages and all.
  tag_pages(e, whole, 0xE);
  pool.deallocate(e);
  char* f = static_cast<char*>(pool.allocate(half));
  ASSERT_NE(f, nullptr);
  s = pool.stats();
  EXPECT_EQ(s.recycled, 3);
  EXPECT_EQ(s.cached_bytes, static_cast<int64_t>(whole - half));
  EXPECT_LE(s.allocated_bytes + s.cached_bytes,
            s.peak_allocated_bytes + s.peak_allocated_bytes / CachingAllocator::kPeakSlackDivisor);
  const int64_t hits = s.hits;
  char* g = static_cast<char*>(pool.allocate(half));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(pool.stats().hits, hits + 1);
  EXPECT_TRUE(pages_hold(f, 0, half, 0xE));
  EXPECT_TRUE(pages_hold(g, 0, half, 0xE));
  EXPECT_TRUE(f + half <= g || g + half <= f) << "overlapping blocks";
  EXPECT_EQ(pool.stats().released, 0);
  pool.deallocate(f);
  pool.deallocate(g);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  EXPECT_EQ(split_ranges, 0) << "ranges handed to mremap spanned several mappings";
}

// A system without remap (a test's, or one that maps nothing) keeps the
// old way: give cached blocks back, then allocate afresh.
TEST(CachingAllocator, WithoutRemapMissesAllocateAfresh) {
  CachingAllocator::System plain = CachingAllocator::default_system();
  plain.remap = nullptr;
  CachingAllocator pool(int64_t{4} << 30, plain);
  const size_t quarter = 3 * kMiB + kMiB / 4;
  void* a = pool.allocate(quarter);
  void* b = pool.allocate(quarter);
  tag_pages(a, quarter, 0xA);
  tag_pages(b, quarter, 0xB);
  pool.deallocate(a);
  pool.deallocate(b);
  auto* c = static_cast<char*>(pool.allocate(2 * quarter));
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(pages_hold(c, 0, 2 * quarter, 0));  // fresh pages
  EXPECT_EQ(pool.stats().recycled, 0);
  EXPECT_EQ(pool.stats().released, 2);
  pool.deallocate(c);
}

// Random steps of mapping-sized blocks from several threads under the
// default policy (TSan runs this too): every page of a live block keeps its
// owner's tag until it is freed, however blocks were cut and moved, and the
// pool stays within its peak bound.
TEST(CachingAllocator, ThreadsShareRecycledPages) {
  CachingAllocator pool;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&pool, t] {
      uint32_t rng = 777u + static_cast<uint32_t>(t);
      std::map<char*, std::pair<size_t, uint64_t>> live;
      uint64_t next_tag = (uint64_t{1} + static_cast<uint64_t>(t)) << 40;
      for (int i = 0; i < 300; ++i) {
        rng = rng * 1664525u + 1013904223u;
        if (live.size() < 2 || (rng >> 8) % 3 != 0) {
          // 2 to 12 MiB in quarter-MiB steps: many classes, cut and joined.
          const size_t bytes = 2 * kMiB + ((rng >> 12) % 41) * (kMiB / 4);
          auto* p = static_cast<char*>(pool.allocate(bytes));
          ASSERT_NE(p, nullptr);
          tag_pages(p, bytes, ++next_tag);
          live[p] = {bytes, next_tag};
        } else {
          auto it = live.begin();
          std::advance(it, (rng >> 4) % live.size());
          ASSERT_TRUE(pages_hold(it->first, 0, it->second.first, it->second.second))
              << "a live block lost its pages";
          pool.deallocate(it->first);
          live.erase(it);
        }
        if (live.size() > 6) {  // a step ends
          for (auto& [p, info] : live) {
            ASSERT_TRUE(pages_hold(p, 0, info.first, info.second)) << "a live block lost its pages";
            pool.deallocate(p);
          }
          live.clear();
        }
      }
      for (auto& [p, info] : live) pool.deallocate(p);
    });
  }
  for (std::thread& th : threads) th.join();
  const auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_GT(s.recycled, 0);
  EXPECT_LE(s.cached_bytes,
            s.peak_allocated_bytes + s.peak_allocated_bytes / CachingAllocator::kPeakSlackDivisor);
}

}  // namespace
}  // namespace normgrad
