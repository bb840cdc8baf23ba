// JSON I/O: the oneDNN fixtures load, finalize and round-trip; writer quirks are
// accepted; malformed input is rejected with its JSON location.
#include <normgrad/graph/json_io.hpp>

#include <filesystem>

#include "tests/test_util.hpp"

namespace normgrad {
namespace {

const std::string kData = NORMGRAD_TEST_DATA;

std::vector<std::string> fixture_files() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(kData + "/onednn")) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool same_graph(const Graph& a, const Graph& b) {
  if (a.ops().size() != b.ops().size() || a.fpmath_mode != b.fpmath_mode) return false;
  for (size_t k = 0; k < a.ops().size(); ++k) {
    const Op& x = a.ops().at(k);
    const Op& y = b.ops().at(k);
    if (x.id() != y.id() || x.kind() != y.kind() || x.name() != y.name() || x.attrs() != y.attrs())
      return false;
    if (x.inputs().size() != y.inputs().size() || x.outputs().size() != y.outputs().size())
      return false;
    for (size_t i = 0; i < x.inputs().size(); ++i) {
      if (!same_metadata(x.inputs()[i], y.inputs()[i])) return false;
    }
    for (size_t i = 0; i < x.outputs().size(); ++i) {
      if (!same_metadata(x.outputs()[i], y.outputs()[i])) return false;
    }
  }
  return true;
}

TEST(JsonIo, FixturesLoadFinalizeAndRoundTrip) {
  const auto files = fixture_files();
  ASSERT_EQ(files.size(), 5u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    auto g = load_graph(f);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(g->finalize().ok());
    const std::string saved = ::testing::TempDir() + "/ng_roundtrip.json";
    ASSERT_TRUE(save_graph(*g, saved).ok());
    auto again = load_graph(saved);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    ASSERT_TRUE(again->finalize().ok());
    EXPECT_TRUE(same_graph(*g, *again));
    EXPECT_EQ(graph_to_json(*g), graph_to_json(*again));
  }
}

const char* kQuirky = R"({
  "version": "3.1.0", "engine_kind": "cpu", "fpmath_mode": "strict",
  "fpmath_mode_apply_to_int": "false",
  "input_ports": [0, 1], "output_ports": [2],
  "graph": [{
    "kind": "ReLUBackward", "name": "rb", "id": 7,
    "attrs": {"use_dst": {"value": 0, "type": "bool"}},
    "inputs": [
      {"id": 0, "dtype": "f32", "shape": [2, 3], "stride": [3, 1], "layout_type": "strided", "property_type": "undef"},
      {"id": 1, "dtype": "f32", "shape": [2, 3], "stride": [3, 1], "layout_type": "strided", "property_type": "undef"}],
    "outputs": [
      {"id": 2, "dtype": "f32", "shape": [-9223372036854775808, -9223372036854775808],
       "stride": [-9223372036854775808, -9223372036854775808], "layout_type": "any", "property_type": "undef"}]
  }]
})";

TEST(JsonIo, AcceptsWriterQuirks) {
  auto g = graph_from_json(kQuirky);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*g->ops().at(0).attr_bool("use_dst"), false);
  EXPECT_EQ(g->fpmath_mode_apply_to_int.value_or(""), "false");
  ASSERT_TRUE(g->finalize().ok());
  EXPECT_EQ(g->find_tensor(2)->dims, (Dims{2, 3}));  // inferred from INT64_MIN
  // The writer gives 0/1 bools back, as oneDNN does.
  EXPECT_NE(graph_to_json(*g).find("\"value\": 0"), std::string::npos);
}

// The other forms oneDNN's dumps and benchdnn's inputs carry: an
// unknown-rank output, a one-element INT64_MIN stride of any rank, -1 dims,
// rank-0 tensors, opaque layouts, a gpu engine, older "Backprop" spellings and
// op kinds with no schema of ours, which load as opaque ops.
const char* kDumpForms = R"({
  "version": "3.5.0", "engine_kind": "gpu", "fpmath_mode": "bf16",
  "fpmath_mode_apply_to_int": "true",
  "graph": [{
    "kind": "DynamicDequantize", "name": "dq", "id": 1,
    "attrs": {"qtype": {"type": "string", "value": "per_tensor"},
              "scales": {"type": "f32[]", "value": [0.5]}, "zps": {"type": "s64[]", "value": [0]},
              "axis": {"type": "s64", "value": 1}},
    "inputs": [{"id": 0, "dtype": "u8", "shape": [2, 3, 4, 4], "stride": [-9223372036854775808],
                "layout_type": "undef", "property_type": "undef"}],
    "outputs": [{"id": 1, "dtype": "f32", "shape": [-9223372036854775808],
                 "stride": [-9223372036854775808], "layout_type": "undef", "property_type": "undef"}]
  }, {
    "kind": "BiasAddBackprop", "name": "bb", "id": 2, "attrs": {},
    "inputs": [{"id": 5, "dtype": "f32", "shape": [2, -1], "stride": [-9223372036854775808],
                "layout_type": "any", "property_type": "undef"}],
    "outputs": [{"id": 6, "dtype": "f32", "shape": [], "stride": [],
                 "layout_type": "opaque", "property_type": "constant"}]
  }]
})";

TEST(JsonIo, LoadsEveryDumpForm) {
  auto g = graph_from_json(kDumpForms);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->engine_kind, "gpu");
  ASSERT_TRUE(g->finalize().ok());
  const LogicalTensor* deq_out = g->find_tensor(1);
  EXPECT_TRUE(deq_out->rank_unknown);
  EXPECT_TRUE(g->find_tensor(0)->strides.empty());  // "not known": dense when addressed
  EXPECT_EQ(g->find_tensor(5)->dims, (Dims{2, kUnknownDim}));
  const LogicalTensor* scalar = g->find_tensor(6);
  EXPECT_FALSE(scalar->rank_unknown);
  EXPECT_TRUE(scalar->dims.empty());
  EXPECT_EQ(*scalar->element_count(), 1);
  EXPECT_EQ(scalar->layout, LayoutType::kOpaque);
  // Written back as read: spellings, unknown rank and unknown strides.
  const std::string out = graph_to_json(*g);
  EXPECT_NE(out.find("\"BiasAddBackprop\""), std::string::npos);
  EXPECT_NE(out.find("\"layout_type\": \"opaque\""), std::string::npos);
  EXPECT_NE(out.find("\"engine_kind\": \"gpu\""), std::string::npos);
  auto again = graph_from_json(out);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_TRUE(again->finalize().ok());
  EXPECT_TRUE(again->find_tensor(1)->rank_unknown);
  EXPECT_EQ(graph_to_json(*again), out);
}

std::string with(const std::string& from, const std::string& to) {
  std::string s = kQuirky;
  const size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

TEST(JsonIo, MalformedInputNamesTheLocation) {
  EXPECT_STATUS_HAS(graph_from_json("{"), "malformed JSON");
  EXPECT_STATUS_HAS(graph_from_json("[1]"), "<root>: expected an object");
  EXPECT_STATUS_HAS(
      graph_from_json(with("\"shape\": [2, 3], \"stride\": [3, 1], \"layout_type\": \"strided\", "
                           "\"property_type\": \"undef\"},\n      {\"id\": 1",
                           "\"shape\": [2, \"x\"], \"stride\": [3, 1], \"layout_type\": "
                           "\"strided\", \"property_type\": \"undef\"},\n      {\"id\": 1")),
      "graph[0].inputs[0].shape[1]: expected an integer, got string");
  EXPECT_STATUS_HAS(
      graph_from_json(
          with("\"dtype\": \"f32\", \"shape\": [2, 3], \"stride\": [3, 1], \"layout_type\": "
               "\"strided\", \"property_type\": \"undef\"},\n      {\"id\": 1, \"dtype\": \"f32\"",
               "\"dtype\": \"f32\", \"shape\": [2, 3], \"stride\": [3, 1], \"layout_type\": "
               "\"strided\", \"property_type\": \"undef\"},\n      {\"id\": 1, \"dtype\": \"s8\"")),
      "graph[0]: ReLUBackward 'rb': input 1 'diff_dst': dtype s8 is not supported (expected f32, "
      "bf16, f16)");
  EXPECT_STATUS_HAS(graph_from_json(with("\"ReLUBackward\"", "\"Frobnicate\"")),
                    "graph[0].kind: unknown op kind 'Frobnicate'");
  EXPECT_STATUS_HAS(
      graph_from_json(with("\"value\": 0, \"type\": \"bool\"", "\"value\": 2, \"type\": \"bool\"")),
      "graph[0].attrs.use_dst.value: expected a bool");
  EXPECT_STATUS_HAS(
      graph_from_json(with("\"value\": 0, \"type\": \"bool\"", "\"value\": 0, \"type\": \"int\"")),
      "graph[0].attrs.use_dst.type: unknown attribute type 'int'");
  EXPECT_STATUS_HAS(graph_from_json(with("\"use_dst\"", "\"use_src\"")),
                    "graph[0]: ReLUBackward 'rb': unknown attribute 'use_src'");
  EXPECT_STATUS_HAS(graph_from_json(with("\"name\": \"rb\"", "\"nmae\": \"rb\"")),
                    "graph[0]: unknown key 'nmae'");
  EXPECT_STATUS_HAS(graph_from_json(with("\"stride\": [3, 1], \"layout_type\": \"strided\", "
                                         "\"property_type\": \"undef\"},\n      {\"id\": 1",
                                         "\"stride\": [3], \"layout_type\": \"strided\", "
                                         "\"property_type\": \"undef\"},\n      {\"id\": 1")),
                    "graph[0].inputs[0].stride: 1 strides for rank 2");
  EXPECT_STATUS_HAS(
      graph_from_json(with("\"shape\": [2, 3], \"stride\": [3, 1], \"layout_type\": \"strided\", "
                           "\"property_type\": \"undef\"},\n      {\"id\": 1",
                           "\"shape\": [2, -3], \"stride\": [3, 1], \"layout_type\": \"strided\", "
                           "\"property_type\": \"undef\"},\n      {\"id\": 1")),
      "graph[0].inputs[0].shape: dims must be >= 0");
  EXPECT_STATUS_HAS(graph_from_json(with("\"engine_kind\": \"cpu\"", "\"engine_kind\": \"tpu\"")),
                    "engine_kind: unknown engine 'tpu' (expected cpu or gpu)");
}

TEST(JsonIo, HostileSizesAreRejected) {
  std::string deep(100000, '[');
  EXPECT_STATUS_HAS(graph_from_json(deep), "JSON nesting deeper than the limit of 32");
  JsonLimits small;
  small.max_bytes = 16;
  EXPECT_STATUS_HAS(graph_from_json(kQuirky, small), "the limit is 16");
  // 2^31 x 2^31 x 2^31 x 4 elements: an error, never a wrapped size.
  EXPECT_STATUS_HAS(
      graph_from_json(
          with("\"shape\": [2, 3], \"stride\": [3, 1], \"layout_type\": \"strided\", "
               "\"property_type\": \"undef\"},\n      {\"id\": 1",
               "\"shape\": [2147483648, 2147483648, 2147483648, 4], \"stride\": [], "
               "\"layout_type\": \"strided\", \"property_type\": \"undef\"},\n      {\"id\": 1")),
      "size overflows int64");
  EXPECT_STATUS_HAS(load_graph(kData + "/does_not_exist.json"), "cannot open file");
  // Ops are converted as the parser meets them: the op limit stops the parse
  // at the first op past it, and what is not an op object is named.
  JsonLimits one_op;
  one_op.max_ops = 0;
  EXPECT_STATUS_HAS(graph_from_json(kQuirky, one_op), "graph: more than 0 ops exceed the limit");
  EXPECT_STATUS_HAS(graph_from_json("{\"graph\": [1]}"),
                    "graph: expected an array of op objects, got an element of type number");
  EXPECT_STATUS_HAS(graph_from_json("{\"graph\": {}}"), "graph: expected an array, got object");
}

// A graph of many ops loads op by op; its ops, ports and order survive.
TEST(JsonIo, ManyOpsLoadOneByOne) {
  Graph g;
  for (int64_t i = 0; i < 20000; ++i) {
    Op op(i, OpKind::kReLU, "relu");
    op.add_input(LogicalTensor(i, DataType::kF32, {2, 3}))
        .add_output(LogicalTensor(i + 1, DataType::kF32, {2, 3}));
    ASSERT_TRUE(g.add_op(std::move(op)).ok());
  }
  ASSERT_TRUE(g.finalize().ok());
  const std::string text = graph_to_json(g);
  auto back = graph_from_json(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_TRUE(back->finalize().ok());
  ASSERT_EQ(back->ops().size(), 20000u);
  EXPECT_EQ(back->ops().back().id(), 19999);
  EXPECT_EQ(graph_to_json(*back), text);
}

}  // namespace
}  // namespace normgrad
