// The per-host tune cache: shape classes, what compile takes from the cache
// (and checked against ref), and every way the file can be unusable.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <normgrad/backends/tune_cache.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/text_io.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include "tests/backend_test_util.hpp"
#include "tests/backends/jit/jit_test_util.hpp"
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

std::string jit_kernel(const Graph& g, const std::string& variant = "") {
  CompileOptions options{"jit"};
  options.jit_variant = variant;
  auto cg = CompiledGraph::compile(g, options);
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

// The kernel name up to the tune cache's "+tuned(...)" note: what the conf
// says the code walks.
std::string walk_of(const std::string& kernel) {
  return kernel.substr(0, kernel.find("+tuned("));
}

// A backward variant that changes the walk of `g` (its kernel is named
// differently from the rules' choice), or "" when none does here.
std::string walk_changing_variant(const Graph& g, const std::string& untuned) {
  for (const char* v : {"nxc-per-pixel", "nxc-blocked", "nxc-swept", "nxc-strips"}) {
    if (jit_kernel(g, v) != untuned) return v;
  }
  return "";
}

// "avx512" of "jit:avx512:f32/f32:...".
std::string isa_of(const std::string& kernel) {
  return kernel.substr(4, kernel.find(':', 4) - 4);
}

// A cache written for `g`'s class with a variant that changes its walk, or,
// unless `walk_must_change`, with nxc-per-pixel where none does (the
// portable path): the kernel's name still says "+tuned(...)" when taken.
struct WrittenChoice {
  std::string untuned, variant, isa;
  nlohmann::json file;  // the cache as written
};

// Writes it; false (and nothing written) when the walk must change and cannot.
bool write_choice(const Graph& g, bool walk_must_change, WrittenChoice* w) {
  w->untuned = jit_kernel(g);
  w->variant = walk_changing_variant(g, w->untuned);
  if (w->variant.empty() && walk_must_change) return false;
  if (w->variant.empty()) w->variant = "nxc-per-pixel";
  w->isa = isa_of(w->untuned);
  EXPECT_TRUE(write_tuned_choices(w->isa, {{class_of(g), {w->variant, 1.25}}}).ok());
  std::ifstream(tune_cache_path()) >> w->file;
  return true;
}

TEST_F(TuneCacheTest, CompileTakesTheHostsChoiceAndItMatchesRef) {
  const Graph g = nxc_backward(256);
  EXPECT_EQ(jit_kernel(g).find("tuned"), std::string::npos);  // no file: the rules
  WrittenChoice w;
  if (!write_choice(g, true, &w)) GTEST_SKIP() << "no variant changes the walk here";
  const std::string& untuned = w.untuned;
  const std::string& variant = w.variant;
  // The tuned kernel is the variant's own: the same walk, not the rules'
  // walk with a new label, and the same bits as the variant asked for by name.
  const auto inputs = jit_test::inputs_for(g, 31);
  std::string tuned, named;
  const auto tuned_out = jit_test::run_jit(g, "", inputs, &tuned);
  const auto named_out = jit_test::run_jit(g, variant, inputs, &named);
  EXPECT_NE(tuned.find("+tuned(" + variant + " 1.25x)"), std::string::npos) << tuned;
  EXPECT_EQ(walk_of(tuned), named);
  EXPECT_NE(walk_of(tuned), untuned);
  ASSERT_EQ(tuned_out.size(), named_out.size());
  for (const auto& [id, buf] : tuned_out)
    EXPECT_TRUE(buf.bytes == named_out.at(id).bytes) << "tensor " << id;
  const auto r = testing_util::compare_with_ref(g, "jit", 3);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  // Other classes keep the rules; NORMGRAD_TUNE=0 turns the cache off.
  EXPECT_EQ(jit_kernel(nxc_backward(2048)).find("tuned"), std::string::npos);
  setenv("NORMGRAD_TUNE", "0", 1);
  reload_tune_cache();
  EXPECT_EQ(jit_kernel(g), untuned);
}

// A cache that differs from this host in any one field of its key (CPU,
// caches, threads, normgrad's version), or whose entry is another ISA's,
// is ignored; the same file unchanged is taken (the control).
TEST_F(TuneCacheTest, ACacheDifferingInAnyKeyFieldIsIgnored) {
  const Graph g = nxc_backward(256);
  WrittenChoice w;
  ASSERT_TRUE(write_choice(g, false, &w));
  const std::string& untuned = w.untuned;
  const std::string& isa = w.isa;
  const nlohmann::json& written = w.file;
  const std::string path = tune_cache_path();
  const auto take = [&](const nlohmann::json& j) {
    std::ofstream(path) << j.dump();
    reload_tune_cache();
    return jit_kernel(g);
  };
  EXPECT_NE(take(written).find("+tuned("), std::string::npos) << "the control";
  const std::vector<std::string> fields = {"cpu", "l2_kib", "l3_kib", "threads", "normgrad"};
  ASSERT_EQ(written.at("host").size(), fields.size()) << written.dump();
  for (const std::string& field : fields) {
    nlohmann::json j = written;
    nlohmann::json& v = j.at("host").at(field);
    if (v.is_string()) {
      v = v.get<std::string>() + " (another)";
    } else {
      v = v.get<int64_t>() + 1;
    }
    EXPECT_EQ(take(j), untuned) << field;
    j.at("host").erase(field);
    EXPECT_EQ(take(j), untuned) << field << " missing";
  }
  nlohmann::json other_isa = written;
  other_isa["isa"] = {{isa == "avx2" ? "avx512" : "avx2", written.at("isa").at(isa)}};
  EXPECT_EQ(take(other_isa), untuned) << "another ISA's entry";
  // The same file, read by a process that caps its threads differently.
  const int threads = num_threads();
  set_num_threads((threads > 0 ? threads : 2) + 1);
  EXPECT_EQ(take(written), untuned) << "another thread count";
  set_num_threads(threads);
  EXPECT_NE(take(written).find("+tuned("), std::string::npos) << "the control, again";
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
  const std::string isa = isa_of(untuned);
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
  WrittenChoice w;
  ASSERT_TRUE(write_choice(g, false, &w));
  const std::string& untuned = w.untuned;
  const std::string& isa = w.isa;
  const nlohmann::json& written = w.file;
  const std::string path = tune_cache_path();
  std::vector<std::string> texts = {
      "{bad json", "[]",
      "{\"host\": \"" + tune_host_key() + "\", \"isa\": " + written.at("isa").dump() + "}"};
  for (const nlohmann::json& entry :
       {nlohmann::json{{"variant", 7}}, nlohmann::json{{"variant", "no-such-variant"}},
        nlohmann::json{{"speedup", 1.25}}, nlohmann::json("nxc-per-pixel")}) {
    nlohmann::json j = written;
    j["isa"][isa][class_of(g)] = entry;
    texts.push_back(j.dump());
  }
  for (const std::string& text : texts) {
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
