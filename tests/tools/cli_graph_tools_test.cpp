// `normgrad opt`, `partitions` and `dot` end to end: what each prints and
// writes under its flags, and what the partitioner hands back.
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <normgrad/graph/version.hpp>
#include "tests/cli_test_util.hpp"
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

const std::string kData = NORMGRAD_TEST_DATA;

using testing_util::run_cli;

TEST(CliGraphTools, PartitionsHandBackWhatWeDoNotRun) {
  // A ResNet block's training backward: our fused BN-bwd + ReLU-bwd partition
  // between convolution partitions that the framework runs itself.
  const std::string g =
      std::string(NORMGRAD_EXAMPLES) + "/../partitioning/resnet_block_training_backward.json";
  testing_util::CliResult r = run_cli("partitions " + g);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("partition 0: ConvolutionBackwardData  unsupported  (normgrad has no "
                          "kernel for ConvolutionBackwardData"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("partition 1: ReLUBackward+BatchNormTrainingBackward  supported  "
                          "backend=jit"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("partition 2: ConvolutionBackwardWeights  unsupported"),
            std::string::npos);
  EXPECT_NE(r.output.find("4 partitions: 1 supported, 3 unsupported"), std::string::npos);
  r = run_cli("partitions --explain " + g);
  // Per op, each pattern tried there and its answer; the convolutions none.
  EXPECT_NE(r.output.find("    BatchNormTrainingBackward 'bn1_bwd': jit.bn_bwd_producers: matched"),
            std::string::npos)
      << r.output;
  // Running it whole is UNIMPLEMENTED (exit 1), naming the ops, never INVALID_ARGUMENTS.
  r = run_cli("run " + g);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("UNIMPLEMENTED: unsupported partitions: normgrad has no kernel for "
                          "ConvolutionBackwardData 'conv2_bwd_data', ConvolutionBackwardWeights"),
            std::string::npos)
      << r.output;
  r = run_cli("run --mode=C --case=" + g);
  EXPECT_NE(r.output.find("0:UNIMPLEMENTED"), std::string::npos) << r.output;
}

// opt is quiet on stderr unless --verbose; --print-after-all --text prints
// the text form after every pass; --version names the version.
TEST(CliGraphTools, OptOutputFollowsItsFlagsAndVersionPrints) {
  const std::string fused = kData + "/cli/fuse_elementwise.json";
  testing_util::CliResult r = run_cli("opt " + fused + " --text -o /dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  r = run_cli("opt " + fused + " --text --verbose -o /dev/null");
  EXPECT_NE(r.output.find("// pass canonicalize: "), std::string::npos) << r.output;
  r = run_cli("opt " + fused + " --text --print-after-all -o /dev/null");
  EXPECT_NE(r.output.find("// after canonicalize\n%"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\"graph\""), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("{\n"), std::string::npos) << r.output;  // no JSON
  r = run_cli("opt " + fused + " --verify-each -o /dev/null");     // every pass checked in full
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_cli("partitions " + fused + " --verify-each");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Under mpirun every rank runs opt: rank 0 alone prints (and writes -o).
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  const std::string out_path = ::testing::TempDir() + "/ng_opt_rank1.txt";
  std::remove(out_path.c_str());
  r = run_cli("opt " + fused + " --text --verbose -o " + out_path);
  const testing_util::CliResult bad = run_cli("opt " + kData + "/cli/no_such_graph.json");
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  const testing_util::CliResult first = run_cli("opt " + fused + " --text");
  unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  EXPECT_FALSE(std::ifstream(out_path).good()) << "rank 1 wrote " << out_path;
  EXPECT_NE(bad.exit_code, 0);  // the same exit code as rank 0's, silently
  EXPECT_EQ(bad.output, "");
  EXPECT_EQ(first.exit_code, 0);
  EXPECT_NE(first.output.find("BatchNorm"), std::string::npos) << first.output;
  r = run_cli("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("normgrad ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find(normgrad::version_string()), std::string::npos) << r.output;
}

TEST(CliGraphTools, OptPartitionsAndDot) {
  const std::string fused = kData + "/cli/fuse_elementwise.json";
  testing_util::CliResult r =
      run_cli("opt " + kData + "/cli/fold_transpose.json --passes=fold-transpose");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"value\": \"NCX\""), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("StaticTranspose"), std::string::npos) << r.output;
  r = run_cli("opt " + fused + " --print-after-all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("// after canonicalize"), std::string::npos);
  EXPECT_NE(r.output.find("// after split-sync-batch-norm"), std::string::npos);
  r = run_cli("opt " + fused + " --passes=nonsense");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown pass 'nonsense'"), std::string::npos) << r.output;
  r = run_cli("partitions " + fused);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("partition 0: ReLUBackward+BatchNormTrainingBackward  supported  backend=jit  "
                    "pattern=jit.bn_bwd_producers"),
      std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("partition 1"), std::string::npos) << r.output;
  r = run_cli("partitions " + fused + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"ops\": ["), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"kernel\": \"jit:"), std::string::npos) << r.output;
  r = run_cli("dot " + fused + " --after-passes");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("subgraph cluster_p0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("op1 -> op12 [label=\"1: f32 2x5x5x8\"]"), std::string::npos) << r.output;
  r = run_cli("dot " + fused);  // the patterns match without the passes too
  EXPECT_NE(r.output.find("subgraph cluster_p0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("subgraph cluster_p1"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace normgrad
