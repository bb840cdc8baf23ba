// `normgrad run` end to end: fixtures pass --check, outputs are written, bad
// graphs and options give a message and exit code 2, never a signal.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <normgrad/graph/npy.hpp>
#include "tests/cli_test_util.hpp"
#include "tests/test_util.hpp"
#include "tools/bench_probe.hpp"

namespace normgrad {
namespace {

const std::string kCli = NORMGRAD_CLI;
const std::string kData = NORMGRAD_TEST_DATA;
const std::string kExamples = NORMGRAD_EXAMPLES;

using Result = testing_util::CliResult;

Result run(const std::string& args) {
  return testing_util::run_cli(args);
}

std::string write_temp(const std::string& name, const std::string& text) {
  return testing_util::write_temp_file(name, text);
}

TEST(CliRun, FixturesPassCheck) {
  for (const char* f :
       {"op/f32/bnorm_bwd.json", "pattern/f32/bn_bwd_relu_bwd_fusion.json", "op/f32/bnorm.json",
        "op/f32/bnorm_fwd_d.json", "pattern/f32/bn_relu_fusion.json"}) {
    const Result r = run("run " + kData + "/onednn/" + f + " --check --seed 3");
    EXPECT_EQ(r.exit_code, 0) << f << "\n" << r.output;
    EXPECT_NE(r.output.find("PASSED"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("backend="), std::string::npos) << r.output;
  }
}

// The graphs `normgrad fuzz` found failing, each kept once fixed: every
// backend runs it (or, forced, hands the ops it has no kernel for on) and
// passes --check, with several seeds.
TEST(CliRun, FuzzFoundGraphsPassCheckOnEveryBackend) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/fuzz")) {
    ++files;
    for (const char* backend : {"auto", "jit", "dnnl"}) {
      for (const char* seed : {"1", "2", "3"}) {
        const Result r =
            run("run " + e.path().string() + " --check --backend " + backend + " --seed " + seed);
        // A forced backend may hand ops on (UNIMPLEMENTED, exit 1): never FAILED.
        const bool handed_on = r.exit_code == 1 &&
                               r.output.find("UNIMPLEMENTED") != std::string::npos &&
                               std::string(backend) != "auto";
        EXPECT_TRUE(r.exit_code == 0 || handed_on) << e.path() << " on " << backend << "\n"
                                                   << r.output;
        EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
        EXPECT_FALSE(r.signaled) << e.path() << " on " << backend;
      }
    }
  }
  EXPECT_GE(files, 7);
}

// run takes the text form, as opt, partitions and dot do.
TEST(CliRun, TakesTheTextForm) {
  const std::string path = write_temp(
      "text_form.ngt",
      "%1:f32[2,8,5,5] = ReLUBackward#0 \"rb\"(%0:f32[2,8,5,5], %2:f32[2,8,5,5]) {use_dst=true}\n"
      "%7:f32[2,8,5,5], %8:f32[8], %9:f32[8] = BatchNormTrainingBackward#1 \"bn\"(%3:f32[2,8,5,5], "
      "%1:f32[2,8,5,5], %4:f32[8], %5:f32[8], %6:f32[8]) {data_format=\"NCX\", epsilon=1e-05f}\n");
  const Result r = run("run " + path + " --check");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASSED"), std::string::npos) << r.output;
}

// `normgrad tune` measures, prints its choices, writes the cache compile
// reads, and says so clearly when it cannot.
TEST(CliTune, WritesTheHostsChoicesOrAClearError) {
  const std::string dir = ::testing::TempDir() + "/ng_cli_tune";
  std::filesystem::remove_all(dir);
  const std::string args =
      "tune --shapes=2x64x7x7,2x96x5x5 --dt=f32 --layouts=NCX,NXC --ops=fwd,bwd,from-dst "
      "--iters=2";
  Result r = run("--version");  // the CLI exists
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  r = run(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("choices:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bwd/NXC/f32/c<=64/m<=1024/cached"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fwd/NCX/f32/c<=64/m<=1024/cached"), std::string::npos) << r.output;
  // Where the JIT generates code (a choice line "  avx512 fwd/..."), it
  // groups these rows, and fwd-ungrouped is a forward candidate.
  if (r.output.find("  avx") != std::string::npos) {
    EXPECT_NE(r.output.find("fwd-ungrouped"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/normgrad/tune.json"));
  r = run(args + " --dry-run");
  EXPECT_NE(r.output.find("dry run: nothing written"), std::string::npos) << r.output;
  setenv("XDG_CACHE_HOME", "/dev/null/not-a-folder", 1);
  r = run(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("normgrad tune: error:"), std::string::npos) << r.output;
  r = run("tune --shapes=2x64 --iters=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not NxCxHxW"), std::string::npos) << r.output;
  setenv("XDG_CACHE_HOME", (::testing::TempDir() + "/ng_cli_tune_none").c_str(), 1);
}

// `tune` then `run`: the run compiles the class's written choice. A margin
// below 1 makes tune take its best variant even when slower, so that the
// choice is never the rules' own. Shapes may be bench's named sets.
TEST(CliTune, RunTakesTheChoiceTuneWrote) {
  const std::string dir = ::testing::TempDir() + "/ng_cli_tune_then_run";
  std::filesystem::remove_all(dir);
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  Result r =
      run("tune --shapes=4x256x7x7 --dt=f32 --layouts=NXC --ops=bwd --iters=2 --margin=0.01");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cls = "bwd/NXC/f32/c<=256/m<=1024/cached";
  const size_t at = r.output.find(cls, r.output.find("choices:"));
  ASSERT_NE(at, std::string::npos) << r.output;
  std::string line = r.output.substr(at + cls.size());
  line = line.substr(0, line.find('\n'));
  const std::string variant =
      line.substr(line.find_first_not_of(' '), line.find(" (") - line.find_first_not_of(' '));
  const std::string graph =
      write_temp("tuned_class.ngt",
                 "%5:f32[4,7,7,256], %6:f32[256], %7:f32[256] = BatchNormTrainingBackward#0 \"bn\"("
                 "%0:f32[4,7,7,256], %1:f32[4,7,7,256], %2:f32[256], %3:f32[256], %4:f32[256]) "
                 "{data_format=\"NXC\", epsilon=1e-05f}\n");
  r = run("run " + graph + " --backend jit --iters 1 --check");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (variant == "default") {
    // Where the JIT generates no code, tune has no variant to take.
    EXPECT_NE(r.output.find("kernel=jit:portable"), std::string::npos) << r.output;
  } else {
    EXPECT_NE(r.output.find("+tuned(" + variant + " "), std::string::npos) << variant << "\n"
                                                                           << r.output;
  }
  setenv("NORMGRAD_TUNE", "0", 1);
  r = run("run " + graph + " --backend jit --iters 1");
  EXPECT_EQ(r.output.find("+tuned("), std::string::npos) << r.output;
  unsetenv("NORMGRAD_TUNE");
  // bench's named sets are tune's too; an unknown name says what it takes.
  r = run("tune --shapes=small --dt=f32 --layouts=NCX --ops=bwd --iters=1 --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2x192x71x71 NCX f32 bwd"), std::string::npos) << r.output;
  r = run("tune --shapes=tiny --iters=1 --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'tiny' is neither NxCxHxW nor a named set (small, resnet50, cached)"),
            std::string::npos)
      << r.output;
  setenv("XDG_CACHE_HOME", (::testing::TempDir() + "/ng_cli_tune_none").c_str(), 1);
}

// `normgrad fuzz`: random graphs on every backend against ref. A few hundred
// graphs; CI runs a longer, time-bounded smoke (.ci/run).
TEST(CliFuzz, RandomGraphsMatchRefOnEveryBackend) {
  const Result r = run("fuzz --graphs=300 --seed=1 --verify-each --out=" + ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fuzz: 300 graphs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 0 failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 0 invalid"), std::string::npos) << r.output;  // the generator's own
  // The same seed gives the same graphs (and a failure's seed replays it).
  const Result a = run("fuzz --graphs=1 --seed=77 -v");
  const Result b = run("fuzz --graphs=1 --seed=77 -v");
  EXPECT_EQ(a.output.substr(0, a.output.find("fuzz:")), b.output.substr(0, b.output.find("fuzz:")));
  EXPECT_NE(a.output.find("seed 77:\n%"), std::string::npos) << a.output;
}

// The split ops run on random inputs too: a BatchNormBackwardApply's random
// count is its src's elements per channel, so the op's count rule holds and
// the JIT's diff_src is checked against ref.
TEST(CliRun, SplitApplyRunsOnRandomInputs) {
  std::string ins, sep;
  const char* dims[8] = {"[2, 4, 4, 24]", "[2, 4, 4, 24]", "[24]", "[24]",
                         "[24]",          "[24]",          "[1]",  "[24]"};
  for (int i = 0; i < 8; ++i) {
    ins += sep + "{\"id\": " + std::to_string(i) + ", \"dtype\": \"" + (i == 6 ? "s64" : "f32") +
           "\", \"shape\": " + dims[i] + "}";
    sep = ", ";
  }
  const std::string graph = write_temp(
      "apply.json", R"({"graph": [{"id": 0, "name": "a", "kind": "BatchNormBackwardApply",
    "attrs": {"epsilon": {"type": "f32", "value": 0.001}, "data_format": {"type": "string", "value": "NXC"}},
    "inputs": [)" + ins +
                        R"(], "outputs": [{"id": 8, "dtype": "f32", "shape": [2, 4, 4, 24]}]}]})");
  const Result r = run("run " + graph + " --check --seed 5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("6(local-count)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend=jit"), std::string::npos) << r.output;
}

TEST(CliRun, ExamplesPassAndWriteOutputs) {
  for (const auto& e : std::filesystem::directory_iterator(kExamples)) {
    if (!e.is_regular_file()) continue;  // sync/: run sharded by the MPI tests
    const std::string out_dir = ::testing::TempDir() + "/ng_cli_out_" + e.path().stem().string();
    const Result r =
        run("run " + e.path().string() + " --check --iters 2 --threads 1 --outputs " + out_dir);
    EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.output;
    EXPECT_FALSE(std::filesystem::is_empty(out_dir)) << r.output;
  }
}

TEST(CliRun, InputsFromDirectoryAreUsed) {
  // Feed oneDNN's canonical vector through .npy files and read diff_src back.
  const std::string dir = ::testing::TempDir() + "/ng_cli_inputs";
  std::filesystem::create_directories(dir);
  const float src[4] = {1, 2, 3, 4}, dd[4] = {0.1f, 0.1f, 0.2f, 0.2f}, mean[1] = {2.5f},
              var[1] = {1.25f}, gamma[1] = {2};
  ASSERT_TRUE(write_npy(dir + "/0.npy", LogicalTensor(0, DataType::kF32, {1, 1, 2, 2}), src).ok());
  ASSERT_TRUE(write_npy(dir + "/1.npy", LogicalTensor(1, DataType::kF32, {1, 1, 2, 2}), dd).ok());
  ASSERT_TRUE(write_npy(dir + "/2.npy", LogicalTensor(2, DataType::kF32, {1}), mean).ok());
  ASSERT_TRUE(write_npy(dir + "/3.npy", LogicalTensor(3, DataType::kF32, {1}), var).ok());
  ASSERT_TRUE(write_npy(dir + "/4.npy", LogicalTensor(4, DataType::kF32, {1}), gamma).ok());
  const std::string graph =
      R"({"version": "3.0.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [
    {"id": 0, "name": "bn", "kind": "BatchNormTrainingBackward",
     "attrs": {"epsilon": {"type": "f32", "value": 0.0}, "data_format": {"type": "string", "value": "NCX"}},
     "inputs": [{"id": 0, "dtype": "f32", "shape": [1, 1, 2, 2]}, {"id": 1, "dtype": "f32", "shape": [1, 1, 2, 2]},
                {"id": 2, "dtype": "f32", "shape": [1]}, {"id": 3, "dtype": "f32", "shape": [1]},
                {"id": 4, "dtype": "f32", "shape": [1]}],
     "outputs": [{"id": 5, "dtype": "f32", "shape": [1, 1, 2, 2]}, {"id": 6, "dtype": "f32", "shape": [1]},
                 {"id": 7, "dtype": "f32", "shape": [1]}]}]})";
  const std::string path = write_temp("canonical.json", graph);
  const std::string out = ::testing::TempDir() + "/ng_cli_canonical_out";
  const Result r = run("run " + path + " --inputs " + dir + " --outputs " + out + " --check");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0(file) 1(file) 2(file) 3(file) 4(file)"), std::string::npos)
      << r.output;
  float got[4];
  ASSERT_TRUE(
      read_npy_into(out + "/5.npy", LogicalTensor(5, DataType::kF32, {1, 1, 2, 2}), got).ok());
  EXPECT_NEAR(got[0], 0.01788854, 1e-7);
  EXPECT_NEAR(got[1], -0.05366563, 1e-7);
}

TEST(CliRun, BenchdnnKnobsRewriteTheCase) {
  // NXC via --in-shapes and --op-attrs, bf16 via --dt (statistics stay f32), batch via --mb.
  const std::string c = kData + "/onednn/op/f32/bnorm_bwd.json";
  Result r = run(
      "run --dt=bf16 --in-shapes=0:2x9x9x192+1:2x9x9x192 --op-attrs=0:data_format:NXC --case=" + c);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0:PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("__REPRO: --mode=C --dt=bf16 --in-shapes=0:2x9x9x192+1:2x9x9x192 "
                          "--op-attrs=0:data_format:NXC --case="),
            std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find(
          "tests:1 passed:1 skipped:0 mistrusted:0 unimplemented:0 invalid_arguments:0 failed:0"),
      std::string::npos)
      << r.output;
  // Knobs persist until --reset; a forced backend that declines is UNIMPLEMENTED; a bad attribute
  // is INVALID_ARGUMENTS.
  r = run("run --mb=1 --in-shapes=0:1x192x5x5+1:1x192x5x5 --case=" + c +
          " --dt=f16 --backend=dnnl --case=" + c + " --reset --op-attrs=0:epsilon:-1 --case=" + c +
          " --reset --mode=R --case=" + c);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("0:PASSED"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("1:UNIMPLEMENTED (unimplemented: the graph has unsupported partitions "
                    "(BatchNormTrainingBackward 'BNORM_0': no pattern takes it (dnnl.op: oneDNN "
                    "2.6 has no f16"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("2:INVALID_ARGUMENTS"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'epsilon' must be finite and >= 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3:EXECUTED"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find(
          "tests:4 passed:2 skipped:0 mistrusted:0 unimplemented:1 invalid_arguments:1 failed:0"),
      std::string::npos)
      << r.output;
}

TEST(CliRun, VerboseLinesAreStable) {
  // BatchNormInference in f16 with src and dst in an order no fast kernel
  // walks: only ref runs it.
  const std::string graph = kData + "/bn_inference_f16_strided.json";
  const std::string cmd = "NORMGRAD_VERBOSE=2 " + kCli + " run --case=" + graph + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  EXPECT_NE(out.find("normgrad_verbose,decline,0,jit.bn_inf,the JIT forward takes dense src"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("normgrad_verbose,decline,0,dnnl.op,oneDNN 2.6 has no f16 "
                     "batch normalization on CPU"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("normgrad_verbose,compile,0,ref,ref:BatchNormInference,BatchNormInference,f16:"
                     "2x6x3x4x5 "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("normgrad_verbose,exec,0,ref,ref:BatchNormInference,"), std::string::npos)
      << out;
  // At level 1 already, a fallback to ref says why the fast backends declined.
  const std::string v1 = "NORMGRAD_VERBOSE=1 " + kCli + " run --case=" + graph + " 2>&1";
  FILE* q = popen(v1.c_str(), "r");
  ASSERT_NE(q, nullptr);
  std::string out1;
  while ((n = fread(buf, 1, sizeof buf, q)) > 0) out1.append(buf, n);
  pclose(q);
  EXPECT_NE(out1.find("normgrad_verbose,fallback,0,ref,BatchNormInference,jit.bn_fwd_epilogue: dst "
                      "is not read by one Add, ReLU or LeakyReLU alone; jit.bn_inf: the JIT "
                      "forward takes dense src (ref runs it); dnnl.int8_bn_chain: dst is not read "
                      "by one ReLU alone; dnnl.op: oneDNN 2.6 has no f16 batch normalization on "
                      "CPU"),
            std::string::npos)
      << out1;
}

// Runs the CLI in the background under `env`, and returns its pid and output.
std::pair<std::string, std::string> run_with_pid(const std::string& env, const std::string& args) {
  const std::string out_file = ::testing::TempDir() + "/ng_cli_profile_out.txt";
  const std::string cmd =
      env + " " + kCli + " " + args + " >" + out_file + " 2>&1 & p=$!; wait $p; echo $p";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  char buf[64] = {};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  std::string pid(buf, n);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  std::ifstream in(out_file);
  return {pid, std::string(std::istreambuf_iterator<char>(in), {})};
}

TEST(CliRun, JitProfileNamesKernelsForPerf) {
  const std::string graph = kExamples + "/bn_training_backward_f32_nxc.json";
  const std::string args = "run " + graph + " --backend jit";
  const auto [pid, out] = run_with_pid("NORMGRAD_VERBOSE=1 NORMGRAD_JIT_PROFILE=1", args);
  ASSERT_FALSE(pid.empty()) << out;
  const std::string map = "/tmp/perf-" + pid + ".map";
  std::ifstream in(map);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  std::filesystem::remove(map);
  if (out.find("jit:portable") != std::string::npos)
    GTEST_SKIP() << "no generated code on this CPU (the portable path ran)";
  // One line per generated kernel: start, size (hex), and the kernel's conf key.
  for (const char* kind : {"reduce", "apply"}) {
    const std::string name = std::string(" normgrad_") + kind + "_jit:";
    const size_t at = text.find(name);
    ASSERT_NE(at, std::string::npos) << map << ":\n" << text << "\n" << out;
    const size_t line = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
    unsigned long long start = 0, size = 0;
    ASSERT_EQ(std::sscanf(text.c_str() + line, "%llx %llx", &start, &size), 2) << text;
    EXPECT_NE(start, 0u) << text;
    EXPECT_GT(size, 0u) << text;
  }
  // The forward's kernels too: statistics and apply.
  const auto [fpid, fout] = run_with_pid(
      "NORMGRAD_JIT_PROFILE=1", "run " + kData + "/onednn/op/f32/bnorm_fwd_d.json --backend jit");
  ASSERT_FALSE(fpid.empty()) << fout;
  const std::string fmap = "/tmp/perf-" + fpid + ".map";
  std::ifstream fin(fmap);
  const std::string ftext((std::istreambuf_iterator<char>(fin)), {});
  std::filesystem::remove(fmap);
  for (const char* kind : {" normgrad_fwd_stats_", " normgrad_fwd_apply_"})
    EXPECT_NE(ftext.find(kind), std::string::npos) << fmap << ":\n" << ftext << "\n" << fout;
  // Without the variable nothing is written.
  const auto [pid2, out2] = run_with_pid("", args);
  ASSERT_FALSE(pid2.empty()) << out2;
  EXPECT_FALSE(std::filesystem::exists("/tmp/perf-" + pid2 + ".map")) << out2;
}

// NORMGRAD_JIT_DUMP=1 writes each generated kernel's code to the working
// directory, one file per kernel the perf map names, of the size it gives.
TEST(CliRun, JitDumpWritesEachKernelsCode) {
  const std::string dir = ::testing::TempDir() + "/ng_jit_dump";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string args = "run " + kExamples + "/bn_training_backward_f32_nxc.json --backend jit";
  const auto [pid, out] =
      run_with_pid("env -C " + dir + " NORMGRAD_JIT_DUMP=1 NORMGRAD_JIT_PROFILE=1", args);
  ASSERT_FALSE(pid.empty()) << out;
  const std::string map = "/tmp/perf-" + pid + ".map";
  std::ifstream in(map);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::filesystem::remove(map);
  if (out.find("jit:portable") != std::string::npos)
    GTEST_SKIP() << "no generated code on this CPU (the portable path ran)";
  ASSERT_EQ(lines.size(), 2u) << out;  // reduce and apply
  for (const std::string& line : lines) {
    unsigned long long start = 0, size = 0;
    char name[1024] = {};
    ASSERT_EQ(std::sscanf(line.c_str(), "%llx %llx %1023s", &start, &size, name), 3) << line;
    std::string file = std::string(name) + ".bin";
    std::replace(file.begin(), file.end(), '/', '_');
    ASSERT_TRUE(std::filesystem::exists(dir + "/" + file)) << file << "\n" << out;
    EXPECT_EQ(std::filesystem::file_size(dir + "/" + file), size) << file;
    std::filesystem::remove(dir + "/" + file);
  }
  // Without the variable nothing is written.
  const auto [pid2, out2] = run_with_pid("env -C " + dir, args);
  ASSERT_FALSE(pid2.empty()) << out2;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << out2;
  std::filesystem::remove_all(dir);
}

// A functional smoke of `normgrad bench` (no timing is asserted): it runs, and its
// JSON follows the documented schema and its SVG is a chart.
// --compile times each phase on each generated shape, and its JSON has the
// partitions the partitioner made (one per block: the chain's pairs fuse).
TEST(CliBench, CompileTimesEveryPhaseOnGeneratedGraphs) {
  const std::string json = ::testing::TempDir() + "/ng_compile.json";
  const Result r = run("bench --compile --compile-ops=200 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* shape : {"chain", "ladder", "fan-out", "folds", "resnet"})
    EXPECT_NE(r.output.find(std::string(shape) + " "), std::string::npos) << r.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j.size(), 5u);
  // 12 ResNet blocks of 16 ops, 10 partitions each: 6 convolutions handed
  // back, 2 forward and 2 backward batch-norm partitions (each with its
  // epilogue or ReLUBackward; the residual ReLUBackward's output, which the
  // gradient Add reads too, is a side output, and the next block's gradient
  // Add in front of it joins it), and one gradient Add left at the graph's end.
  EXPECT_EQ(j[4]["shape"], "resnet");
  EXPECT_EQ(j[4]["ops"], 192);
  EXPECT_EQ(j[4]["partitions"], 12 * 10 + 1);
  // fold-transpose leaves one batch norm of every four ops, chained block to block.
  EXPECT_EQ(j[3]["shape"], "folds");
  EXPECT_EQ(j[3]["ops"], 200);
  EXPECT_EQ(j[3]["partitions"], 50);
  EXPECT_EQ(j[0]["shape"], "chain");
  EXPECT_EQ(j[0]["ops"], 200);
  EXPECT_EQ(j[0]["partitions"], 100);  // ReLUBackward + BatchNormTrainingBackward each
  for (const char* phase : {"text", "json", "finalize", "passes", "partition", "compile"})
    EXPECT_GE(j[0]["ms"][phase].get<double>(), 0.0) << phase;
  EXPECT_EQ(run("bench --compile --compile-ops=1").exit_code, 2);
  EXPECT_EQ(run("bench --compile --compile-shapes=star --compile-ops=10").exit_code, 2);
}

TEST(CliBench, WritesTheDocumentedJsonAndSvg) {
  const std::string json = ::testing::TempDir() + "/ng_bench.json",
                    svg = ::testing::TempDir() + "/ng_bench.svg";
  const Result r =
      run("bench --shapes=small --dt=f32,f16 --layouts=NXC --fused=none,relu --iters 1 --warmup 0 "
          "--threads 1 "
          "--json " +
          json + " --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // f16, which oneDNN declines, gets no ratio against it (not "x0.00").
  EXPECT_EQ(r.output.find("x0.00 vs dnnl"), std::string::npos) << r.output;
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* key :
       {"\"threads\": 1", "\"roofline_gbps\"", "\"cases\"", "\"shape\": [", "\"layout\": \"NXC\"",
        "\"dtype\": \"f16\"", "\"fused\": \"relu\"", "\"backend\": \"jit\"", "\"median_ms\"",
        "\"min_ms\"", "\"max_ms\"", "\"gbps\"", "\"roofline_pct\"", "\"compile_ms\"",
        "\"backend\": \"unfused\"", "\"unsupported\": \"the graph has unsupported partitions"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key;
  }
  // Every case carries the probes on its two sides, and its shares divide by the higher.
  const auto doc = nlohmann::json::parse(text);
  double highest = 0.0;
  for (const auto& c : doc.at("cases")) {
    if (c.at("dtype") == "f16") {  // oneDNN declined: no ratio against it
      for (const auto& b : c.at("results")) EXPECT_FALSE(b.contains("ratio_vs_dnnl")) << b;
    }
    const double before = c.at("roofline_before_gbps"), after = c.at("roofline_after_gbps");
    ASSERT_GT(before, 0.0) << c.at("name");
    ASSERT_GT(after, 0.0) << c.at("name");
    highest = std::max({highest, before, after});
    for (const auto& b : c.at("results")) {
      if (b.contains("unsupported")) continue;
      const double gbps = b.at("gbps"), pct = b.at("roofline_pct");
      EXPECT_NEAR(pct, 100.0 * gbps / std::max(before, after), 1e-9 * (1.0 + pct))
          << c.at("name") << " " << b.at("backend");
    }
  }
  EXPECT_GE(doc.at("roofline_gbps").get<double>(), highest);
  EXPECT_GT(doc.at("read_only_start_gbps").get<double>(), 0.0);
  EXPECT_GT(doc.at("read_only_end_gbps").get<double>(), 0.0);
  for (const char* k : {"reads", "writes", "mixed"})
    EXPECT_GT(doc.at("one_core_gbps").at(k).get<double>(), 0.0) << k;
  std::ifstream sin(svg);
  const std::string chart((std::istreambuf_iterator<char>(sin)), std::istreambuf_iterator<char>());
  EXPECT_EQ(chart.rfind("<svg", 0), 0u);
  EXPECT_NE(chart.find("roofline"), std::string::npos);
  EXPECT_NE(chart.find("1x32x28x28 NXC f32"), std::string::npos);
}

// --cold writes every tensor of the timed call back and out of the caches;
// the data must survive, from any start and length, and every column runs,
// the blocked kernel with its reorders timed among them.
TEST(CliBench, ColdRunsEvictTheirOwnTensors) {
  std::vector<unsigned char> bytes(10000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  const std::vector<unsigned char> want = bytes;
  cli::evict_lines(bytes.data() + 3, 9000);
  cli::evict_lines(bytes.data() + 9003, 997);
  EXPECT_EQ(bytes, want);
  const std::string json = ::testing::TempDir() + "/ng_bench_cold.json";
  const Result r = run(
      "bench --shapes=small --dt=f32 --layouts=NCX,NXC --backends=jit,dnnl --iters 2 --warmup 0 "
      "--threads 1 --cold --json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  const auto doc = nlohmann::json::parse(in);
  int timed = 0, reorders = 0;
  for (const auto& c : doc.at("cases")) {
    for (const auto& b : c.at("results")) {
      if (b.contains("unsupported")) continue;
      EXPECT_GT(b.at("median_ms").get<double>(), 0.0) << c.at("name") << " " << b.at("backend");
      ++timed;
      if (b.at("backend") == "dnnl-reorder") {
        // The blocked kernel with the reorders from and to the case's layout.
        const std::string layout = c.at("layout");
        EXPECT_NE(b.at("kernel").get<std::string>().find(layout + " -> nChw16c -> " + layout),
                  std::string::npos)
            << b.at("kernel");
        ++reorders;
      }
    }
  }
  EXPECT_GE(timed, 8);  // jit, dnnl, dnnl-blocked and dnnl-reorder on both layouts
  EXPECT_GE(reorders, 2);
}

TEST(CliRun, BadInputsGiveAMessageAndExitTwo) {
  const std::string bad_json =
      write_temp("bad.json", "{\"graph\": [ {\"id\": 0, \"kind\": \"BatchNormTrainingBackward\"");
  const std::string cve = write_temp(
      "cve.json", R"({"graph": [{"id": 0, "name": "bn", "kind": "BatchNormTrainingBackward",
    "attrs": {"epsilon": {"type": "f32", "value": 0.001}, "data_format": {"type": "string", "value": "NCX"}},
    "inputs": [{"id": 0, "dtype": "f32", "shape": [1, 1, 1, 2]}, {"id": 1, "dtype": "f32", "shape": [1, 1, 3, 3]},
               {"id": 2, "dtype": "f32", "shape": [1]}, {"id": 3, "dtype": "f32", "shape": [1]}],
    "outputs": [{"id": 5, "dtype": "f32", "shape": [1, 1, 1, 2]}]}]})");
  const std::string stray_dir = ::testing::TempDir() + "/ng_cli_stray";
  std::filesystem::create_directories(stray_dir);
  const float one = 1.f;
  ASSERT_TRUE(write_npy(stray_dir + "/9.npy", LogicalTensor(9, DataType::kF32, {1}), &one).ok());
  const struct {
    std::string args, fragment;
  } cases[] = {
      {"run " + bad_json, "malformed JSON"},
      {"run " + cve, "input 1 'diff_dst': shape 1x1x3x3 differs from src's 1x1x1x2"},
      {"run /nonexistent.json", "cannot open file"},
      {"run " + kExamples + "/bn_training_backward_f32_nxc.json --backend cuda",
       "--backend: cuda not in {auto,jit,dnnl"},
      {"run " + kExamples + "/bn_training_backward_f32_nxc.json --iters 0",
       "--iters: Value 0 not in range"},
      {"run " + kExamples + "/bn_training_backward_f32_nxc.json --frobnicate", "--frobnicate"},
      {"run --in-shapes=0:2xx3 --case=" + kExamples + "/bn_training_backward_f32_nxc.json",
       "--in-shapes: bad shape '2xx3'"},
      {"run --mode=Q", "--mode must be C, P, CP, R or L"},
      {"run " + kExamples + "/bn_training_backward_f32_nxc.json --inputs " + stray_dir,
       "9.npy: names no input of the graph"},
      {"run --batch=/nonexistent_batch.txt", "--batch: cannot open"},
      {"fly", "unknown command 'fly'"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_FALSE(r.signaled) << c.args;
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << c.args << "\n" << r.output;
  }
  // What a backend cannot run is UNIMPLEMENTED (exit 1), not a usage error.
  const struct {
    std::string args, fragment;
  } unimplemented[] = {
      {"run " + kData + "/bn_inference_f16_strided.json --backend jit",
       "jit.bn_inf: the JIT forward takes dense src"},
      {"run " + kExamples + "/bn_training_backward_f16_nxc_no_gamma.json --backend dnnl",
       "oneDNN 2.6 has no f16 batch normalization"},
  };
  for (const auto& c : unimplemented) {
    const Result r = run(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("UNIMPLEMENTED: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace normgrad
