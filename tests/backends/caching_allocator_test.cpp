// CachingAllocator: size classes, reuse of freed blocks, the bound on what it
// keeps, alignment, threads, and serving CompiledGraph::execute as its
// Allocator hook (steady executions allocate nothing new).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <normgrad/backends/caching_allocator.hpp>
#include <normgrad/compile/compiler.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/process_maps.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;

TEST(CachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::size_class(0), 4096u);
  EXPECT_EQ(CachingAllocator::size_class(1), 4096u);
  EXPECT_EQ(CachingAllocator::size_class(4097), 8192u);
  EXPECT_EQ(CachingAllocator::size_class(size_t{1} << 20), size_t{1} << 20);
  // Above 1 MiB: eighths of the power of two below, at most 12.5% unused.
  EXPECT_EQ(CachingAllocator::size_class((size_t{1} << 20) + 1), (size_t{1} << 20) + (1 << 17));
  for (size_t b : {size_t{3} << 20, size_t{100} << 20, (size_t{1} << 30) + 12345}) {
    const size_t c = CachingAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(static_cast<double>(c), 1.125 * static_cast<double>(b) + 4096) << b;
  }
}

TEST(CachingAllocator, ReusesFreedBlocksAndCountsThem) {
  CachingAllocator pool;
  void* a = pool.allocate(5 << 20, 64);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  pool.deallocate(a);
  void* b = pool.allocate(5 << 20, 64);
  EXPECT_EQ(a, b);  // the same block again: no new pages to fault in
  const auto s = pool.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.allocated_bytes, static_cast<int64_t>(CachingAllocator::size_class(5 << 20)));
  EXPECT_EQ(s.cached_bytes, 0);
  pool.deallocate(b);
  EXPECT_GT(pool.stats().cached_bytes, 0);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  EXPECT_EQ(pool.stats().released, 1);
  pool.deallocate(nullptr);  // ignored
  int foreign = 0;
  EXPECT_FALSE(pool.try_deallocate(&foreign));  // not its block: refused, left alone
  EXPECT_EQ(pool.stats().cached_bytes, 0);
}

TEST(CachingAllocator, KeepsNoMoreThanItsBound) {
  CachingAllocator pool(8 << 20);
  pool.set_policy(CachingAllocator::CachePolicy::kLimit);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate(3 << 20, 64));
  for (void* p : blocks) pool.deallocate(p);
  const auto s = pool.stats();
  EXPECT_LE(s.cached_bytes, 8 << 20);
  EXPECT_EQ(s.released, 2);  // two of the four 3.25 MiB blocks went back
  pool.set_max_cached_bytes(0);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
}

// Under the default policy the pool never holds more than the most it has
// had in use at once and a sixteenth; under kLimit the same sequence keeps
// more (what the default takes away).
TEST(CachingAllocator, HoldsNoMoreThanItsPeakUse) {
  for (auto policy :
       {CachingAllocator::CachePolicy::kPeak, CachingAllocator::CachePolicy::kLimit}) {
    CachingAllocator pool;
    pool.set_policy(policy);
    std::vector<void*> live;
    uint32_t rng = 12345;
    int64_t worst_excess = 0;  // most the pool held beyond its peak use
    for (int i = 0; i < 2000; ++i) {
      rng = rng * 1664525u + 1013904223u;
      if (live.size() < 3 || (rng >> 8) % 3 != 0) {
        // Sizes from 64 KiB to 12 MiB, some above the huge-block size.
        const size_t bytes = size_t{64} << 10 << ((rng >> 12) % 8);
        void* p = pool.allocate(bytes + (rng >> 20) % 5000);
        ASSERT_NE(p, nullptr);
        live.push_back(p);
      } else {
        const size_t k = (rng >> 4) % live.size();
        pool.deallocate(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
      if (live.size() > 40) {  // a step ends: most blocks come back
        for (size_t k = 5; k < live.size(); ++k) pool.deallocate(live[k]);
        live.resize(5);
      }
      const auto s = pool.stats();
      worst_excess =
          std::max(worst_excess, s.allocated_bytes + s.cached_bytes - s.peak_allocated_bytes -
                                     s.peak_allocated_bytes / CachingAllocator::kPeakSlackDivisor);
    }
    for (void* p : live) pool.deallocate(p);
    const auto s = pool.stats();
    if (policy == CachingAllocator::CachePolicy::kPeak) {
      EXPECT_LE(worst_excess, 0);
      EXPECT_GT(s.hits, s.misses);  // it still reuses most blocks
    } else {
      EXPECT_GT(worst_excess, 0);
    }
  }
}

// Blocks of 2 MiB and more are their own 2 MiB-aligned mappings, and giving
// one back unmaps it (glibc's heap would keep the pages).
TEST(CachingAllocator, HugeBlocksAreMappingsThatLeaveTheProcess) {
  const auto mapped = [](void* p) { return testing_util::mapping_of(p).second != 0; };
  CachingAllocator pool;
  const size_t bytes = (size_t{5} << 20) + 100;
  auto* p = static_cast<unsigned char*>(pool.allocate(bytes, 4096));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % CachingAllocator::kHugeBlockBytes, 0u);
  p[0] = p[bytes - 1] = 7;  // the whole span is ours
  ASSERT_TRUE(mapped(p));
  pool.deallocate(p);
  ASSERT_TRUE(mapped(p));  // cached
  pool.empty_cache();
  EXPECT_FALSE(mapped(p));
}

// A fork while another thread holds the pool (here: inside a slow release
// under the pool's lock) must not leave the child's pool locked: fork waits
// for the pool, and the child then allocates. Without the fork handlers the
// child blocks for good and is killed after 10 s.
TEST(CachingAllocator, ForkWhileAnotherThreadHoldsThePool) {
  std::atomic<bool> releasing{false};
  CachingAllocator::System slow = CachingAllocator::default_system();
  const auto release = slow.release;
  slow.release = [&releasing, release](void* p, size_t bytes) {
    releasing = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    release(p, bytes);
  };
  CachingAllocator pool(0, slow);  // caches nothing: every free releases under the lock
  pool.set_policy(CachingAllocator::CachePolicy::kLimit);
  void* a = pool.allocate(size_t{64} << 10);
  ASSERT_NE(a, nullptr);
  std::thread holder([&pool, a] { pool.deallocate(a); });
  while (!releasing) std::this_thread::yield();
  const pid_t pid = fork();
  if (pid == 0) _exit(pool.allocate(size_t{64} << 10) != nullptr ? 0 : 1);
  holder.join();
  ASSERT_GT(pid, 0);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 1000 && !exited; ++i) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the child's pool stayed locked after fork";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(CachingAllocator, HonoursLargerAlignments) {
  CachingAllocator pool;
  void* p = pool.allocate(10000, 4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  pool.deallocate(p);
  void* q = pool.allocate(size_t{3} << 20, CachingAllocator::kHugeBlockBytes);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % CachingAllocator::kHugeBlockBytes, 0u);
  pool.deallocate(q);
}

// Sizes and alignments no system has give nullptr, never a wrapped-around
// small block (the class rounding and the mapping's slack would overflow).
TEST(CachingAllocator, RefusesImpossibleSizes) {
  CachingAllocator pool;
  EXPECT_EQ(pool.allocate(SIZE_MAX), nullptr);
  EXPECT_EQ(pool.allocate(SIZE_MAX - 4096), nullptr);
  EXPECT_EQ(pool.allocate(CachingAllocator::kMaxBlockBytes + 1), nullptr);
  EXPECT_EQ(pool.allocate(4096, size_t{1} << 40), nullptr);
  EXPECT_EQ(pool.stats().allocated_bytes, 0);
}

// A system with a budget: a request it cannot meet while blocks sit in the
// cache is met after the pool gives them back; one it cannot meet at all
// gives nullptr, never a crash.
TEST(CachingAllocator, ReleasesItsCacheAndRetriesWhenTheSystemIsOut) {
  size_t in_use = 0;
  std::map<void*, size_t> sizes;
  const size_t budget = size_t{6} << 20;
  CachingAllocator::System fake;
  fake.allocate = [&](size_t bytes, size_t alignment) -> void* {
    if (in_use + bytes > budget) return nullptr;
    void* p = nullptr;
    if (posix_memalign(&p, alignment, bytes) != 0) return nullptr;
    in_use += bytes;
    sizes[p] = bytes;
    return p;
  };
  fake.release = [&](void* p, size_t) {
    in_use -= sizes.at(p);
    sizes.erase(p);
    std::free(p);
  };
  CachingAllocator pool(int64_t{1} << 30, fake);
  void* a = pool.allocate(size_t{4} << 20);  // 4 MiB, then cached
  ASSERT_NE(a, nullptr);
  pool.deallocate(a);
  EXPECT_EQ(pool.stats().cached_bytes, int64_t{4} << 20);
  void* b = pool.allocate(size_t{5} << 20);  // 4 + 5 > 6: only after the cache goes back
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  EXPECT_EQ(pool.stats().released, 1);
  EXPECT_EQ(pool.allocate(size_t{2} << 20), nullptr);  // 5 + 2 > 6, nothing cached: refused
  pool.deallocate(b);
  pool.empty_cache();
  EXPECT_EQ(in_use, 0u);
}

// Two misses at once under kPeak: each makes room for its own block while
// the other's is not yet counted. The system here holds both threads inside
// it together, so the pool must count each block when it makes room for it.
// 4 MiB cached at a 4 MiB peak, then two 3 MiB misses: counted one at a time
// the cache would keep 1 MiB and end at 7 MiB in use and cached against a
// bound of 6 + 6/16 MiB.
TEST(CachingAllocator, ConcurrentMissesKeepThePeakBound) {
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  bool hold = false;
  CachingAllocator::System fake;
  fake.allocate = [&](size_t bytes, size_t alignment) -> void* {
    std::unique_lock<std::mutex> lock(mu);
    if (hold) {
      ++inside;
      cv.notify_all();
      // A bounded wait: a pool that serialised its misses would fail the
      // check below, never hang.
      cv.wait_for(lock, std::chrono::seconds(5), [&] { return inside >= 2; });
    }
    void* p = nullptr;
    return posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
  };
  fake.release = [](void* p, size_t) { std::free(p); };
  CachingAllocator pool(int64_t{1} << 30, fake);
  std::vector<void*> first;
  for (int i = 0; i < 4; ++i) first.push_back(pool.allocate(size_t{1} << 20));
  for (void* p : first) pool.deallocate(p);
  ASSERT_EQ(pool.stats().cached_bytes, int64_t{4} << 20);
  {
    std::lock_guard<std::mutex> lock(mu);
    hold = true;
  }
  void* got[2] = {nullptr, nullptr};
  std::thread a([&] { got[0] = pool.allocate(size_t{3} << 20); });
  std::thread b([&] { got[1] = pool.allocate(size_t{3} << 20); });
  a.join();
  b.join();
  EXPECT_EQ(inside, 2);  // both misses were in the system at once
  ASSERT_NE(got[0], nullptr);
  ASSERT_NE(got[1], nullptr);
  const auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, int64_t{6} << 20);
  EXPECT_LE(s.allocated_bytes + s.cached_bytes,
            s.peak_allocated_bytes + s.peak_allocated_bytes / CachingAllocator::kPeakSlackDivisor);
  pool.deallocate(got[0]);
  pool.deallocate(got[1]);
}

// Both policies from four threads at once (TSan runs this too). Under kLimit
// most blocks are reused; under kPeak four blocks of seven classes in use at
// once leave little to keep, so only the counts are checked.
TEST(CachingAllocator, ThreadsShareOnePool) {
  for (auto policy :
       {CachingAllocator::CachePolicy::kLimit, CachingAllocator::CachePolicy::kPeak}) {
    CachingAllocator pool;
    pool.set_policy(policy);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool, t] {
        for (int i = 0; i < 200; ++i) {
          const size_t bytes = static_cast<size_t>((i % 7 + 1) * 40000 + t);
          auto* p = static_cast<unsigned char*>(pool.allocate(bytes, 64));
          ASSERT_NE(p, nullptr);
          p[0] = p[bytes - 1] = static_cast<unsigned char>(t);  // the whole span is ours
          pool.deallocate(p);
        }
      });
    }
    for (std::thread& th : threads) th.join();
    const auto s = pool.stats();
    EXPECT_EQ(s.allocated_bytes, 0);
    EXPECT_EQ(s.hits + s.misses, 800);
    if (policy == CachingAllocator::CachePolicy::kLimit) {
      EXPECT_GT(s.hits, 700);  // at most a few blocks per class and thread were ever new
    } else {
      EXPECT_LE(s.cached_bytes, s.peak_allocated_bytes +
                                    s.peak_allocated_bytes / CachingAllocator::kPeakSlackDivisor);
    }
  }
}

TEST(CachingAllocator, ServesExecuteThroughTheAllocatorHook) {
  // ReLU -> BatchNormTrainingBackward with fusion off: an intermediate
  // between two partitions, allocated per execute from the hook.
  Graph g;
  Op relu(10, OpKind::kReLU, "relu");
  relu.add_input(lt(20, DataType::kF32, {8, 16, 32, 32}))
      .add_output(lt(0, DataType::kF32, {8, 16, 32, 32}));
  ASSERT_TRUE(g.add_op(relu).ok());
  ASSERT_TRUE(
      g.add_op(bn_bwd({8, 16, 32, 32}, "NCX", DataType::kF32, DataType::kF32, true, 3)).ok());
  CompileOptions options{"auto"};
  options.optimize = false;
  auto cg = CompiledGraph::compile(g, options);
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  ASSERT_EQ(cg->partitions().size(), 2u);
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 3, nullptr);
  ASSERT_TRUE(inputs.ok());
  std::map<int64_t, const void*> in;
  for (const auto& [id, b] : *inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> outs;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& t : cg->outputs()) {
    auto b = oracle::allocate(t);
    ASSERT_TRUE(b.ok());
    out[t.id] = outs.emplace(t.id, std::move(b).value()).first->second.data();
  }
  CachingAllocator pool;
  ASSERT_TRUE(cg->execute(in, out, nullptr, &pool.allocator()).ok());
  const auto first = pool.stats();
  EXPECT_GE(first.misses, 1);
  EXPECT_EQ(first.allocated_bytes, 0);  // every block came back
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cg->execute(in, out, nullptr, &pool.allocator()).ok());
  const auto steady = pool.stats();
  EXPECT_EQ(steady.misses, first.misses);  // nothing new after the first execute
  EXPECT_GE(steady.hits, first.hits + 3);
}

}  // namespace
}  // namespace normgrad
