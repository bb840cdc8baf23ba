// Every list-valued option of every command checks all its values before any
// work: an invalid value exits 2 with CLI11's kind of message, naming the
// value and the valid ones, and nothing runs first (no bandwidth probe, no
// kernel). An unknown dtype in a graph file lists the valid ones too.
#include <fstream>
#include <string>

#include "tests/cli_test_util.hpp"

namespace normgrad {
namespace {

struct BadOption {
  const char* args;
  const char* named;  // the option and the bad value as the message gives them
  const char* valid;  // part of the list of valid values
};

TEST(CliOptions, EveryListValuedOptionChecksEveryValueFirst) {
  const std::string graph = std::string(NORMGRAD_EXAMPLES) + "/bn_training_backward_bf16_ncx.json";
  const BadOption cases[] = {
      {"bench --backends=onednn --shapes=small", "--backends: 'onednn'", "jit, dnnl"},
      {"bench --backends=jit,onednn", "--backends: 'onednn'", "jit, dnnl"},
      {"bench --dt=fp32", "--dt: 'fp32'", "f32, bf16, f16"},
      {"bench --dt=f32,float16", "--dt: 'float16'", "f32, bf16, f16"},
      {"bench --layouts=NCHW", "--layouts: 'NCHW'", "NCX, NXC"},
      {"bench --fused=gelu", "--fused: 'gelu'", "none, relu, add"},
      {"bench --compile --compile-shapes=chain,tree", "--compile-shapes: 'tree'", "ladder"},
      {"tune --dt=f64 --dry-run", "--dt: 'f64'", "f32, bf16, f16"},
      {"tune --layouts=NHWC --dry-run", "--layouts: 'NHWC'", "NCX, NXC"},
      {"tune --ops=bwdd --dry-run", "--ops: 'bwdd'", "fwd, bwd, from-dst"},
      {"bench --dt=,", "--dt", "expected one or more of"},
  };
  for (const BadOption& c : cases) {
    const auto r = testing_util::run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.named), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.valid), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("roofline"), std::string::npos) << "work ran first: " << r.output;
  }
  for (const char* cmd : {"run ", "partitions "}) {
    const auto r = testing_util::run_cli(std::string(cmd) + graph + " --backend=onednn");
    EXPECT_EQ(r.exit_code, 2) << cmd << r.output;
    EXPECT_NE(r.output.find("onednn"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("dnnl"), std::string::npos) << r.output;
  }
}

TEST(CliOptions, AnUnknownDtypeInAGraphFileListsTheValidOnes) {
  std::ifstream in(std::string(NORMGRAD_EXAMPLES) + "/bn_training_backward_bf16_ncx.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"bf16\"";
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, from.size(), "\"float32\"");
  const std::string path = ::testing::TempDir() + "/ng_bad_dtype.json";
  std::ofstream(path) << text;
  const auto r = testing_util::run_cli("run " + path);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("unknown dtype 'float32' (expected one of f32, bf16, f16"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace normgrad
