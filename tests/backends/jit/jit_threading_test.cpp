// The JIT on either thread runtime (set_thread_runtime): oneTBB and the
// OpenMP pool torch shares give the same bits for every thread count, on the
// backward and the forward, NCX and NXC, f32 and bf16; the OpenMP pool takes
// set_num_threads' cap; a build without libgomp refuses OpenMP clearly.
#include <map>
#include <string>
#include <vector>

#include <normgrad/backends/jit/jit_driver.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"
#include "tools/bench_graphs.hpp"

namespace normgrad {
namespace {

using jit_test::run_with_threads;
using testing_util::bn_bwd;
using testing_util::one_op;

// The runtime set for a scope, and put back after.
struct RuntimeScope {
  explicit RuntimeScope(ThreadRuntime r) : old_(thread_runtime()) {
    EXPECT_TRUE(set_thread_runtime(r).ok());
  }
  ~RuntimeScope() {
    EXPECT_TRUE(set_thread_runtime(old_).ok());
    set_num_threads(0);
  }
  RuntimeScope(const RuntimeScope&) = delete;
  RuntimeScope& operator=(const RuntimeScope&) = delete;

 private:
  ThreadRuntime old_;
};

std::vector<std::pair<std::string, Graph>> graphs() {
  std::vector<std::pair<std::string, Graph>> v;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    const std::string d = dtype_name(dt);
    // Long rows, grouped short rows, and the pixels walk.
    v.emplace_back("bwd NCX 30x30 " + d,
                   one_op(bn_bwd({6, 40, 30, 30}, "NCX", dt, DataType::kF32, true, 3)));
    v.emplace_back("bwd NCX 7x7 " + d,
                   one_op(bn_bwd({64, 40, 7, 7}, "NCX", dt, DataType::kF32, true, 3)));
    v.emplace_back("bwd NXC " + d,
                   one_op(bn_bwd({6, 20, 20, 72}, "NXC", dt, DataType::kF32, true, 3)));
    v.emplace_back("fwd NCX " + d, cli::make_forward_graph({6, 40, 20, 20}, "NCX", dt, "none"));
    v.emplace_back("fwd NXC " + d, cli::make_forward_graph({6, 72, 20, 20}, "NXC", dt, "relu"));
  }
  return v;
}

TEST(JitThreading, OpenMpGivesTheBitsOfOneTbbThread) {
  if (jit::detect_isa() == jit::Isa::kPortable) GTEST_SKIP() << "no generated code on this host";
  if (!has_openmp_runtime()) GTEST_SKIP() << "this build has no OpenMP (libgomp)";
  for (const auto& [what, g] : graphs()) {
    SCOPED_TRACE(what);
    std::map<int64_t, std::vector<char>> want;
    {
      RuntimeScope scope(ThreadRuntime::kTbb);
      want = run_with_threads(g, 1, true);
    }
    ASSERT_FALSE(want.empty());
    RuntimeScope scope(ThreadRuntime::kOpenMP);
    for (int threads : {1, 2, 3, 4}) {
      SCOPED_TRACE(std::to_string(threads) + " threads");
      const auto got = run_with_threads(g, threads, true);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [id, b] : want) EXPECT_TRUE(got.at(id) == b) << "tensor " << id;
      // The cap reaches the pool: a multi-threaded run had `threads` threads.
      if (threads > 1) {
        EXPECT_EQ(jit::last_max_concurrency(), threads);
      }
    }
  }
}

TEST(JitThreading, RuntimeChoice) {
  const ThreadRuntime old = thread_runtime();
  EXPECT_TRUE(set_thread_runtime(ThreadRuntime::kTbb).ok());
  EXPECT_EQ(thread_runtime(), ThreadRuntime::kTbb);
  const Status s = set_thread_runtime(ThreadRuntime::kOpenMP);
  if (has_openmp_runtime()) {
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(thread_runtime(), ThreadRuntime::kOpenMP);
  } else {
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("no OpenMP"), std::string::npos) << s.message();
    EXPECT_EQ(thread_runtime(), ThreadRuntime::kTbb);
  }
  EXPECT_TRUE(set_thread_runtime(old).ok());
}

}  // namespace
}  // namespace normgrad
