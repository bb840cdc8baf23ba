// The per-host tune cache: shape classes, what compile takes from the cache
// (and checked against ref), and every way the file can be unusable.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <normgrad/backends/tune_cache.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/text_io.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

// Points the cache at a fresh folder for one test, and back after it.
class TuneCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* old = std::getenv("XDG_CACHE_HOME")) old_ = old;
    dir_ = ::testing::TempDir() + "/ng_tune_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
    unsetenv("NORMGRAD_TUNE");
    reload_tune_cache();
  }
  void TearDown() override {
    if (old_.empty()) {
      unsetenv("XDG_CACHE_HOME");
    } else {
      setenv("XDG_CACHE_HOME", old_.c_str(), 1);
    }
    unsetenv("NORMGRAD_TUNE");
    reload_tune_cache();
  }
  std::string dir_, old_;
};

Graph nxc_backward(int64_t c) {
  const std::string t = "f32[4,7,7," + std::to_string(c) + "]",
                    v = "f32[" + std::to_string(c) + "]";
  auto g =
      graph_from_text("%5:" + t + ", %6:" + v + ", %7:" + v +
                      " = BatchNormTrainingBackward#0 \"bn\"(%0:" + t + ", %1:" + t + ", %2:" + v +
                      ", %3:" + v + ", %4:" + v + ") {data_format=\"NXC\", epsilon=1e-05f}\n");
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(g->finalize().ok());
  return *g;
}

std::string jit_kernel(const Graph& g) {
  auto cg = CompiledGraph::compile(g, CompileOptions{"jit"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  return cg.ok() ? cg->partitions().front()->kernel_name() : "";
}

std::string class_of(const Graph& g) {
  auto d = describe_batch_norm(g.ops().front());
  EXPECT_TRUE(d.ok());
  return tune_class(*d);
}

TEST_F(TuneCacheTest, ShapeClassesBucketTheProblem) {
  EXPECT_EQ(class_of(nxc_backward(256)), "bwd/NXC/f32/c<=256/m<=1024/cached");
  EXPECT_EQ(class_of(nxc_backward(2048)), "bwd/NXC/f32/c>1024/m<=1024/cached");
}

TEST_F(TuneCacheTest, CompileTakesTheHostsChoiceAndItMatchesRef) {
  const Graph g = nxc_backward(256);
  const std::string untuned = jit_kernel(g);
  EXPECT_EQ(untuned.find("tuned"), std::string::npos) << untuned;       // no file: the rules
  const std::string isa = untuned.substr(4, untuned.find(':', 4) - 4);  // "jit:ISA:..."
  ASSERT_TRUE(write_tuned_choices(isa, {{class_of(g), {"nxc-per-pixel", 1.25}}}).ok());
  const std::string tuned = jit_kernel(g);
  EXPECT_NE(tuned.find("+tuned(nxc-per-pixel 1.25x)"), std::string::npos) << tuned;
  const auto r = testing_util::compare_with_ref(g, "jit", 3);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  // Other classes keep the rules; NORMGRAD_TUNE=0 turns the cache off.
  EXPECT_EQ(jit_kernel(nxc_backward(2048)).find("tuned"), std::string::npos);
  setenv("NORMGRAD_TUNE", "0", 1);
  reload_tune_cache();
  EXPECT_EQ(jit_kernel(g), untuned);
}

// The forward takes its class's choice too (the synchronized forward's
// parts and an explicit variant keep the rules and the variant).
TEST_F(TuneCacheTest, TheForwardTakesTheHostsChoice) {
  auto g = graph_from_text(
      "%5:f32[4,16,7,7], %6:f32[16], %7:f32[16], %8:f32[16], %9:f32[16] = "
      "BatchNormForwardTraining#0 \"bn\"(%0:f32[4,16,7,7], %1:f32[16], %2:f32[16], %3:f32[16], "
      "%4:f32[16]) {data_format=\"NCX\", epsilon=1e-05f, momentum=0.1f}\n");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(g->finalize().ok());
  EXPECT_EQ(class_of(*g), "fwd/NCX/f32/c<=64/m<=1024/cached");
  const std::string untuned = jit_kernel(*g);
  if (untuned.find(":fwd:rows_grouped") == std::string::npos)
    GTEST_SKIP() << "the JIT groups no rows here (" << untuned << ")";
  const std::string isa = untuned.substr(4, untuned.find(':', 4) - 4);
  ASSERT_TRUE(write_tuned_choices(isa, {{class_of(*g), {"fwd-ungrouped", 1.25}}}).ok());
  const std::string tuned = jit_kernel(*g);
  EXPECT_NE(tuned.find(":fwd:rows+tuned(fwd-ungrouped 1.25x)"), std::string::npos) << tuned;
  const auto r = testing_util::compare_with_ref(*g, "jit", 4);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  // An explicit variant is taken as given.
  CompileOptions control{"jit"};
  control.jit_variant = "default";
  auto cg = CompiledGraph::compile(*g, control);
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  EXPECT_EQ(cg->partitions().front()->kernel_name(), untuned);
}

TEST_F(TuneCacheTest, AnUnusableFileIsIgnored) {
  const Graph g = nxc_backward(256);
  const std::string untuned = jit_kernel(g);
  const std::string isa = untuned.substr(4, untuned.find(':', 4) - 4);
  ASSERT_TRUE(write_tuned_choices(isa, {{class_of(g), {"nxc-per-pixel", 1.25}}}).ok());
  const std::string path = tune_cache_path();
  for (const std::string& text :
       {std::string("{bad json"), std::string("[]"),
        std::string("{\"host\": \"another host\", \"isa\": {\"") + isa + "\": {\"" + class_of(g) +
            "\": {\"variant\": \"nxc-per-pixel\"}}}}",
        std::string("{\"host\": \"") + tune_host_key() + "\", \"isa\": {\"" + isa + "\": {\"" +
            class_of(g) + "\": {\"variant\": 7}}}}",
        std::string("{\"host\": \"") + tune_host_key() + "\", \"isa\": {\"" + isa + "\": {\"" +
            class_of(g) + "\": {\"variant\": \"no-such-variant\"}}}}"}) {
    std::ofstream(path) << text;
    reload_tune_cache();
    EXPECT_EQ(jit_kernel(g), untuned) << text;
  }
}

TEST_F(TuneCacheTest, AnUnwritableCacheIsAClearError) {
  setenv("XDG_CACHE_HOME", "/dev/null/not-a-folder", 1);
  const Status s =
      write_tuned_choices("avx2", {{"bwd/NXC/f32/c<=64/m<=1024/cached", {"default", 1}}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/dev/null/not-a-folder/normgrad/tune.json"), std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace normgrad
