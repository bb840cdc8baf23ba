// The text form: every example and fixture graph survives JSON -> text ->
// graph -> JSON unchanged, and bad text is refused with its line and column.
#include <cstdlib>
#include <filesystem>

#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/text_io.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace testing_util {
namespace {

TEST(TextIo, EveryGraphRoundTripsThroughText) {
  int n = 0;
  // oneDNN's own graphs too, with their quirks (unknown dims, opaque layouts,
  // ...), when NORMGRAD_ONEDNN_INPUTS points at them.
  const char* upstream = std::getenv("NORMGRAD_ONEDNN_INPUTS");
  for (const std::string& dir : {std::string(NORMGRAD_EXAMPLES), std::string(NORMGRAD_TEST_DATA),
                                 std::string(upstream ? upstream : "")}) {
    if (dir.empty() || !std::filesystem::is_directory(dir)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      auto g = load_graph(e.path().string());
      if (!g.ok()) continue;  // fixtures that are invalid on purpose
      const std::string text = graph_to_text(*g);
      auto back = graph_from_text(text);
      ASSERT_TRUE(back.ok()) << e.path() << ": " << back.status().to_string() << "\n" << text;
      EXPECT_EQ(graph_to_json(*back), graph_to_json(*g)) << e.path();
      EXPECT_EQ(graph_to_text(*back), text) << e.path();
      ++n;
    }
  }
  EXPECT_GE(n, 15);
}

TEST(TextIo, BadTextNamesLineAndColumn) {
  EXPECT_STATUS_HAS(graph_from_text("\n%1:f32[2] = ReLU#0 (%0:f32[2]"), "line 2:");
  EXPECT_STATUS_HAS(graph_from_text("%1:f32[2] = NoSuchOp#0(%0:f32[2])"),
                    "unknown op kind 'NoSuchOp'");
  EXPECT_STATUS_HAS(graph_from_text("%1:q7[2] = ReLU#0(%0:f32[2])"), "unknown dtype 'q7'");
  EXPECT_STATUS_HAS(graph_from_text("%1:f32[2] = ReLU#0(%0:f32[2]) {alpha=0.5}"),
                    "a float needs the f suffix");
  EXPECT_STATUS_HAS(graph_from_text("%1:f32[2] = ReLU#0(%0:f32[2]) trailing"),
                    "unexpected text after the op");
  // Schema errors keep their message, with the line in front.
  EXPECT_STATUS_HAS(graph_from_text("\n\n%1:f32[2] = ReLU#0(%0:f16[2])"), "line 3: ReLU");
  EXPECT_STATUS_HAS(graph_from_text("// only a comment\n"), "no ops");
}

TEST(TextIo, SplitCasesKeepTheirLineNumbers) {
  const auto cases = split_text_cases("a\n// -----\nb\nc\n// -----\nd\n");
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[0], (std::pair<int, std::string>{1, "a\n"}));
  EXPECT_EQ(cases[1], (std::pair<int, std::string>{3, "b\nc\n"}));
  EXPECT_EQ(cases[2], (std::pair<int, std::string>{6, "d\n"}));
}

}  // namespace
}  // namespace testing_util
}  // namespace normgrad
