// The JIT's thread pool: for_range runs independent work items on oneTBB,
// in its own arena under set_num_threads' cap; on the OpenMP runtime
// (libgomp) when set_thread_runtime chose it; or on std::threads in
// NORMGRAD_STD_THREADS builds. A template, so the walks' task bodies inline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#ifdef NORMGRAD_WITH_OPENMP
#include <omp.h>
#endif
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <normgrad/backends/backend.hpp>

namespace normgrad {
namespace jit {

// Records the parallelism a run had (last_max_concurrency, jit_driver.hpp).
void note_concurrency(int c);
#ifndef NORMGRAD_STD_THREADS
// One arena per thread cap, shared by concurrent executions (an arena is
// thread-safe); replaced when the cap changes.
std::shared_ptr<tbb::task_arena> capped_arena(int cap);
#endif

// How for_range shares [0, n) among the threads.
enum class Split {
  kAdaptive,    // oneTBB's adaptive split (stealing)
  kContiguous,  // one contiguous share per thread, the same thread per share on every call
  // kContiguous, each share walked from its end: a thread first takes what
  // it touched last in a kContiguous loop over the same range.
  kContiguousLastFirst,
};

// Runs body(i) for i in [0, n): serially for small problems, else on oneTBB, or
// on plain std::threads in NORMGRAD_STD_THREADS builds (ThreadSanitizer runs:
// Debian's oneTBB is not instrumented). Work items are independent, so any
// split gives the same bits. kContiguous takes oneTBB's static partitioner,
// whose shares keep their threads from call to call (a deterministic
// affinity pattern).
template <typename Body>
void for_range(bool serial, int64_t n, const Body& body, Split split = Split::kAdaptive) {
  const bool last_first = split == Split::kContiguousLastFirst;
  if (serial || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(last_first ? n - 1 - i : i);
    return;
  }
#ifdef NORMGRAD_STD_THREADS
  // Each std::thread takes a contiguous share whatever `split` asks.
  const int cap = num_threads();
  const int64_t cores = cap > 0 ? cap : std::max(1u, std::thread::hardware_concurrency());
  note_concurrency(static_cast<int>(cores));
  const int64_t workers = std::min<int64_t>(n, cores);
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      const int64_t begin = w * n / workers, end = (w + 1) * n / workers;
      for (int64_t i = begin; i < end; ++i) body(last_first ? end - 1 - (i - begin) : i);
    });
  }
  for (std::thread& t : threads) t.join();
#else
#ifdef NORMGRAD_WITH_OPENMP
  if (thread_runtime() == ThreadRuntime::kOpenMP) {
    // The pool torch's and oneDNN's ops use (their size: omp_get_max_threads,
    // which torch.set_num_threads sets), under set_num_threads' cap.
    const int cap = num_threads();
    const int threads =
        static_cast<int>(std::min<int64_t>(n, cap > 0 ? cap : omp_get_max_threads()));
    note_concurrency(threads);
    if (split == Split::kAdaptive) {
#pragma omp parallel for schedule(guided) num_threads(threads)
      for (int64_t i = 0; i < n; ++i) body(i);
    } else {
#pragma omp parallel num_threads(threads)
      {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t begin = t * n / nt, end = (t + 1) * n / nt;
        for (int64_t i = begin; i < end; ++i) body(last_first ? end - 1 - (i - begin) : i);
      }
    }
    return;
  }
#endif
  auto run = [&] {
    note_concurrency(tbb::this_task_arena::max_concurrency());
    auto each = [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i != r.end(); ++i)
        body(last_first ? r.end() - 1 - (i - r.begin()) : i);
    };
    if (split == Split::kAdaptive) {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), each);
    } else {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), each, tbb::static_partitioner());
    }
  };
  if (const int cap = num_threads(); cap > 0) {
    capped_arena(cap)->execute(run);  // normgrad::set_num_threads: our own arena
  } else {
    run();
  }
#endif
}

}  // namespace jit
}  // namespace normgrad
