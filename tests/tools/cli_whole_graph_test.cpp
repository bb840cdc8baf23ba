// `normgrad run` on a whole network's training graph (scripts/resnet_graph.py,
// two residual blocks with their convolutions): the ops normgrad cannot run
// are refused with the way round them, and --cut-unsupported runs and checks
// the rest, partition by partition, on every backend.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli_test_util.hpp"

namespace normgrad {
namespace {

const std::string kGraph =
    std::string(NORMGRAD_EXAMPLES) + "/../partitioning/resnet_training_2_blocks.json";

TEST(CliWholeGraph, UnsupportedOpsAreRefusedWithTheWayRound) {
  const auto r = testing_util::run_cli("run " + kGraph + " --check");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no kernel for"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--cut-unsupported"), std::string::npos) << r.output;
}

TEST(CliWholeGraph, CutUnsupportedRunsAndChecksTheRest) {
  for (const char* backend : {"auto", "ref"}) {
    const auto r = testing_util::run_cli("run " + kGraph + " --check --cut-unsupported --seed 7 " +
                                         "--iters 2 --backend " + backend);
    EXPECT_EQ(r.exit_code, 0) << backend << "\n" << r.output;
    EXPECT_NE(r.output.find("Convolution x4, ConvolutionBackwardData x4, "
                            "ConvolutionBackwardWeights x4"),
              std::string::npos)
        << r.output;
    if (std::string(backend) == "auto") {  // the fused patterns, as in the graph's partitions
      EXPECT_NE(r.output.find("BatchNormForwardTraining+Add+ReLU"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("ReLUBackward+BatchNormTrainingBackward"), std::string::npos)
          << r.output;
    }
    EXPECT_NE(r.output.find("\nPASSED"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("FAIL "), std::string::npos) << r.output;
  }
}

// `bench --compile GRAPH.json` times a network's graph phase by phase.
TEST(CliWholeGraph, BenchCompileTimesAGraphFile) {
  const std::string json = ::testing::TempDir() + "/ng_compile_file.json";
  const auto r = testing_util::run_cli("bench --compile " + kGraph + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resnet_training_2_blocks.json"), std::string::npos) << r.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["ops"], 32);
  EXPECT_EQ(j[0]["partitions"], 21);  // 9 batch-norm and elementwise, 12 convolutions
  EXPECT_TRUE(j[0]["ms"]["text"].is_null());
  EXPECT_GE(j[0]["ms"]["json"].get<double>(), 0.0);
}

}  // namespace
}  // namespace normgrad
