// benchdnn's graph-driver grammar (tools/cli_driver.hpp, tools/cli_knobs.hpp):
// knob rewrites on a graph, comma lists, --reset, paths, statuses, summary.
#include <filesystem>

#include <normgrad/graph/json_io.hpp>
#include "tests/cli_test_util.hpp"
#include "tests/test_util.hpp"
#include "tools/cli_knobs.hpp"

namespace normgrad {
namespace {

using testing_util::run_cli;

const std::string kBnBwd = std::string(NORMGRAD_TEST_DATA) + "/onednn/op/f32/bnorm_bwd.json";
const std::string kSmall = "--in-shapes=0:2x8x5x5+1:2x8x5x5+2:8+3:8+4:8";

Graph loaded(const std::string& path) {
  auto g = load_graph(path);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return *g;
}

StatusOr<Graph> rewritten(const std::vector<std::pair<std::string, std::string>>& knobs) {
  cli::Knobs k;
  for (const auto& [key, value] : knobs) NG_RETURN_IF_ERROR(cli::parse_case_knob(key, value, &k));
  Graph g = loaded(kBnBwd);
  NG_RETURN_IF_ERROR(cli::apply_knobs(k, &g));
  NG_RETURN_IF_ERROR(g.finalize());
  return g;
}

TEST(CliKnobs, InShapesTakeStridesTagsAndRankZero) {
  // driver_graph.md's example: [1,32,4,2] with tag abdc has strides [256,8,1,4].
  auto g = rewritten({{"in-shapes", "0:1x32x4x2*abdc+1:1x32x4x2+2:32+3:32+4:32"}});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->find_tensor(0)->strides, (Dims{256, 8, 1, 4}));
  EXPECT_EQ(g->find_tensor(5)->dims, (Dims{1, 32, 4, 2}));  // re-inferred
  g = rewritten({{"in-shapes", "0:1x32x4x2*256x8x1x4+1:1x32x4x2+2:32+3:32+4:32"}});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->find_tensor(0)->strides, (Dims{256, 8, 1, 4}));
  // Strides only: the file's shape, relaid (NHWC of 2x192x71x71).
  g = rewritten({{"in-shapes", "0:*acdb"}});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->find_tensor(0)->strides, (Dims{967872, 1, 13632, 192}));
  cli::Knobs k;
  ASSERT_TRUE(cli::parse_case_knob("in-shapes", "3:-", &k).ok());
  EXPECT_TRUE(k.in_shapes.at(3).rank0);
  EXPECT_STATUS_HAS(cli::parse_case_knob("in-shapes", "0:2x3*ab1", &k), "bad tag 'ab1'");
  EXPECT_STATUS_HAS(cli::parse_case_knob("in-shapes", "0:2x3*3x", &k), "bad shape");
  EXPECT_STATUS_HAS(rewritten({{"in-shapes", "0:2x3*abc"}}), "tag 'abc' has 3 letters for rank 2");
  EXPECT_STATUS_HAS(rewritten({{"in-shapes", "9:2x3"}}), "tensor 9 is not a graph input");
}

TEST(CliKnobs, MbWinsOverInShapes) {
  auto g = rewritten({{"in-shapes", "0:2x8x5x5+1:2x8x5x5+2:8+3:8+4:8"}, {"mb", "3"}});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->find_tensor(0)->dims, (Dims{3, 8, 5, 5}));
  EXPECT_EQ(g->find_tensor(2)->dims, (Dims{8}));  // statistics keep theirs
  g = rewritten({{"mb", "0"}});                   // 0 keeps the file's batch
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->find_tensor(0)->dims[0], 2);
}

TEST(CliKnobs, DtOpAttrsAndOpKind) {
  auto g = rewritten({{"dt", "0:bf16+1:bf16+5:bf16"}});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->find_tensor(0)->dtype, DataType::kBF16);
  EXPECT_EQ(g->find_tensor(2)->dtype, DataType::kF32);
  g = rewritten({{"dt", "bf16"}});  // data tensors only; statistics stay f32
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->find_tensor(5)->dtype, DataType::kBF16);
  EXPECT_EQ(g->find_tensor(6)->dtype, DataType::kF32);
  ASSERT_TRUE(rewritten({{"dt", "undef"}}).ok());
  EXPECT_STATUS_HAS(rewritten({{"dt", "s8"}}), "expected undef, f32, bf16 or f16");
  g = rewritten({{"op-attrs", "0:epsilon:0.5*data_format:NCX"}});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g->ops().at(0).attr_f32("epsilon"), 0.5f);
  EXPECT_STATUS_HAS(rewritten({{"op-attrs", "0:momentum:0.5"}}), "has no attribute 'momentum'");
  EXPECT_STATUS_HAS(rewritten({{"op-attrs", "7:epsilon:0.5"}}), "the graph has no op 7");
  // A kind we carry opaquely replaces the op; the graph then has nothing we run.
  g = rewritten({{"op-kind", "0:Wildcard"}});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->ops().at(0).kind(), OpKind::kWildcard);
  EXPECT_STATUS_HAS(rewritten({{"op-kind", "0:Frobnicate"}}), "unknown op kind 'Frobnicate'");
}

TEST(CliKnobs, OpKindUndefRemovesAUnaryOrBinaryOp) {
  // ReLUBackward(a, b) -> t -> ReLU -> y: removing the ReLU passes t to y's readers.
  Graph g;
  Op rb(1, OpKind::kReLUBackward, "rb");
  rb.add_input(testing_util::lt(0, DataType::kF32, {2, 3}))
      .add_input(testing_util::lt(1, DataType::kF32, {2, 3}))
      .add_output(testing_util::lt(2, DataType::kF32, {2, 3}));
  Op relu(2, OpKind::kReLU, "relu");
  relu.add_input(testing_util::lt(2, DataType::kF32, {2, 3}))
      .add_output(testing_util::lt(3, DataType::kF32, {2, 3}));
  Op end(3, OpKind::kEnd, "end");
  end.add_input(testing_util::lt(3, DataType::kF32, {2, 3}));
  for (const Op& op : {rb, relu, end}) ASSERT_TRUE(g.add_op(op).ok());
  cli::Knobs k;
  ASSERT_TRUE(cli::parse_case_knob("op-kind", "2:undef", &k).ok());
  ASSERT_TRUE(cli::apply_knobs(k, &g).ok());
  ASSERT_TRUE(g.finalize().ok());
  ASSERT_EQ(g.ops().size(), 2u);
  EXPECT_EQ(g.ops().at(1).inputs()[0].id, 2);
  cli::Knobs both;
  ASSERT_TRUE(cli::parse_case_knob("op-kind", "1:undef", &both).ok());
  EXPECT_STATUS_HAS(cli::apply_knobs(both, &g), "cannot tell which input passes through");
}

TEST(CliDriver, CommaListsExpandInBenchdnnOrderAndResetKeepsGlobals) {
  const auto r = run_cli("run --mode=L --dt=f32,bf16 --mb=1,2 " + kSmall + " --case=" + kBnBwd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string first = "run: --mode=L --dt=f32 --mb=1 ";
  const size_t a = r.output.find(first);
  const size_t b = r.output.find("run: --mode=L --dt=bf16 --mb=1 ");
  const size_t c = r.output.find("run: --mode=L --dt=f32 --mb=2 ");
  ASSERT_NE(a, std::string::npos) << r.output;
  ASSERT_NE(b, std::string::npos) << r.output;
  ASSERT_NE(c, std::string::npos) << r.output;
  EXPECT_LT(a, b);  // mb is the outer loop, dt the inner
  EXPECT_LT(b, c);
  EXPECT_NE(r.output.find("tests:0 passed:0 skipped:0 mistrusted:0 unimplemented:0 "
                          "invalid_arguments:0 failed:0 listed:4"),
            std::string::npos)
      << r.output;
  // --mode survives --reset; the case knobs do not.
  const auto p = run_cli("run --mode=c --dt=bf16 --reset " + kSmall + " --case=" + kBnBwd);
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("0:PASSED"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("__REPRO: --mode=C --in-shapes="), std::string::npos) << p.output;
  EXPECT_EQ(p.output.find("--dt=bf16 --in"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("\ntotal: "), std::string::npos) << p.output;
}

TEST(CliDriver, StatusesPartitionsEngineAndRepro) {
  auto r = run_cli("run --mode=C --expected-n-partitions=2 " + kSmall + " --case=" + kBnBwd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("0:FAILED (expected 2 partitions, got 1 (BatchNormTrainingBackward))"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("= Failed cases summary (--summary=no-failures to disable) ="),
            std::string::npos);
  r = run_cli("run --engine=gpu " + kSmall + " --case=" + kBnBwd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0:SKIPPED (engine 'gpu' is not available"), std::string::npos);
  // The seed goes into __REPRO, and the line replays the case.
  r = run_cli("run --seed=7 " + kSmall + " --case=" + kBnBwd);
  const size_t at = r.output.find("__REPRO: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string repro = r.output.substr(at + 9, r.output.find('\n', at) - at - 9);
  EXPECT_NE(repro.find("--seed=7"), std::string::npos) << repro;
  const auto again = run_cli("run " + repro);
  EXPECT_NE(again.output.find("0:PASSED"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("__REPRO: " + repro), std::string::npos) << again.output;
  // A bad value in a list is a usage error at its line.
  r = run_cli("run --mb=1,x --case=" + kBnBwd);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--mb must be a non-negative integer, got 'x'"), std::string::npos);
}

TEST(CliDriver, CasePathsResolveFromTheInputsRoot) {
  // root/op/harness names --case=op/f32/bn.json, as oneDNN's batch files do.
  const std::filesystem::path root = ::testing::TempDir() + "/ng_inputs_root";
  std::filesystem::create_directories(root / "op" / "f32");
  std::filesystem::copy_file(kBnBwd, root / "op" / "f32" / "bn.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(root / "op" / "harness")
      << "# a comment\n--reset " << kSmall << " --case=op/f32/bn.json\n";
  const auto r = run_cli("run --batch=" + (root / "op" / "harness").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tests:1 passed:1 skipped:0 mistrusted:0 unimplemented:0 "
                          "invalid_arguments:0 failed:0 listed:0"),
            std::string::npos)
      << r.output;
}

TEST(CliDriver, ABackslashContinuesAWordOnTheNextLine) {
  // oneDNN's batch files break long lists shell-style: `--mb=1,\` then an
  // indented `2` is the list 1,2.
  const std::filesystem::path root = ::testing::TempDir() + "/ng_continued";
  std::filesystem::create_directories(root);
  std::filesystem::copy_file(kBnBwd, root / "bn.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(root / "harness") << "--reset " << kSmall << " --mb=1,\\\n    2 \\\n"
                                  << "    --case=bn.json\n";
  const auto r = run_cli("run --batch=" + (root / "harness").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tests:2 passed:2 skipped:0 mistrusted:0 unimplemented:0 "
                          "invalid_arguments:0 failed:0"),
            std::string::npos)
      << r.output;
}

TEST(CliDriver, ABadLineInABatchIsThatCaseOnly) {
  // A knob that does not parse makes its case INVALID_ARGUMENTS; the batch
  // goes on to the next line and to its summary, as benchdnn's does. An ID
  // with a tag left on it (benchdnn's inputs carry "2*abc:...") reads as the ID.
  const std::filesystem::path root = ::testing::TempDir() + "/ng_bad_line";
  std::filesystem::create_directories(root);
  std::filesystem::copy_file(kBnBwd, root / "bn.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(root / "harness")
      << "--reset --mb=x --case=bn.json\n"
      << "--reset " << kSmall << " --case=bn.json\n"
      << "--reset --in-shapes=0:2x8x5x5+1*abcd:2x8x5x5+2:8+3:8+4:8 --case=bn.json\n"
      << "--reset --no-such-knob=1 --case=bn.json\n"
      << "--reset " << kSmall << " --case=bn.json\n";
  const auto r = run_cli("run --batch=" + (root / "harness").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;  // an INVALID_ARGUMENTS case, as benchdnn exits
  EXPECT_NE(r.output.find("0:INVALID_ARGUMENTS (invalid_argument: --mb must be a non-negative "
                          "integer, got 'x')"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1:PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2:PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3:INVALID_ARGUMENTS (unknown option --no-such-knob=1)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("4:PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tests:5 passed:3 skipped:0 mistrusted:0 unimplemented:0 "
                          "invalid_arguments:2 failed:0 listed:0"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace normgrad
